"""A chat request in the pieces its prompt's tokens are counted by (pure Python: the service caches the
counts of these pieces, the helper counts the ones it has not seen)."""

from __future__ import annotations

import json
from typing import Any

EXTRA_FIELDS = ("tools", "functions", "tool_choice")  # prompt text beside the messages


def message_text(message: dict[str, Any]) -> str:
    """A message's text as the template renders it (text parts joined; a tool call's JSON)."""
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    if content is None and message.get("tool_calls"):
        return json.dumps(message["tool_calls"])
    return content or ""


def chat_extras(body: dict[str, Any]) -> dict[str, Any]:
    """The request's fields besides its messages that its prompt holds, in a fixed order."""
    return {name: body[name] for name in EXTRA_FIELDS if body.get(name) is not None}
