"""`POST /v1/embeddings` bodies, checked before anything is spent on them: OpenAI's fields, 400 naming the
field otherwise."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tray_app.server.errors import bad_request
from tray_app.server.requests import parse_json_object

MAX_INPUTS = 2048  # OpenAI's own limit on inputs per request
ENCODINGS = ("float", "base64")


@dataclass(frozen=True)
class EmbeddingRequest:
    body: dict[str, Any]  # as the worker gets it: inputs, encoding_format
    model: str | None
    count: int  # inputs


def _inputs(value: Any) -> list[Any]:
    """The inputs as a list: strings, or token arrays (lists of integers)."""
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, list) and value and all(isinstance(item, int) for item in value):
        value = [value]  # one input given as tokens
    if not isinstance(value, list) or not value:
        raise bad_request("'input' must be a string, a list of strings or a list of token arrays", "input")
    for index, item in enumerate(value):
        text = isinstance(item, str) and item.strip()
        tokens = isinstance(item, list) and item and all(isinstance(t, int) and t >= 0 for t in item)
        if not (text or tokens):
            raise bad_request(f"'input[{index}]' is empty or not text or tokens", f"input[{index}]")
    if len(value) > MAX_INPUTS:
        raise bad_request(f"'input' has {len(value)} items; at most {MAX_INPUTS} per request", "input")
    return value


def parse_embedding_request(raw: bytes) -> EmbeddingRequest:
    body = parse_json_object(raw)
    inputs = _inputs(body.get("input"))
    encoding = body.get("encoding_format") or "float"
    if encoding not in ENCODINGS:
        raise bad_request("'encoding_format' must be float or base64", "encoding_format")
    if body.get("dimensions") is not None:
        raise bad_request(
            "'dimensions' is not supported: this model's embeddings have one fixed size", "dimensions"
        )
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    return EmbeddingRequest({"input": inputs, "encoding_format": encoding}, model, len(inputs))
