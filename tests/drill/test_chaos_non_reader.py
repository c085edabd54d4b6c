"""The chaos mix's non-reader (tray_app/drill/chaos_misbehaving.py) against a scripted server: a client that
reads nothing counts as dropped only when the service ended its job and closed the stream, and as lost when
the service kept it (review F1: keep-alive comments kept such clients forever)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from tray_app.drill import chaos_misbehaving as misbehaving

HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
    b"x-failsoft-job: job-1\r\nx-failsoft-job-token: secret\r\n\r\n"
)
PIECE = b'data: {"choices": [{"delta": {"content": "The"}}]}\n\n'


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


@contextlib.asynccontextmanager
async def scripted(answer: bytes, ended: asyncio.Event) -> AsyncIterator[str]:
    """A server that answers `answer`, then holds the connection until `ended` (the job ended), then closes
    it (the router's drop)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        await ended.wait()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}"


def job_api(states: list[str], seen: list[dict[str, str]]) -> httpx.AsyncClient:
    """The mix's own client, reading the job's record: each read gives the next state (the last repeats)."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(dict(request.headers))
        state = states.pop(0) if len(states) > 1 else states[0]
        return httpx.Response(200, json={"id": "job-1", "state": state})

    return httpx.AsyncClient(transport=httpx.MockTransport(handle), base_url="http://service")


async def run(answer: bytes, states: list[str], read_timeout: float) -> tuple[Any, list[dict[str, str]]]:
    ended, seen = asyncio.Event(), []
    async with scripted(answer, ended) as base_url, job_api(states, seen) as http:

        async def end_when_done() -> None:
            while states[0] in ("queued", "running"):
                await asyncio.sleep(0.05)
            ended.set()

        watcher = asyncio.create_task(end_when_done())
        try:
            (sent,) = await misbehaving.non_reader(http, base_url, {}, read_timeout)
        finally:
            watcher.cancel()
    return sent, seen


async def test_a_non_reader_whose_job_the_service_ended_is_dropped() -> None:
    sent, seen = await run(HEAD + chunk(PIECE), ["running", "running", "cancelled"], 30.0)
    assert (sent.outcome, sent.job_id, sent.ends) == ("dropped", "job-1", 0)
    assert seen and seen[0]["x-failsoft-job-token"] == "secret"  # its own job, read with its token


async def test_a_non_reader_the_service_keeps_is_lost() -> None:
    sent, _ = await run(HEAD + chunk(PIECE), ["running"], misbehaving.DRAIN + 1.0)
    assert sent.outcome == "lost" and "never dropped" in sent.detail, sent


async def test_a_non_reader_whose_answer_fit_the_buffers_is_judged_by_it() -> None:
    whole = HEAD + chunk(PIECE) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    sent, _ = await run(whole, ["completed"], 30.0)
    assert (sent.outcome, sent.ends) == ("completed", 1)


async def test_a_refused_non_reader_says_why() -> None:
    body = json.dumps({"error": {"code": "queue_full", "message": "the queue is full"}}).encode()
    refusal = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    sent, seen = await run(refusal, ["completed"], 30.0)
    assert (sent.outcome, sent.status, sent.code) == ("error", 429, "queue_full")
    assert not seen  # no job to wait for
