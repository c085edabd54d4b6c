"""The response of a streamed request: server-sent events written as the job produces them.

Leaner than Starlette's StreamingResponse, which starts a task group for every response: here the job's
own task fills a `Pieces` channel and the response writes whatever is waiting in one write (one piece,
except when the client reads slower than the tokens come). A client that goes away ends the job.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from starlette.types import Receive, Scope, Send

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Pieces:
    """A one-producer, one-consumer channel of byte strings that ends with `close()`."""

    def __init__(self) -> None:
        self._pending: deque[bytes] = deque()
        self._ready = asyncio.Event()
        self.closed = False

    def put(self, piece: bytes) -> None:
        self._pending.append(piece)
        self._ready.set()

    def close(self) -> None:
        self.closed = True
        self._ready.set()

    async def take(self) -> tuple[bytes, bool]:
        """Everything waiting (joined), and whether the channel has ended."""
        while not self._pending and not self.closed:
            self._ready.clear()
            await self._ready.wait()
        data = b"".join(self._pending)
        self._pending.clear()
        return data, self.closed


class EventStreamResponse:
    """An ASGI response: status 200, `text/event-stream`, the pieces as they come; `on_disconnect` runs if
    the client goes away first, `on_end` always runs once the response is over."""

    def __init__(
        self,
        pieces: Pieces,
        headers: dict[str, str],
        on_disconnect: Callable[[], None],
        on_end: Callable[[], None],
    ) -> None:
        self.pieces = pieces
        self.headers = [(b"content-type", b"text/event-stream; charset=utf-8")] + [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in {**SSE_HEADERS, **headers}.items()
        ]
        self.on_disconnect = on_disconnect
        self.on_end = on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.create_task(self._watch(receive))
        try:
            # The job's task (just created) sends the request to its worker first; the status line is
            # not what the client waits for, the first token is.
            await asyncio.sleep(0)
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            ended = False
            while not ended:
                data, ended = await self.pieces.take()
                await send({"type": "http.response.body", "body": data, "more_body": not ended})
        finally:
            watcher.cancel()
            self.on_end()

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.on_disconnect()
                return
