"""The response of a streamed request: server-sent events written as the job produces them.

Leaner than Starlette's StreamingResponse, which starts a task group for every response: here the job's
own task writes each piece to the client itself (`Writer.write`) as soon as the response has started, so a
token reaches the client in the same turn of the event loop that read it from the worker. Pieces made before
that wait in the writer and go out in one write after the status line. A client that goes away ends the job.
A stream that says nothing for `keepalive` seconds (a job awaiting approval, a long prompt being read) gets
a comment line, which every event-stream reader skips, so that nothing between it and its client drops it.
A client that stops reading blocks the job's write; after `stall` seconds of that it is dropped (`on_stall`),
so a paused tab or a dead phone link cannot hold a job and its worker slot. The stall is measured on the
output's own write: a comment never restamps it, and none is sent while a write is under way (a client that
reads nothing gets nothing more queued).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import Receive, Scope, Send

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
KEEPALIVE = b": keepalive\n\n"


class Writer:
    """The job's side of the stream: `write` each piece, `close` at the end (one producer)."""

    def __init__(self) -> None:
        self._pending: list[bytes] = []
        self._send: Send | None = None  # set once the status line and everything pending went out
        self._closed = asyncio.Event()
        self._ended = False  # the last piece went out as the end of the response
        self._abandoned = False  # the client was dropped: nothing more goes to it, not even the end
        self.writes = 0  # the job's writes so far: the keep-alive looks whether any happened meanwhile
        # When the write of output in progress began (the loop's clock), None between writes: a client that
        # stops reading leaves it set (see StallWatch). Two stores per write, no timer of its own. Output
        # only: a keep-alive comment neither sets it nor goes out while it is set.
        self.blocked_since: float | None = None
        self._writing: asyncio.Task[object] | None = None  # the task whose output write that is
        self._commenting: asyncio.Task[object] | None = None  # the task sending a keep-alive comment
        # Called once when what waits goes out with the status line (see `when_pending_sent`).
        self._on_pending_sent: Callable[[], None] | None = None

    async def write(self, data: bytes, *, hold: bool = False, last: bool = False) -> bool:
        """Send `data` now if the response has started, else keep it for the first write. `hold`: nothing
        the client waits for (a finish with no text): it goes out with the next piece, in the same write.
        `last`: nothing follows, so it ends the response in the same write. True if it was sent now."""
        send = self._send
        if send is None or hold:
            self._pending.append(data)
            return False
        if self._pending:
            data = b"".join([*self._pending, data])
            self._pending.clear()
        if last:
            self._ended = True
            self._send = None  # a stray write after the end must not reach the finished response
        self.writes += 1
        await self._body(send, data, more=not last)
        return True

    def when_pending_sent(self, callback: Callable[[], None]) -> None:
        """Call `callback` once what waits now has gone to the client (after the status line)."""
        self._on_pending_sent = callback

    def _pending_sent(self) -> None:
        callback, self._on_pending_sent = self._on_pending_sent, None
        if callback is not None:
            callback()

    async def _body(self, send: Send, data: bytes, *, more: bool) -> None:
        """Every write of output (the job's, or the response's own first or last) goes through here, stamped
        while it waits for the client to read."""
        self.blocked_since = asyncio.get_running_loop().time()
        self._writing = asyncio.current_task()
        try:
            await send({"type": "http.response.body", "body": data, "more_body": more})
        finally:
            self.blocked_since = self._writing = None

    @property
    def busy(self) -> bool:
        """Something is on its way to the client: a write of output or a comment, either maybe blocked by a
        client that stopped reading."""
        return self._writing is not None or self._commenting is not None

    async def comment(self) -> None:
        """A keep-alive comment, if the response has started and not ended and nothing else is on its way. A
        write in progress says more than a comment; a blocked one means the client reads nothing, so nothing
        more is queued for it, and the stall stays measured on that write (a comment is not stamped)."""
        send = self._send
        if send is None or self.busy:
            return
        self._commenting = asyncio.current_task()
        try:
            await send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})
        finally:
            self._commenting = None

    def close(self) -> None:
        self._closed.set()

    def abandon(self) -> None:
        """The client is dropped: the response ends without another write (the server closes the
        connection), since a client that does not read would block that write too."""
        self._abandoned = True
        self._send = None
        self._closed.set()
        for task in (self._writing, self._commenting):
            # The output's write (the job's, or the response's own first or last), and a comment that got
            # in before it: neither would return while the client reads nothing.
            if task is not None:
                task.cancel()

    @property
    def abandoned(self) -> bool:
        return self._abandoned

    async def serve(self, send: Send) -> None:
        """After the status line: send what waits, then let `write` send directly until `close`. No await
        between the last look at what waits and the hand-over, so nothing written meanwhile is left behind
        or overtaken."""
        try:
            while self._pending:
                data = b"".join(self._pending)
                self._pending.clear()
                ended = self._closed.is_set()  # the job's task is over: this is the last of it
                await self._body(send, data, more=not ended)
                self._pending_sent()
                if ended:
                    return
            self._send = send
            await self._closed.wait()
        finally:
            self._send = None  # the response is over (or failed): a late write sends nothing
        if not self._ended and not self._abandoned:
            data = b"".join(self._pending)  # anything held back goes out with the end
            self._pending.clear()
            await self._body(send, data, more=False)
            self._pending_sent()


