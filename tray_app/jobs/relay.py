"""The upstream side: always streams from a worker (kept-alive connections, see loopback_http), so every
token is seen as it arrives and closing the stream cancels the generation at once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from tray_app.engine.loopback_http import (
    ConnectionFailed,
    ConnectTimeout,
    Response,
    Sent,
    Stalled,
    UpstreamPool,
)

# What llama-server sends every active slot, word for word, when llama_decode fails: -2 (an allocation
# failed) or -3 (the compute failed), and 1 at a batch of one token (no room left in the KV cache). Nothing of
# the failed batch was kept: a replay elsewhere is safe.
DECODE_FAILURES = ("Compute error.", "Context size has been exceeded.")


@dataclass
class Chunk:
    raw: str  # the `data:` payload exactly as the worker sent it
    obj: dict[str, Any]
    sent_at: float  # time.perf_counter() as the request was written to the worker
    received_at: float  # ... as the bytes that completed this chunk arrived


class UpstreamError(Exception):
    """An attempt on a worker failed. `kind` is a supervisor failure kind, or `client_error` when the request
    itself is wrong (a 4xx from the worker: no failover, the client gets it)."""

    def __init__(
        self, kind: str, message: str, status: int | None = None, body: dict[str, Any] | None = None
    ):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.body = body

    @property
    def client_error(self) -> bool:
        return self.kind == "client_error"


def classify_error(status: int | None, message: str, error_type: str = "") -> str:
    """The failure kind of an error the worker answered with (an error status, or an error event).

    Structured signals only: the HTTP status and llama-server's own fixed message for a failed decode. A
    worker that answered anything else is up and refused this request (llama-server answers a request it
    cannot take, a bad tool list or a template that cannot render it, with 400 or 500): its text may quote
    the request, so it is never searched for words like "out of memory"."""
    if status is not None and 400 <= status < 500:
        return "client_error"
    if message.strip() in DECODE_FAILURES:
        return "oom_decode"
    if status == 503 or error_type == "unavailable_error":
        return "exited"  # loading or shutting down: the worker is not serving
    return "client_error"


def _error_message(body: Any, fallback: str) -> str:
    if isinstance(body, dict):
        error = body.get("error", body.get("detail"))
        if isinstance(error, dict):
            return str(error.get("message", error))
        if error is not None:
            return str(error)
    return fallback


# One server-sent event's line at most: a token's chunk is well under a kilobyte, a tool call's arguments a
# few; a peer (another machine's server) that sends more, or never ends its line, is cut off, not buffered.
MAX_EVENT_BYTES = 4 * 1024 * 1024


class Relay:
    """Streams from the workers over `UpstreamPool` (the hot path)."""

    def __init__(self, connect_timeout: float = 5.0) -> None:
        self._pool = UpstreamPool(connect_timeout, spare_for_streams=True)

    async def aclose(self) -> None:
        await self._pool.aclose()

    def dispatch(self, url: str, body: bytes, headers: dict[str, str]) -> Sent:
        """Write the request now if a connection to the worker is idle; `stream(sent=...)` reads its answer
        (connecting first if none was), or `Sent.abort()` drops it."""
        return self._pool.start("POST", url, body, _json(headers))

    async def stream(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        first_timeout: float,
        chunk_timeout: float,
        sent: Sent | None = None,
    ) -> AsyncGenerator[Chunk, None]:
        """The worker's SSE chunks, parsed. Raises UpstreamError when the attempt fails in any way: an error
        status, an error event, a dropped connection, a stall past the timeout, or an end without [DONE].
        `first_timeout` covers the wait for the first event and each wait between the prompt-progress
        events llama-server sends while it reads the prompt; `chunk_timeout` each event after that.
        `sent`: this request, already written by `dispatch`."""
        loop = asyncio.get_running_loop()
        timeout = first_timeout
        deadline = loop.time() + timeout
        response: Response | None = None
        if sent is None:
            sent = self.dispatch(url, body, headers)
        try:
            response = await self._answer(sent, deadline)
            # The event stream's lines, read here rather than through nested generators: every token
            # passes this loop, and each generator level would cost it a step on its way to the client.
            pending = b""
            ended = False
            while not ended:
                received = await response.next_chunk()
                ended = received is None
                pending += b"\n" if received is None else received  # the end also ends a last line
                *lines, pending = _lines(pending)
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue  # blank lines (event ends) and comments (": ping")
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        response.release()  # the connection is reused once the response's end arrives
                        response = None
                        return
                    text, obj, progress = _event(data)
                    timeout = first_timeout if progress else chunk_timeout
                    response.set_deadline(loop.time() + timeout)
                    if not progress:
                        yield Chunk(text, obj, response.sent_at, response.received_at)
            raise UpstreamError("exited", "the worker ended the stream without [DONE]")
        except (TimeoutError, Stalled, ConnectionFailed) as error:
            raise _transport_error(error, f"no output from the worker for {timeout:.1f}s") from None
        finally:
            if response is not None:
                response.abort()  # failed, cancelled or closed early: the worker must see the client go

    async def _answer(self, sent: Sent, deadline: float) -> Response:
        """The worker's answer to `sent` once its status is in, by `deadline`; UpstreamError (the answer
        dropped) when the status is not 200."""
        async with asyncio.timeout_at(deadline):
            response = await self._pool.answer(sent)
            if response.status != 200:
                try:
                    raise _status_error(response.status, await response.read())
                finally:
                    response.abort()
        # From the last data line: keep-alive comments (": ping") must not hide a stall.
        response.set_deadline(deadline)
        return response

    def prepare_next(self, url: str) -> None:
        """A stream from `url` delivered its first output: connect for the next request to that worker now
        (llama-server closes the connection when this stream ends), off any first token's path."""
        self._pool.prepare(self._pool.address_of(url))

    async def post(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> bytes:
        """A whole answer (embeddings: nothing to stream). Fails as `stream` does, with an UpstreamError."""
        response: Response | None = None
        try:
            async with asyncio.timeout(timeout):
                response = await self._pool.send("POST", url, body, _json(headers))
                data = await response.read()
        except (TimeoutError, ConnectionFailed) as error:
            raise _transport_error(error, f"no answer from the worker in {timeout:.1f}s") from None
        finally:
            if response is not None:
                response.release()  # back to the pool if it ended; closed otherwise
        if response.status != 200:
            raise _status_error(response.status, data)
        return data


def _json(headers: dict[str, str]) -> dict[str, str]:
    return {"Content-Type": "application/json", **headers}


def _lines(received: bytes) -> list[bytes]:
    """The whole lines received so far, then the unfinished rest (bounded: MAX_EVENT_BYTES)."""
    lines = received.split(b"\n")
    if len(lines[-1]) > MAX_EVENT_BYTES:
        raise UpstreamError("exited", f"the worker sent an event over {MAX_EVENT_BYTES} bytes")
    return lines


def _event(data: bytes) -> tuple[str, Any, bool]:
    """A `data:` line's payload: its text, the JSON parsed from it, and whether it is prompt progress.
    UpstreamError for a malformed payload or an error event.

    Prompt progress: the worker is reading the prompt (one event per batch, see Job.upstream_body), so it is
    alive however long the prompt takes. Nothing in it for the client (a chat's role is announced again with
    the first token)."""
    try:
        text = data.decode()  # once: the chunk goes on as this text, parsed from it
        obj = json.loads(text)
    except ValueError:  # UnicodeDecodeError included
        raise UpstreamError("exited", f"the worker sent a malformed chunk: {data[:200]!r}") from None
    if isinstance(obj, dict) and "error" in obj:
        raise _answered_error(None, _error_message(obj, text), obj)
    return text, obj, isinstance(obj, dict) and "prompt_progress" in obj


def _transport_error(error: Exception, silence: str) -> UpstreamError:
    """A request that got no (complete) answer: a silent worker is hung, an unreachable one has exited."""
    if isinstance(error, ConnectTimeout):  # before ConnectionFailed: it is one
        return UpstreamError("hung", f"worker timed out: {error}")
    if isinstance(error, ConnectionFailed):
        return UpstreamError("exited", f"connection to the worker failed: {error}")
    return UpstreamError("hung", silence)  # a timeout, or a stall


def _status_error(status: int, raw: bytes) -> UpstreamError:
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    return _answered_error(status, _error_message(parsed, raw.decode(errors="replace")[:500]), parsed)


def _answered_error(status: int | None, message: str, body: Any) -> UpstreamError:
    error = body.get("error") if isinstance(body, dict) else None
    error_type = str(error.get("type", "")) if isinstance(error, dict) else ""
    return UpstreamError(classify_error(status, message, error_type), message, status, body)
