"""A lean HTTP/1.1 client for our own workers on loopback: the hop every token takes (router to worker), and
the supervisor's health checks, every second for as long as the service runs.

httpx (used for everything else) spends 1.4 to 2 ms of CPU on each streamed request on a 2-core machine;
this client spends about a tenth of that, and on the relay path httpx was most of the router's overhead.
It speaks what the workers speak and nothing more: HTTP/1.1 with keep-alive, a request body with
Content-Length, and chunked or Content-Length responses, parsed by httptools (the C parser uvicorn uses).
Connections are kept per worker address and reused while they are fresh. llama-server closes the connection
after every event stream, so a pool that streams keeps one spare connection per worker, opened once a
stream's first token has reached its client (`prepare`) and when a stream ends: the next request's connect
is then off its path to the first token, and no connect competes with a first token for the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

# llama-server (cpp-httplib) and uvicorn close a keep-alive connection after 5 s idle; reusing one only well
# inside that avoids writing a request into a connection the server is closing (and the one retry it costs).
IDLE_REUSE_SECONDS = 3.0
MAX_IDLE_PER_ADDRESS = 16
# How long a response that was abandoned after its last event may take to end before its connection is
# closed instead of reused.
RELEASE_GRACE_SECONDS = 1.0
MAX_HEADS = 256  # request lines kept per pool (method and URL)

_END = object()


class ConnectionFailed(Exception):
    """The worker could not be reached, or the connection broke before the response was complete."""


class ConnectTimeout(ConnectionFailed):
    """No connection within the connect timeout."""


class Stalled(Exception):
    """A response's deadline passed with nothing waiting to be read (see `Response.set_deadline`)."""


