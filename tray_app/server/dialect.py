"""A client API the router speaks besides (or as) OpenAI's: which paths are its own, how its errors look.

Each dialect's folder declares its `Dialect` in a module that imports nothing heavy (its `paths.py`), so the
outermost layer can refuse a request in the caller's own error shape before any route runs; its routes are
mounted by the app factory (server.routes), one line per dialect. See docs/architecture.md, "Add a dialect".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Dialect:
    name: str
    owns: Callable[[str], bool]  # whether a request path is this API's
    error_body: Callable[[int, str, bytes], bytes]  # (status, message, OpenAI's body) -> this API's body


def openai_error_body(status: int, message: str, openai_body: bytes) -> bytes:
    return openai_body


def plain_error_body(status: int, message: str, openai_body: bytes) -> bytes:
    """`{"error": "message"}`: the shape of Ollama's errors."""
    return json.dumps({"error": message}).encode()


OPENAI = Dialect("openai", lambda path: True, openai_error_body)


def dialect_for(path: str, dialects: tuple[Dialect, ...]) -> Dialect:
    """The dialect whose path this is; OpenAI's for every other path."""
    return next((dialect for dialect in dialects if dialect.owns(path)), OPENAI)
