"""The response of a streamed request: server-sent events written as the job produces them.

Leaner than Starlette's StreamingResponse, which starts a task group for every response: here the job's
own task fills a `Pieces` channel and the response writes whatever is waiting in one write (one piece,
except when the client reads slower than the tokens come). A client that goes away ends the job.

The status line waits for the first event (up to FIRST_EVENT_WAIT): a request that fails before it produced
anything (a worker refusing it, no worker to run it) then gets its real status and a JSON error, as the
OpenAI API answers, instead of a 200 and an error event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

from starlette.types import Receive, Scope, Send

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
FIRST_EVENT_WAIT = 2.0  # seconds; a stream still waiting (queued, prompt reading) gets its headers then
# An early answer instead of the stream: status, headers, JSON body.
EarlyAnswer = tuple[int, dict[str, str], bytes]


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

    async def wait(self, timeout: float) -> None:
        """Until something (or the end) is waiting, or `timeout` seconds have passed."""
        if self._pending or self.closed:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not self._pending and not self.closed:
                    self._ready.clear()
                    await self._ready.wait()

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
    the client goes away first, `on_end` always runs once the response is over. When the pieces end before
    the status line went out, `early_answer` may replace the stream (it gets everything they held)."""

    def __init__(
        self,
        pieces: Pieces,
        headers: dict[str, str],
        on_disconnect: Callable[[], None],
        on_end: Callable[[], None],
        early_answer: Callable[[bytes], EarlyAnswer | None] | None = None,
    ) -> None:
        self.pieces = pieces
        self.headers = [(b"content-type", b"text/event-stream; charset=utf-8")] + [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in {**SSE_HEADERS, **headers}.items()
        ]
        self.on_disconnect = on_disconnect
        self.on_end = on_end
        self.early_answer = early_answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.create_task(self._watch(receive))
        try:
            await self.pieces.wait(FIRST_EVENT_WAIT)
            data, ended = await self.pieces.take() if self.pieces.closed else (b"", False)
            answer = self.early_answer(data) if ended and self.early_answer is not None else None
            if answer is not None:
                await self._send_answer(send, *answer)
                return
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            while not ended:
                more, ended = await self.pieces.take()
                data += more
                await send({"type": "http.response.body", "body": data, "more_body": not ended})
                data = b""
            if data:
                await send({"type": "http.response.body", "body": data, "more_body": False})
        finally:
            watcher.cancel()
            self.on_end()

    @staticmethod
    async def _send_answer(send: Send, status: int, headers: dict[str, str], body: bytes) -> None:
        raw_headers = [(b"content-type", b"application/json")] + [
            (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()
        ]
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": body})

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.on_disconnect()
                return