class _Connection(asyncio.Protocol):
    """One TCP connection and the response currently arriving on it."""

    def __init__(self, pool: UpstreamPool, address: tuple[str, int]) -> None:
        self._pool = pool
        self.address = address
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.response: Response | None = None

    # asyncio.Protocol ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:
            self.close()  # nothing was asked: a server that talks out of turn is not reused
            return
        response.received_any = True
        response.received_at = time.perf_counter()
        try:
            response.parser.feed_data(data)
        except httptools.HttpParserError as error:
            response.fail(ConnectionFailed(f"malformed response from the worker: {error}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.response is not None and not self.response.complete:
            reason = f": {exc}" if exc else ""
            self.response.fail(ConnectionFailed(f"the worker closed the connection{reason}"))

    # ---------------------------------------------------------------------------------------------
    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def send(self, request: bytes) -> Response:
        assert self.transport is not None
        # Written first: nothing of the answer can arrive before this task returns to the loop, so the
        # response's parser and queue are made while the worker already reads the request.
        self.transport.write(request)
        self.response = Response(self, time.perf_counter())
        return self.response

    def finished(self, response: Response) -> None:
        """The response ended (fully read, or abandoned and then ended): reuse the connection if allowed."""
        if response is not self.response:
            return
        self.response = None
        if response.keep_alive and not self.closed:
            self._pool.release(self)
        else:
            self.close()
            self._pool.closed_after(self)


class Response:
    """Status and headers once they arrived; the body as it arrives (`chunks()`) or whole (`read()`)."""

    def __init__(self, connection: _Connection, sent_at: float) -> None:
        loop = asyncio.get_running_loop()
        self._connection = connection
        # time.perf_counter() stamps: the request written, the last bytes of the answer arrived (the router's
        # own time on a first token's path, see jobs.path_timing).
        self.sent_at = sent_at
        self.received_at = 0.0
        self.parser = httptools.HttpResponseParser(self)
        self.headers_ready: asyncio.Future[None] = loop.create_future()
        # What arrived and is not read yet (body bytes, then _END or an error), and the reader waiting for it:
        # one reader, so a deque and a future do what asyncio.Queue does with less work per chunk.
        self._items: deque[object] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = False
        self.received_any = False
        self.complete = False
        self._abandoned = False
        self._loop = loop
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # httptools callbacks ------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        # llama-server (cpp-httplib) ends the connection after a chunked event stream although it announces
        # keep-alive: reusing it would cost a failed write and a retry on a new connection every request.
        event_stream = self.headers.get("content-type", "").startswith("text/event-stream")
        self.keep_alive = self.parser.should_keep_alive() and not event_stream
        if not self.headers_ready.done():
            self.headers_ready.set_result(None)

    def on_body(self, body: bytes) -> None:
        if not self._abandoned:
            self._put(body)

    def on_message_complete(self) -> None:
        self.complete = True
        self._stop_timer()
        self._put(_END)
        if self._abandoned:
            self._connection.finished(self)

    # ---------------------------------------------------------------------------------------------
    def set_deadline(self, when: float) -> None:
        """Fail with Stalled when the loop's clock passes `when` while nothing is waiting to be read. Each
        call moves the deadline; one timer serves them all (cheaper than a timeout scope per read)."""
        self._deadline = when
        if self._timer is None and not self.complete:
            self._timer = self._loop.call_at(when, self._check_deadline)

    def _check_deadline(self) -> None:
        self._timer = None
        if self.complete or self._connection.response is not self:
            return
        now = self._loop.time()
        if now < self._deadline:
            self._timer = self._loop.call_at(self._deadline, self._check_deadline)
        elif self._items:
            # The reader is behind (a slow client downstream), not the worker: look again shortly.
            self._timer = self._loop.call_at(now + 0.05, self._check_deadline)
        else:
            self.fail(Stalled())

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def fail(self, error: Exception) -> None:
        if not self.headers_ready.done():
            self.headers_ready.set_exception(error)
            self.headers_ready.exception()  # retrieved here: a caller that gave up must not log it
        self._put(error)

    def _put(self, item: object) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_chunk(self) -> bytes | None:
        """The next piece of the body as it arrived; None at its end. Raises what broke the response."""
        while not self._items:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._items.popleft()
        if item is _END:
            self._connection.finished(self)
            return None
        if isinstance(item, Exception):
            raise item
        assert isinstance(item, bytes)
        return item

    async def chunks(self) -> AsyncIterator[bytes]:
        while (chunk := await self.next_chunk()) is not None:
            yield chunk

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    def release(self) -> None:
        """Done with this response: its connection goes back to the pool once the response has ended
        (at once if it has, else when its last bytes arrive within a grace period), otherwise it closes."""
        self._stop_timer()
        if self._connection.response is not self:
            return
        if self.complete:
            self._connection.finished(self)
            return
        self._abandoned = True
        connection = self._connection
        asyncio.get_running_loop().call_later(RELEASE_GRACE_SECONDS, self._give_up, connection)

    def abort(self) -> None:
        """Stop reading now: the connection closes (the worker sees the client go away)."""
        self._stop_timer()
        if self._connection.response is self:
            self._connection.close()

    def _give_up(self, connection: _Connection) -> None:
        if connection.response is self:
            connection.close()


@dataclass
class Sent:
    """A request `UpstreamPool.start` wrote on a kept-alive connection (`response` is None when there was
    none: `UpstreamPool.answer` then connects and writes it)."""

    address: tuple[str, int]
    request: bytes
    response: Response | None

    def abort(self) -> None:
        """Nobody will read the answer: the connection closes (the worker sees the client go)."""
        if self.response is not None:
            self.response.abort()


class UpstreamPool:
    """Keep-alive connections per worker address."""

    def __init__(self, connect_timeout: float = 5.0, *, spare_for_streams: bool = False) -> None:
        self.connect_timeout = connect_timeout
        self.spare_for_streams = spare_for_streams
        self._idle: dict[tuple[str, int], deque[_Connection]] = {}
        self._opening_spare: set[tuple[str, int]] = set()
        self._spare_tasks: set[asyncio.Task[None]] = set()
        self.connections_opened = 0  # for tests and diagnostics: reuse keeps this low
        self._heads: dict[tuple[str, str], tuple[tuple[str, int], bytes]] = {}

    async def send(self, method: str, url: str, body: bytes, headers: Mapping[str, str]) -> Response:
        """Send the request and wait for the response's status and headers (`start`, then `answer`)."""
        return await self.answer(self.start(method, url, body, headers))

    def start(self, method: str, url: str, body: bytes, headers: Mapping[str, str]) -> Sent:
        """Write the request now, without waiting, if a kept-alive connection to its worker is idle (else
        `answer` connects and writes it)."""
        address, head = self._head(method, url)
        request = _encode(head, body, headers)
        connection = self._take(address)
        return Sent(address, request, connection.send(request) if connection is not None else None)

    async def answer(self, sent: Sent) -> Response:
        """Wait for the status and headers of a request `start` made. A connection that was reused and broke
        before any byte of the answer came back (the server closed it while idle) is retried once on a new
        connection, as is a request that found no idle connection; anything else raises ConnectionFailed."""
        response = sent.response
        if response is not None:
            try:
                await response.headers_ready
                return response
            except ConnectionFailed:
                response.abort()
                if response.received_any:
                    raise
            except asyncio.CancelledError:
                response.abort()
                raise
        connection = await self._connect(sent.address)
        response = connection.send(sent.request)
        try:
            await response.headers_ready
        except BaseException:
            connection.close()
            raise
        return response

    def closed_after(self, connection: _Connection) -> None:
        """`connection` ended with its response (an event stream: the worker closes it): a pool that streams
        connects again, so the next request finds a connection ready."""
        self.prepare(connection.address)

    def prepare(self, address: tuple[str, int]) -> None:
        """A pool that streams opens a spare connection to `address` now, unless one is idle or opening. Not
        before a stream's first token: until then a connect costs the machine time the worker needs."""
        if self.spare_for_streams:
            self._open_spare(address)

    def address_of(self, url: str) -> tuple[str, int]:
        return self._head("POST", url)[0]

    def release(self, connection: _Connection) -> None:
        idle = self._idle.setdefault(connection.address, deque())
        if len(idle) >= MAX_IDLE_PER_ADDRESS:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        idle.append(connection)

    async def aclose(self) -> None:
        for task in list(self._spare_tasks):
            task.cancel()
        for idle in self._idle.values():
            while idle:
                idle.pop().close()
        self._idle.clear()

    def _head(self, method: str, url: str) -> tuple[tuple[str, int], bytes]:
        """The address and the request line with its Host for `method` on `url`; worked out once per URL (a
        worker's few paths), as this runs before every request leaves for its worker."""
        known = self._heads.get((method, url))
        if known is None:
            parts = urlsplit(url)
            address = (parts.hostname or "127.0.0.1", parts.port or 80)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            head = f"{method} {target} HTTP/1.1\r\nHost: {address[0]}:{address[1]}\r\n".encode("latin-1")
            if len(self._heads) >= MAX_HEADS:
                self._heads.clear()  # workers restarted on new ports many times over
            known = self._heads[(method, url)] = (address, head)
        return known

    def _take(self, address: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(address)
        now = time.monotonic()
        while idle:
            connection = idle.pop()  # the most recently used: the least likely to be closing
            if not connection.closed and now - connection.idle_since < IDLE_REUSE_SECONDS:
                return connection
            connection.close()
        return None

    def _open_spare(self, address: tuple[str, int]) -> None:
        if address in self._opening_spare or self._idle.get(address):
            return
        self._opening_spare.add(address)
        task = asyncio.get_running_loop().create_task(self._spare(address))
        self._spare_tasks.add(task)
        task.add_done_callback(self._spare_tasks.discard)

    async def _spare(self, address: tuple[str, int]) -> None:
        try:
            connection = await self._connect(address)
        except (ConnectTimeout, ConnectionFailed):
            return  # the worker is going away: the next request finds out, with its own error
        finally:
            self._opening_spare.discard(address)
        self.release(connection)

    async def _connect(self, address: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self, address), address[0], address[1]
                )
        except TimeoutError:
            raise ConnectTimeout(
                f"no connection to {address[0]}:{address[1]} in {self.connect_timeout:.1f}s"
            ) from None
        except OSError as error:
            raise ConnectionFailed(f"cannot connect to {address[0]}:{address[1]}: {error}") from None
        self.connections_opened += 1
        return connection


def _encode(head: bytes, body: bytes, headers: Mapping[str, str]) -> bytes:
    """A request: `head` (its request line and Host), then `headers`, then `body`."""
    lines = [f"Content-Length: {len(body)}"]
    for name, value in headers.items():
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
            raise ValueError(f"header {name!r} contains a line break")
        lines.append(f"{name}: {value}")
    return head + "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body
