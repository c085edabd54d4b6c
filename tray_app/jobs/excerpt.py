"""What the journal keeps of a request that ended before any worker saw it (refused: too long a prompt, a
full queue, no worker; or cancelled while it waited): no attempt will send it again, so not its whole body,
which may be megabytes (`server.max_body`), but its start and its size, with the small fields its job is
read back by."""

from __future__ import annotations

import json
from typing import Any

EXCERPT = "failsoft_excerpt"  # the field of a stored body that holds its excerpt
EXCERPT_BYTES = 4096  # of the body as JSON, and at most this for each field kept whole


def body_excerpt(body: dict[str, Any], keep: tuple[str, ...] = ("model",)) -> dict[str, Any]:
    """`body` as the journal keeps it: the fields named in `keep` where they are small, and the start of the
    whole body as JSON (EXCERPT_BYTES characters, ASCII: JSON escapes the rest) with its whole size."""
    encoded = json.dumps(body)
    present = (name for name in keep if name in body)
    kept = {name: body[name] for name in present if len(json.dumps(body[name])) <= EXCERPT_BYTES}
    return {**kept, EXCERPT: {"bytes": len(encoded), "start": encoded[:EXCERPT_BYTES]}}
