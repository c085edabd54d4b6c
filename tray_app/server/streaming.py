"""The server-sent events a streamed client reads: the engine's outcomes as OpenAI's stream (each chunk as
`data: {...}`, the last one naming who served the answer, then `data: [DONE]`), and a stored answer as a
short stream (idempotent replays, answers that completed after an approval)."""

from __future__ import annotations

import json
from typing import Any

from tray_app.jobs.assemble import chat_chunk, completion_chunk
from tray_app.jobs.outcomes import Ended, Finished, Outcome, Piece
from tray_app.jobs.registry import Job

DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any] | str) -> bytes:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    return b"data: " + text.encode() + b"\n\n"


def include_usage(body: dict[str, Any]) -> bool:
    """Whether a streamed request asked for the token counts (`stream_options.include_usage`)."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def failsoft_chunk(
    kind: str,
    chunk_id: str,
    created: int,
    model: str,
    failsoft: dict[str, Any],
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The last chunk before [DONE]: no content, only who served the answer, and the token counts when the
    request asked for them (OpenAI sends them in a chunk with no choices just before [DONE])."""
    base = (
        chat_chunk(chunk_id, created, model, {}, None)
        if kind == "chat"
        else completion_chunk(chunk_id, created, model, "", None)
    )
    base["choices"] = []
    if usage is not None:
        base["usage"] = usage
    base["failsoft"] = failsoft
    return base


def result_to_stream(kind: str, result: dict[str, Any], with_usage: bool = False) -> list[bytes]:
    """A stored answer as a short stream: all content in one chunk, the finish, who served it (and the
    token counts, `with_usage`), [DONE]."""
    chunk_id, created, model = result.get("id", ""), int(result.get("created", 0)), result.get("model", "")
    choice = result["choices"][0]
    finish = choice.get("finish_reason")
    if kind == "completion":
        pieces = [completion_chunk(chunk_id, created, model, choice.get("text") or "", finish)]
    else:
        message = choice.get("message") or {}
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if message.get("reasoning_content"):
            delta["reasoning_content"] = message["reasoning_content"]
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        pieces = [chat_chunk(chunk_id, created, model, delta, finish)]
    usage = result.get("usage") if with_usage else None
    pieces.append(failsoft_chunk(kind, chunk_id, created, model, result.get("failsoft", {}), usage))
    return [*(sse(piece) for piece in pieces), DONE]


def _piece_event(piece: Piece) -> bytes:
    return sse(piece.raw if piece.raw is not None else piece.obj)


def outcome_bytes(job: Job, outcome: Outcome) -> bytes:
    """One outcome of the engine as what the client's stream gets."""
    if isinstance(outcome, Piece):
        if outcome.before:
            return b"".join([*map(_piece_event, outcome.before), _piece_event(outcome)])
        return _piece_event(outcome)
    if isinstance(outcome, Finished):
        usage = outcome.result.get("usage") if include_usage(job.body) else None
        if outcome.replayed:
            return b"".join(result_to_stream(job.kind, outcome.result, usage is not None))
        last = failsoft_chunk(
            job.kind, outcome.chunk_id, outcome.created, outcome.model, job.failsoft(), usage
        )
        return sse(last) + DONE  # one write for the end of the stream
    assert isinstance(outcome, Ended)
    return sse({"error": outcome.error.public()}) + DONE
