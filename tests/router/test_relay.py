"""How the relay reads a worker's stream and names each way an attempt can fail (a scripted upstream)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from tray_app.service.relay import Relay, UpstreamError, classify_error

CHUNK = {"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}


def relay_with(body: Callable[[], AsyncIterator[bytes]], status: int = 200) -> Relay:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body(), headers={"content-type": "text/event-stream"})

    return Relay(transport=httpx.MockTransport(handler))


async def collect(relay: Relay, first: float = 1.0, chunk: float = 1.0) -> list[str]:
    try:
        return [
            c.raw async for c in relay.stream("http://worker/v1/chat/completions", b"{}", {}, first, chunk)
        ]
    finally:
        await relay.aclose()


async def test_a_complete_stream_yields_its_chunks() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield f"data: {json.dumps(CHUNK)}\n\n".encode()
        yield b": ping\n\ndata: [DONE]\n\n"

    assert [json.loads(raw) for raw in await collect(relay_with(body))] == [CHUNK]


async def test_keepalive_comments_do_not_hide_a_stall() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield f"data: {json.dumps(CHUNK)}\n\n".encode()
        while True:
            await asyncio.sleep(0.02)
            yield b": ping\n\n"

    with pytest.raises(UpstreamError) as failure:
        await collect(relay_with(body), chunk=0.3)
    assert failure.value.kind == "hung"


async def test_an_error_event_is_classified() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield f"data: {json.dumps(CHUNK)}\n\n".encode()
        yield b'data: {"error": {"message": "llama_decode returned -2"}}\n\ndata: [DONE]\n\n'

    with pytest.raises(UpstreamError) as failure:
        await collect(relay_with(body))
    assert failure.value.kind == "oom_decode"


async def test_an_end_without_done_is_a_failure() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield f"data: {json.dumps(CHUNK)}\n\n".encode()

    with pytest.raises(UpstreamError) as failure:
        await collect(relay_with(body))
    assert failure.value.kind == "exited"


async def test_an_error_status_before_the_stream() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b'{"error": {"message": "Requested tokens exceed context window", "code": "x"}}'

    with pytest.raises(UpstreamError) as failure:
        await collect(relay_with(body, status=400))
    assert failure.value.client_error and failure.value.status == 400


@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        (500, "llama_decode returned -2", "oom_decode"),
        (500, "CUDA error: out of memory", "oom_decode"),
        (500, "1 validation error: messages", "client_error"),
        (422, "anything", "client_error"),
        (None, "abort() called", "crash_abort"),
        (500, "something else", "exited"),
    ],
)
def test_classify_error(status: int | None, message: str, kind: str) -> None:
    assert classify_error(status, message) == kind
