"""The relay's HTTP client against a scripted server: keep-alive reuse, a connection the server closed
while idle, a response abandoned after its last event, and what is refused."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.scripted_http import (
    LAST_CHUNK,
    STREAM_HEAD,
    ScriptedRequest,
    chunk,
    endless_stream,
    json_answer,
    scripted_server,
)
from tray_app.engine import loopback_http
from tray_app.engine.loopback_http import ConnectionFailed, UpstreamPool


async def answer_ok(request: ScriptedRequest, writer: asyncio.StreamWriter) -> bool:
    writer.write(json_answer(200, b'{"ok": true}', "OK"))
    return True


async def test_connections_are_reused_while_fresh() -> None:
    pool = UpstreamPool()
    async with scripted_server(answer_ok) as server:
        for _ in range(5):
            response = await pool.send("POST", server.url + "/x", b"{}", {})
            assert (response.status, await response.read()) == (200, b'{"ok": true}')
        assert server.connections == 1 and len(server.requests) == 5
        await pool.aclose()
    assert pool.connections_opened == 1


async def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    async def answer_then_close(request: ScriptedRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(json_answer(200, b"{}", "OK"))
        return False  # a keep-alive answer, then the server closes (as uvicorn does after its timeout)

    pool = UpstreamPool()
    async with scripted_server(answer_then_close) as server:
        for _ in range(3):
            response = await pool.send("POST", server.url + "/x", b"{}", {})
            assert await response.read() == b"{}"
            await asyncio.sleep(0.05)  # the close reaches the client while the connection is idle
        await pool.aclose()
    assert server.connections == 3 and len(server.requests) == 3


async def test_a_connection_that_breaks_as_it_is_reused_is_retried_once() -> None:
    served: list[int] = []

    async def close_every_second_request(request: ScriptedRequest, writer: asyncio.StreamWriter) -> bool:
        served.append(1)
        if len(served) % 2 == 0:
            return False  # read the request, answer nothing, close: what a server closing an idle one does
        writer.write(json_answer(200, b"{}", "OK"))
        return True

    pool = UpstreamPool()
    async with scripted_server(close_every_second_request) as server:
        for _ in range(2):
            response = await pool.send("POST", server.url + "/x", b"{}", {})
            assert await response.read() == b"{}"
        await pool.aclose()
    assert server.connections == 2 and len(server.requests) == 3


async def test_an_event_stream_connection_is_not_reused() -> None:
    """llama-server ends the connection after an event stream although it announces keep-alive: the pool
    opens a new one for the next request instead of writing into one being closed."""

    async def stream_slow_end(request: ScriptedRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(STREAM_HEAD + chunk(b"data: [DONE]\n\n"))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(LAST_CHUNK)
        return True

    pool = UpstreamPool()
    async with scripted_server(stream_slow_end) as server:
        for _ in range(3):
            response = await pool.send("POST", server.url + "/x", b"{}", {})
            chunks = response.chunks()
            assert await anext(chunks) == b"data: [DONE]\n\n"
            response.release()  # before the end of the body arrived
            await asyncio.sleep(0.1)
        await pool.aclose()
    assert server.connections == 3 and len(server.requests) == 3


async def test_a_streaming_pool_connects_for_the_next_stream_when_this_one_ends() -> None:
    """The relay's pool keeps one spare connection per worker: each stream's request is written into a
    connection opened before the request came, not one it must wait to open. The spare is opened when the
    last stream ends, not while it runs (a connect then would cost the worker time on a small machine)."""

    async def stream_then_close(request: ScriptedRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(STREAM_HEAD + chunk(b"data: {}\n\n"))
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(chunk(b"data: [DONE]\n\n") + LAST_CHUNK)
        return False  # llama-server's way: the connection ends with the stream

    pool = UpstreamPool(spare_for_streams=True)
    async with scripted_server(stream_then_close) as server:
        for number in range(3):
            opened_before = server.connections
            response = await pool.send("POST", server.url + "/x", b"{}", {})
            if number > 0:
                assert opened_before == number + 1  # this request's connection was there already
            assert await anext(response.chunks()) == b"data: {}\n\n"
            await asyncio.sleep(0.05)
            assert server.connections == number + 1  # no spare while the stream runs
            assert await response.read() == b"data: [DONE]\n\n"
            await asyncio.sleep(0.1)  # the spare connects
            assert server.connections == number + 2
        await pool.aclose()
    assert len(server.requests) == 3
    assert pool.connections_opened == 4  # the first request's own, then one spare per stream


async def test_a_pool_asked_to_prepare_connects_at_once_and_only_once() -> None:
    """After a stream's first token the relay asks for the next request's connection (`prepare`): opened
    then, while the stream still runs, and not again while one is idle or opening."""

    async def stream_slowly(request: ScriptedRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(STREAM_HEAD + chunk(b"data: {}\n\n"))
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(chunk(b"data: [DONE]\n\n") + LAST_CHUNK)
        return False

    pool = UpstreamPool(spare_for_streams=True)
    async with scripted_server(stream_slowly) as server:
        url = server.url + "/x"
        response = await pool.send("POST", url, b"{}", {})
        assert await anext(response.chunks()) == b"data: {}\n\n"
        pool.prepare(pool.address_of(url))
        pool.prepare(pool.address_of(url))
        await asyncio.sleep(0.1)
        assert server.connections == 2  # the stream's own and one spare, while the stream runs
        assert await response.read() == b"data: [DONE]\n\n"
        await asyncio.sleep(0.1)
        assert server.connections == 2  # the spare is idle: the stream's end opens no other
        await pool.aclose()


async def test_a_stream_that_never_ends_after_release_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loopback_http, "RELEASE_GRACE_SECONDS", 0.1)

    async def stream_without_end(request: ScriptedRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(STREAM_HEAD + chunk(b"data: [DONE]\n\n"))
        return True

    pool = UpstreamPool()
    async with scripted_server(stream_without_end) as server:
        for _ in range(2):
            response = await pool.send("POST", server.url + "/x", b"{}", {})
            assert await anext(response.chunks()) == b"data: [DONE]\n\n"
            response.release()
            await asyncio.sleep(0.3)
        await pool.aclose()
    assert server.connections == 2


async def test_abort_closes_the_connection_so_the_worker_sees_the_client_go() -> None:
    closed = asyncio.Event()
    pool = UpstreamPool()
    async with scripted_server(endless_stream(closed)) as server:
        response = await pool.send("POST", server.url + "/x", b"{}", {})
        await anext(response.chunks())
        response.abort()
        await asyncio.wait_for(closed.wait(), 5)
        await pool.aclose()


async def test_a_connection_refused_is_reported() -> None:
    async with scripted_server(answer_ok) as server:
        url = server.url
    with pytest.raises(ConnectionFailed, match="cannot connect"):
        await UpstreamPool().send("POST", url + "/x", b"{}", {})


async def test_a_line_break_in_a_header_is_refused() -> None:
    async with scripted_server(answer_ok) as server:
        with pytest.raises(ValueError, match="line break"):
            await UpstreamPool().send("POST", server.url + "/x", b"{}", {"X-Id": "a\r\nEvil: 1"})
        assert server.requests == []


async def test_a_deadline_fails_a_silent_stream_but_not_a_slow_reader() -> None:
    async def three_events_then_silence(request: ScriptedRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(STREAM_HEAD + b"".join(chunk(b"data: %d\n\n" % n) for n in range(3)))
        await asyncio.sleep(10)
        return False

    pool = UpstreamPool()
    async with scripted_server(three_events_then_silence) as server:
        response = await pool.send("POST", server.url + "/x", b"{}", {})
        response.set_deadline(asyncio.get_running_loop().time() + 0.1)
        await asyncio.sleep(0.3)  # the reader is late: what waits for it is not a stall
        chunks = response.chunks()
        received = b""
        while received.count(b"data:") < 3:
            received += await anext(chunks)
        with pytest.raises(loopback_http.Stalled):
            await anext(chunks)
        response.abort()
        await pool.aclose()