class KeepAlive:
    """Every `seconds` in which the writer wrote nothing and has nothing on its way, a comment (see
    `Writer.comment`). A timer, not a task: a stream's way to its first token gets one timer more, and a
    task only for the comment itself, one at a time."""

    def __init__(self, writer: Writer, seconds: float) -> None:
        self.writer = writer
        self.seconds = seconds
        self.loop = asyncio.get_running_loop()
        self.seen = writer.writes
        self.sending: asyncio.Task[None] | None = None
        self.timer = self.loop.call_later(seconds, self._tick)

    def _tick(self) -> None:
        if self.writer.writes == self.seen and not self.writer.busy:
            self.sending = self.loop.create_task(self.writer.comment())
        self.seen = self.writer.writes
        self.timer = self.loop.call_later(self.seconds, self._tick)

    def stop(self) -> None:
        """The response is over: no more comments, and one still on its way (a client that stopped
        reading) is given up."""
        self.timer.cancel()
        if self.sending is not None:
            self.sending.cancel()


class StallWatch:
    """Drops a client whose write has been blocked for `seconds` (it stopped reading): `on_stall` runs once.
    A timer that looks a few times per `seconds`, like KeepAlive, not a timeout around every write."""

    def __init__(self, writer: Writer, seconds: float, on_stall: Callable[[], None]) -> None:
        self.writer = writer
        self.seconds = seconds
        self.on_stall = on_stall
        self.loop = asyncio.get_running_loop()
        self.period = max(seconds / 4, 0.05)
        self.timer = self.loop.call_later(self.period, self._tick)

    def _tick(self) -> None:
        since = self.writer.blocked_since
        if since is not None and self.loop.time() - since >= self.seconds:
            self.on_stall()
            return
        self.timer = self.loop.call_later(self.period, self._tick)

    def stop(self) -> None:
        self.timer.cancel()


class EventStreamResponse:
    """An ASGI response: status 200, `text/event-stream`, the pieces as they come; `on_disconnect` runs if
    the client goes away first, `on_end` always runs once the response is over."""

    def __init__(
        self,
        writer: Writer,
        headers: dict[str, str],
        on_disconnect: Callable[[], None],
        on_end: Callable[[], None],
        keepalive: float = 0.0,
        stall: float = 0.0,
        on_stall: Callable[[], None] | None = None,
    ) -> None:
        self.writer = writer
        self.keepalive = keepalive  # seconds (0: none)
        self.stall = stall  # seconds a write may stay blocked before the client is dropped (0: forever)
        self.on_stall = on_stall
        self.headers = [(b"content-type", b"text/event-stream; charset=utf-8")] + [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in {**SSE_HEADERS, **headers}.items()
        ]
        self.on_disconnect = on_disconnect
        self.on_end = on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.create_task(self._watch(receive))
        alive = KeepAlive(self.writer, self.keepalive) if self.keepalive > 0 else None
        watch = StallWatch(self.writer, self.stall, self._stalled) if self.stall > 0 else None
        try:
            # The job's task (just created) sends the request to its worker first; the status line is
            # not what the client waits for, the first token is.
            await asyncio.sleep(0)
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            await self.writer.serve(send)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self.writer.abandoned or task is None:
                raise
            task.uncancel()  # our own cancel of a blocked write: the response just ends (see Writer.abandon)
        finally:
            watcher.cancel()
            if alive is not None:
                alive.stop()
            if watch is not None:
                watch.stop()
            self.on_end()

    def _stalled(self) -> None:
        if self.on_stall is not None:
            self.on_stall()  # the job ends first, by the usual rules for a client that left
        self.writer.abandon()

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.on_disconnect()
                return
