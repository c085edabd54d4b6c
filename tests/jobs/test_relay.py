"""How the relay reads a worker's stream and names each way an attempt can fail, against a scripted HTTP
server on loopback (real sockets, the bytes a worker would send)."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.support.scripted_http import (
    LAST_CHUNK,
    STREAM_HEAD,
    Script,
    ScriptedRequest,
    ScriptedServer,
    chunk,
    endless_stream,
    json_answer,
    scripted_server,
)
from tray_app.jobs.relay import Relay, UpstreamError, classify_error

CHUNK = {"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
EVENT = f"data: {json.dumps(CHUNK)}\n\n".encode()


def streaming(*pieces: bytes, end: bool = True) -> Script:
    async def script(request: ScriptedRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(STREAM_HEAD)
        for piece in pieces:
            writer.write(chunk(piece))
            await writer.drain()
        if end:
            writer.write(LAST_CHUNK)
        return end

    return script


async def collect(script: Script, first: float = 1.0, every: float = 1.0) -> list[str]:
    relay = Relay()
    try:
        async with scripted_server(script) as server:
            url = server.url + "/v1/chat/completions"
            return [c.raw async for c in relay.stream(url, b"{}", {}, first, every)]
    finally:
        await relay.aclose()


async def test_a_complete_stream_yields_its_chunks() -> None:
    chunks = await collect(streaming(EVENT, b": ping\n\ndata: [DONE]\n\n"))
    assert [json.loads(raw) for raw in chunks] == [CHUNK]


async def test_events_split_across_chunks_are_put_back_together() -> None:
    cut = len(EVENT) // 2
    chunks = await collect(streaming(EVENT[:cut], EVENT[cut:] + EVENT[:5], EVENT[5:] + b"data: [DONE]\n\n"))
    assert [json.loads(raw) for raw in chunks] == [CHUNK, CHUNK]


async def test_crlf_line_ends_and_a_last_line_without_its_end_are_read() -> None:
    crlf = EVENT.replace(b"\n", b"\r\n")
    chunks = await collect(streaming(crlf, b": ping\r\n\r\n", b"data: [DONE]"))
    assert [json.loads(raw) for raw in chunks] == [CHUNK]


async def test_keepalive_comments_do_not_hide_a_stall() -> None:
    async def script(request: ScriptedRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(STREAM_HEAD + chunk(EVENT))
        while True:
            await asyncio.sleep(0.02)
            writer.write(chunk(b": ping\n\n"))
            await writer.drain()

    with pytest.raises(UpstreamError) as failure:
        await collect(script, every=0.3)
    assert failure.value.kind == "hung"


def progress_event(processed: int) -> bytes:
    """llama-server's prompt-progress event (`return_progress`), as its chat stream sends it."""
    obj = {
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}],
        "prompt_progress": {"total": 4096, "cache": 0, "processed": processed, "time_ms": 40.0},
    }
    return f"data: {json.dumps(obj)}\n\n".encode()


