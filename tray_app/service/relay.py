"""The upstream side: one shared httpx client (kept-alive connections) that always streams from a worker,
so every token is seen as it arrives and closing the stream cancels the generation at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

# Messages llama.cpp (and llama-cpp-python around it) produce when memory runs out at decode time.
_OOM_SIGNATURES = (
    "llama_decode returned -2",
    "llama_decode returned -3",
    "out of memory",
    "failed to allocate",
    "cudamalloc",
)


# How long to wait for the end of a response after its [DONE]: reading it lets the connection go back to
# the pool (a response left unread closes it, and the next attempt would pay for a new connection).
DRAIN_SECONDS = 1.0


async def _drain(lines: AsyncIterator[str], deadline: float) -> None:
    with contextlib.suppress(TimeoutError, StopAsyncIteration, httpx.HTTPError):
        async with asyncio.timeout_at(deadline):
            async for _ in lines:
                pass


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
    if status is not None and 400 <= status < 500:
        return "client_error"
    if "validation error" in message.lower():
        # llama-cpp-python answers a request its schema rejects with a 500; it is still the request's fault.
        return "client_error"
    lowered = message.lower()
    if any(signature in lowered for signature in _OOM_SIGNATURES):
        return "oom_decode"
    return "crash_abort" if "abort" in lowered else "exited"


def _error_message(body: Any, fallback: str) -> str:
    if isinstance(body, dict):
        error = body.get("error", body.get("detail"))
        if isinstance(error, dict):
            return str(error.get("message", error))
        if error is not None:
            return str(error)
    return fallback


class Relay:
    def __init__(
        self, connect_timeout: float = 5.0, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=connect_timeout, read=None, write=30.0, pool=30.0),
            limits=httpx.Limits(max_connections=128, max_keepalive_connections=64),
            trust_env=False,  # a proxy from the environment must never sit between us and 127.0.0.1
            transport=transport,
        )

    async def aclose(self) -> None:
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
        status, an error event, a dropped connection, a stall past the timeout, or an end without [DONE]."""
        try:
            async with self._client.stream(
                "POST", url, content=body, headers={"Content-Type": "application/json", **headers}
            ) as response:
                if response.status_code != 200:
                    raw = await response.aread()
                    try:
                        parsed = json.loads(raw)
                    except ValueError:
                        parsed = None
                    message = _error_message(parsed, raw.decode(errors="replace")[:500])
                    raise UpstreamError(
                        classify_error(response.status_code, message), message, response.status_code, parsed
                    )
                lines = response.aiter_lines()
                loop = asyncio.get_running_loop()
                timeout = first_timeout
                # Measured from the last data line: keep-alive comments (": ping") must not hide a stall.
                deadline = loop.time() + timeout
                while True:
                    try:
                        async with asyncio.timeout_at(deadline):
                            line = await anext(lines)
                    except StopAsyncIteration:
                        raise UpstreamError("exited", "the worker ended the stream without [DONE]") from None
                    except TimeoutError:
                        raise UpstreamError("hung", f"no output from the worker for {timeout:.1f}s") from None
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        await _drain(lines, loop.time() + DRAIN_SECONDS)
                        return
                    try:
                        obj = json.loads(data)
                    except ValueError:
                        raise UpstreamError(
                            "exited", f"the worker sent a malformed chunk: {data[:200]}"
                        ) from None
                    if isinstance(obj, dict) and "error" in obj:
                        message = _error_message(obj, data)
                        raise UpstreamError(classify_error(None, message), message, None, obj)
                    timeout = chunk_timeout
                    yield Chunk(data, obj)
                    deadline = loop.time() + timeout
        except httpx.TimeoutException as error:
            raise UpstreamError("hung", f"worker timed out: {error!r}") from None
        except httpx.TransportError as error:
            raise UpstreamError("exited", f"connection to the worker failed: {error!r}") from None
