"""The upstream side: always streams from a worker (kept-alive connections, see loopback_http), so every
token is seen as it arrives and closing the stream cancels the generation at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from tray_app.grammar_check import INVALID_GRAMMAR
from tray_app.loopback_http import (
    ConnectionFailed,
    ConnectTimeout,
    Response,
    Stalled,
    UpstreamPool,
)

# Messages llama.cpp (and llama-cpp-python around it) produce when memory runs out at decode time.
_OOM_SIGNATURES = (
    "llama_decode returned -2",
    "llama_decode returned -3",
    "out of memory",
    "failed to allocate",
    "cudamalloc",
    "memoryerror",  # Python's own, named by the worker when it has no message
    "unable to allocate",  # numpy's MemoryError
)
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
# Errors that say the model or its backend failed, not the request.
_WORKER_FAULT_SIGNATURES = (
    "llama_decode returned",
    "failed to decode",
    "ggml",
    "cuda",
    "metal",
    "vulkan",
    "vk::",
    "device lost",
)


@dataclass
class Chunk:
    raw: str  # the `data:` payload exactly as the worker sent it
    obj: dict[str, Any]


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


def classify_error(status: int | None, message: str) -> str:
    """The failure kind of an error the worker answered with (an error status, or an error event)."""
    if status is not None and 400 <= status < 500:
        return "client_error"
    lowered = message.lower()
    if "validation error" in lowered or INVALID_GRAMMAR in lowered:
        # llama-cpp-python answers a request its schema rejects with a 500; it is still the request's fault.
        return "client_error"
    # What the request itself said comes back quoted ("Tool with name 'x' not found"); a tool named "CUDA
    # error" must not make its refusal look like a failing GPU.
    lowered = _QUOTED.sub("''", lowered)
    if any(signature in lowered for signature in _OOM_SIGNATURES):
        return "oom_decode"
    if "abort" in lowered:
        return "crash_abort"
    if (status is not None and status != 500) or any(s in lowered for s in _WORKER_FAULT_SIGNATURES):
        return "exited"  # not ready (503), or the model or its backend failed
    # The worker is up and answered: llama-cpp-python turns what the request made it raise (an unknown tool,
    # a template that cannot take a message) into a 500. The CPU worker runs the same code and would answer
    # the same, so this is neither a reason to restart a worker nor to fail over.
    return "client_error"


def _error_message(body: Any, fallback: str) -> str:
    if isinstance(body, dict):
        error = body.get("error", body.get("detail"))
        if isinstance(error, dict):
            return str(error.get("message", error))
        if error is not None:
            return str(error)
    return fallback


class Relay:
    """Streams from the workers over `UpstreamPool` (the hot path); `get_json` (control calls) uses httpx."""

    def __init__(self, connect_timeout: float = 5.0) -> None:
        self._pool = UpstreamPool(connect_timeout)
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=connect_timeout, read=None, write=30.0, pool=30.0),
            trust_env=False,  # a proxy from the environment must never sit between us and 127.0.0.1
        )

    async def aclose(self) -> None:
        await self._pool.aclose()
        await self._client.aclose()

    async def get_json(self, url: str, timeout: float = 5.0) -> Any:
        response = await self._client.get(url, timeout=timeout)
        response.raise_for_status()
        return response.json()

    async def stream(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        first_timeout: float,
        chunk_timeout: float,
    ) -> AsyncGenerator[Chunk, None]:
        """The worker's SSE chunks, parsed. Raises UpstreamError when the attempt fails in any way: an error
        status, an error event, a dropped connection, a stall past the timeout, or an end without [DONE].
        `first_timeout` covers everything up to the first event (llama-cpp-python answers a stream only once
        the prompt is read); `chunk_timeout` each event after that."""
        loop = asyncio.get_running_loop()
        timeout = first_timeout
        deadline = loop.time() + timeout
        response: Response | None = None
        try:
            async with asyncio.timeout_at(deadline):
                response = await self._pool.send(
                    "POST", url, body, {"Content-Type": "application/json", **headers}
                )
                if response.status != 200:
                    raise _status_error(response.status, await response.read())
            # From the last data line: keep-alive comments (": ping") must not hide a stall.
            response.set_deadline(deadline)
            async with contextlib.aclosing(_sse_lines(response.chunks())) as lines:
                while True:
                    try:
                        line = await anext(lines)
                    except StopAsyncIteration:
                        raise UpstreamError("exited", "the worker ended the stream without [DONE]") from None
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        response.release()  # the connection is reused once the response's end arrives
                        response = None
                        return
                    try:
                        obj = json.loads(data)
                    except ValueError:
                        raise UpstreamError(
                            "exited", f"the worker sent a malformed chunk: {data[:200]!r}"
                        ) from None
                    if isinstance(obj, dict) and "error" in obj:
                        raise _answered_error(None, _error_message(obj, data.decode(errors="replace")), obj)
                    timeout = chunk_timeout
                    response.set_deadline(loop.time() + timeout)
                    yield Chunk(data.decode(), obj)
        except (TimeoutError, Stalled):
            raise UpstreamError("hung", f"no output from the worker for {timeout:.1f}s") from None
        except ConnectTimeout as error:
            raise UpstreamError("hung", f"worker timed out: {error}") from None
        except ConnectionFailed as error:
            raise UpstreamError("exited", f"connection to the worker failed: {error}") from None
        finally:
            if response is not None:
                response.abort()  # failed, cancelled or closed early: the worker must see the client go


def _status_error(status: int, raw: bytes) -> UpstreamError:
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    return _answered_error(status, _error_message(parsed, raw.decode(errors="replace")[:500]), parsed)


def _answered_error(status: int | None, message: str, body: Any) -> UpstreamError:
    kind = classify_error(status, message)
    if kind == "client_error":
        message = readable_validation_error(message)
    return UpstreamError(kind, message, status, body)


# One error in the text llama-cpp-python makes of pydantic's errors: "{'type': ..., 'loc': ('body',
# 'top_k'), 'msg': 'Input should be ...', ...}", followed by a stack trace.
_VALIDATION_ITEM = re.compile(r"""'loc': \(([^)]*)\), 'msg': (['"])(.*?)\2""")
_TRACE = re.compile(r"\s*File \"")


def readable_validation_error(message: str) -> str:
    """The fields and complaints of a llama-cpp-python validation error, without its stack trace (which
    names files on this machine); other messages only lose a trace."""
    items = _VALIDATION_ITEM.findall(message)
    if not items:
        return _TRACE.split(message, maxsplit=1)[0].strip()
    complaints = []
    for location, _quote, complaint in items:
        names = [name.strip().strip("'\"") for name in location.split(",")]
        field = ".".join(name for name in names if name and name != "body")
        complaints.append(f"'{field}': {complaint}" if field else complaint)
    return "the model server refused the request: " + "; ".join(complaints)


async def _sse_lines(chunks: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    """The lines of an event stream, without their line ends, however the body was cut into chunks."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line := line.rstrip(b"\r"):  # blank lines only separate events
                yield line
    if pending:
        yield pending.rstrip(b"\r")