async def test_a_long_prompt_read_batch_by_batch_is_not_a_hang() -> None:
    """A prompt that takes three times the first-token timeout, with progress events in between (issue
    14: a slow prompt was taken for a hung worker, and the worker was killed)."""

    async def script(request: ScriptedRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(STREAM_HEAD)
        for batch in range(1, 10):
            await asyncio.sleep(0.1)
            writer.write(chunk(progress_event(batch * 512)))
            await writer.drain()
        writer.write(chunk(EVENT + b"data: [DONE]\n\n") + LAST_CHUNK)
        return True

    chunks = await collect(script, first=0.3, every=0.05)
    assert [json.loads(raw) for raw in chunks] == [CHUNK]  # progress is liveness, not a chunk to relay


async def test_progress_that_stops_is_still_a_hang() -> None:
    async def script(request: ScriptedRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(STREAM_HEAD + chunk(progress_event(512)))
        await writer.drain()
        await asyncio.sleep(10)
        return False

    with pytest.raises(UpstreamError) as failure:
        await collect(script, first=0.3)
    assert failure.value.kind == "hung"


async def test_no_answer_at_all_is_a_hang() -> None:
    async def script(request: ScriptedRequest, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(10)
        return False

    with pytest.raises(UpstreamError) as failure:
        await collect(script, first=0.3)
    assert failure.value.kind == "hung"


async def test_an_error_event_is_classified() -> None:
    # Exactly what llama-server sends every active slot when llama_decode returns -2 or -3.
    error = b'data: {"error":{"code":500,"message":"Compute error.","type":"server_error"}}\n\n'
    with pytest.raises(UpstreamError) as failure:
        await collect(streaming(EVENT, error))
    assert failure.value.kind == "oom_decode"


async def test_an_end_without_done_is_a_failure() -> None:
    with pytest.raises(UpstreamError) as failure:
        await collect(streaming(EVENT))
    assert failure.value.kind == "exited"


async def test_a_connection_dropped_mid_stream_is_a_failure() -> None:
    with pytest.raises(UpstreamError) as failure:
        await collect(streaming(EVENT, end=False))
    assert failure.value.kind == "exited"
    assert "closed the connection" in failure.value.message


async def test_a_worker_that_is_not_listening() -> None:
    async with scripted_server(streaming()) as server:
        url = server.url
    relay = Relay()
    try:
        with pytest.raises(UpstreamError) as failure:
            async for _ in relay.stream(url + "/v1/completions", b"{}", {}, 1.0, 1.0):
                pass
    finally:
        await relay.aclose()
    assert failure.value.kind == "exited" and "cannot connect" in failure.value.message


@pytest.mark.parametrize("payload", [b"{not json", b'{"content": "\xff\xfe"}'], ids=["json", "utf-8"])
async def test_a_malformed_chunk_is_a_failure(payload: bytes) -> None:
    with pytest.raises(UpstreamError) as failure:
        await collect(streaming(b"data: " + payload + b"\n\n"))
    assert failure.value.kind == "exited" and "malformed chunk" in failure.value.message


async def test_an_error_status_before_the_stream() -> None:
    body = b'{"error": {"message": "Requested tokens exceed context window", "code": "x"}}'

    async def script(request: ScriptedRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(json_answer(400, body, "Bad Request"))
        return True

    with pytest.raises(UpstreamError) as failure:
        await collect(script)
    assert failure.value.client_error and failure.value.status == 400
    assert failure.value.message == "Requested tokens exceed context window"


async def test_the_request_reaches_the_worker_with_its_headers_and_body() -> None:
    relay = Relay()
    try:
        async with scripted_server(streaming(b"data: [DONE]\n\n")) as server:
            chunks = relay.stream(server.url + "/v1/completions", b'{"a": 1}', {"X-Request-Id": "r-1"}, 1, 1)
            assert [c async for c in chunks] == []
        (request,) = server.requests
    finally:
        await relay.aclose()
    assert (request.method, request.path, request.body) == ("POST", "/v1/completions", b'{"a": 1}')
    assert request.headers["x-request-id"] == "r-1"
    assert request.headers["content-type"] == "application/json"


@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        (500, "Compute error.", "oom_decode"),
        (None, "Compute error.", "oom_decode"),
        (None, "Context size has been exceeded.", "oom_decode"),
        (400, "the request exceeds the available context size", "client_error"),
        (422, "anything", "client_error"),
        (503, "Loading model", "exited"),
        # A worker that answers is up: anything else is about this request, whatever words it uses.
        (500, "Failed to parse tools: CUDA error: out of memory", "client_error"),
        (500, "got exception: llama_decode returned -2", "client_error"),
        (None, "Tool with name 'CUDA error: out of memory' not found in tools", "client_error"),
    ],
)
def test_classify_error(status: int | None, message: str, kind: str) -> None:
    assert classify_error(status, message) == kind


def test_an_unavailable_error_type_is_not_serving() -> None:
    assert classify_error(None, "shutting down", "unavailable_error") == "exited"


STREAM_ANSWER = STREAM_HEAD + chunk(EVENT + b"data: [DONE]\n\n") + LAST_CHUNK


async def warm_then_stream(request: ScriptedRequest, writer: asyncio.StreamWriter) -> bool:
    """`/warm` answers JSON on a kept-alive connection; anything else a one-event stream."""
    writer.write(json_answer(200, b"{}", "OK") if request.path == "/warm" else STREAM_ANSWER)
    return True


async def arrived(server: ScriptedServer, count: int) -> None:
    for _ in range(200):
        if len(server.requests) >= count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{count} requests never arrived: {server.requests}")


async def test_a_dispatched_request_reaches_the_worker_before_its_answer_is_read() -> None:
    relay = Relay()
    try:
        async with scripted_server(warm_then_stream) as server:
            await relay.post(server.url + "/warm", b"{}", {}, 1)  # leaves a kept-alive connection idle
            url = server.url + "/v1/chat/completions"
            sent = relay.dispatch(url, b'{"a": 1}', {"X-Request-Id": "r-1"})
            await arrived(server, 2)  # written at once: nothing has read the answer yet
            chunks = [c.raw async for c in relay.stream(url, b'{"a": 1}', {}, 1, 1, sent)]
        assert [json.loads(raw) for raw in chunks] == [CHUNK]
        assert [(r.path, r.body) for r in server.requests] == [
            ("/warm", b"{}"),
            ("/v1/chat/completions", b'{"a": 1}'),
        ]  # the stream read the dispatched request's answer: it wrote no second request
        assert server.requests[1].headers["x-request-id"] == "r-1"
    finally:
        await relay.aclose()


async def test_a_dispatch_with_no_idle_connection_is_written_when_the_answer_is_read() -> None:
    relay = Relay()
    try:
        async with scripted_server(warm_then_stream) as server:
            url = server.url + "/v1/chat/completions"
            sent = relay.dispatch(url, b"{}", {})
            await asyncio.sleep(0.05)
            assert server.requests == []  # no connection yet: the stream connects and writes it
            chunks = [c.raw async for c in relay.stream(url, b"{}", {}, 1, 1, sent)]
        assert [json.loads(raw) for raw in chunks] == [CHUNK]
        assert len(server.requests) == 1
    finally:
        await relay.aclose()


async def test_a_dropped_dispatch_closes_its_connection() -> None:
    closed = asyncio.Event()
    relay = Relay()
    try:
        async with scripted_server(endless_stream(closed)) as server:
            await relay.post(server.url + "/warm", b"{}", {}, 1)
            sent = relay.dispatch(server.url + "/v1/chat/completions", b"{}", {})
            await arrived(server, 2)
            sent.abort()
            await asyncio.wait_for(closed.wait(), 2)
    finally:
        await relay.aclose()
