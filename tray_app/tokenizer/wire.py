"""How the service and its tokenizer helper talk: length-prefixed JSON frames over a stream socket.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON. A request is
`{"id": n, "model": [path, chat_format], "op": name, "args": {...}}`; its answer `{"id": n, "ok": value}` or
`{"id": n, "error": message, "kind": "model" | "input" | "internal"}`. Answers may come out of order (a long
prompt is counted on a thread of the helper while short ones go on).
"""

from __future__ import annotations

import json
import struct
from typing import Any, BinaryIO

HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024  # far above any request body the router accepts (server.max_body)


class TokenizerFailed(Exception):
    """The helper could not answer: `kind` is "crashed" (it died on this request twice), "timeout",
    "model" (the model's tokenizer cannot be read) or "input" (it refused what it was sent)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class WireError(Exception):
    """The other side sent something that is not a frame (or the stream ended inside one)."""


def encode(message: dict[str, Any]) -> bytes:
    data = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    return HEADER.pack(len(data)) + data


def decode(data: bytes) -> dict[str, Any]:
    message = json.loads(data.decode("utf-8", "surrogatepass"))
    if not isinstance(message, dict):
        raise WireError("a frame that is not a JSON object")
    return message


def frame_length(header: bytes) -> int:
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME:
        raise WireError(f"a frame of {length} bytes")
    return int(length)


def read_frame(stream: BinaryIO) -> bytes | None:
    """The next frame's body from a blocking stream; None at a clean end between frames."""
    header = stream.read(HEADER.size)
    if not header:
        return None
    if len(header) < HEADER.size:
        raise WireError("the stream ended inside a frame header")
    length = frame_length(header)
    data = stream.read(length)
    if len(data) < length:
        raise WireError("the stream ended inside a frame")
    return data
