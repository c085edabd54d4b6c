"""A scripted HTTP/1.1 server on loopback for tests of the relay's client: each connection's requests are
answered by a script that writes raw bytes, so every way a worker can answer (or fail to) is reproducible.

    async with scripted_server(script) as server:
        ... server.url ... server.connections ...

`script(request, writer)` gets the request (method, path, headers, body) and writes the answer; it returns
False to close the connection afterwards, anything else to keep it open for the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field


@dataclass
class ScriptedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Script = Callable[[ScriptedRequest, asyncio.StreamWriter], Awaitable[bool | None]]


@dataclass
class ScriptedServer:
    url: str
    connections: int = 0
    requests: list[ScriptedRequest] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


LAST_CHUNK = b"0\r\n\r\n"
STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def json_answer(status: int, body: bytes, reason: str = "Error") -> bytes:
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body


def endless_stream(closed: asyncio.Event) -> Script:
    """A generation that goes on (keep-alive comments) until the client goes away, then sets `closed`; a
    request to `/warm` gets a JSON answer on a kept-alive connection instead."""

    async def script(request: ScriptedRequest, writer: asyncio.StreamWriter) -> bool:
        if request.path == "/warm":
            writer.write(json_answer(200, b"{}", "OK"))
            return True
        writer.write(STREAM_HEAD)
        try:
            while True:
                writer.write(chunk(b": ping\n\n"))
                await writer.drain()
                await asyncio.sleep(0.01)
        except ConnectionError:
            closed.set()
            return False

    return script


async def _read_request(reader: asyncio.StreamReader) -> ScriptedRequest | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    first, *lines = head.decode("latin-1").split("\r\n")
    method, path, _ = first.split(" ", 2)
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return ScriptedRequest(method, path, headers, body)


@contextlib.asynccontextmanager
async def scripted_server(script: Script) -> AsyncIterator[ScriptedServer]:
    state = ScriptedServer(url="")

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        state.writers.append(writer)
        try:
            while (request := await _read_request(reader)) is not None:
                state.requests.append(request)
                keep = await script(request, writer)
                await writer.drain()
                if keep is False:
                    break
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    state.url = f"http://127.0.0.1:{port}"
    try:
        yield state
    finally:
        server.close()
        for writer in state.writers:
            writer.close()
        await server.wait_closed()
