"""`POST /v1/embeddings` bodies, checked before anything is spent on them: OpenAI's fields, 400 naming the
field otherwise; and their tokens, counted at admission, within what the embeddings workers take."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tray_app.config import Config
from tray_app.server.errors import ApiError, bad_request
from tray_app.server.requests import parse_json_object

MAX_INPUTS = 2048  # OpenAI's own limit on inputs per request
ENCODINGS = ("float", "base64")


@dataclass(frozen=True)
class EmbeddingRequest:
    body: dict[str, Any]  # as the worker gets it: inputs, encoding_format
    model: str | None
    count: int  # inputs

    @property
    def inputs(self) -> list[Any]:
        inputs: list[Any] = self.body["input"]
        return inputs


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


def input_token_limit(cfg: Config) -> int:
    """The most tokens one input may have: what one slot of an embeddings worker holds, and what
    llama-server embeds in one physical batch (`--ubatch-size`; it refuses a longer input)."""
    settings = cfg.embeddings
    return max(min(settings.n_ctx // max(settings.n_parallel, 1), cfg.budget.n_ubatch), 1)


def check_tokens(counts: list[int], cfg: Config) -> int:
    """The request's tokens in all; 400 for an input longer than a worker takes, or a request over
    `embeddings.max_request_tokens` (each is read on the workers, however long it takes)."""
    limit = input_token_limit(cfg)
    for index, count in enumerate(counts):
        if count > limit:
            raise ApiError(
                400,
                f"'input[{index}]' has {count} tokens; an input may have at most {limit} here (what an "
                "embeddings worker reads at once: embeddings.n_ctx / embeddings.n_parallel, and "
                "budget.n_ubatch): split it",
                code="context_length_exceeded",
                param=f"input[{index}]",
            )
    total = sum(counts)
    cap = cfg.embeddings.max_request_tokens
    if total > cap:
        raise ApiError(
            400,
            f"the inputs have {total} tokens in all; at most {cap} per request "
            "(embeddings.max_request_tokens): send them in several requests",
            code="max_tokens_per_request",
            param="input",
        )
    return total
