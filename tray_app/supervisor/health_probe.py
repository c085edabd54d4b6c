"""One look at a worker's /health, and the one-token warm-up once a starting worker first says ready.

The lean loopback client, not httpx: this runs every `health_interval` for as long as the service does, and
httpx cost about 2 ms of CPU per check, most of an idle service's CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from tray_app.engine.loopback_http import ConnectionFailed, ConnectTimeout, Response, UpstreamPool
from tray_app.supervisor.messages import HealthResult

WARM_UP_SECONDS = 60.0  # the first token after load (a cold page cache or a slow device can take a while)


class Prober:
    """Runs probes in the background and hands each answer to `report` (the owner's inbox)."""

    def __init__(self, timeout: float, report: Callable[[HealthResult], None]) -> None:
        self._timeout = timeout
        self._report = report
        self._pool: UpstreamPool | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # kept until done: never collected mid-flight

    def start(
        self, generation: int, port: int, headers: dict[str, str], *, warm_up: bool, embeddings: bool
    ) -> None:
        task = asyncio.get_running_loop().create_task(
            self._probe(generation, port, headers, warm_up, embeddings)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _probe(
        self, generation: int, port: int, headers: dict[str, str], warm_up: bool, embeddings: bool
    ) -> None:
        if self._pool is None:
            self._pool = UpstreamPool(connect_timeout=self._timeout)
        answer = await probe(
            self._pool,
            generation,
            port,
            headers,
            timeout=self._timeout,
            warm_up=warm_up,
            embeddings=embeddings,
        )
        self._report(answer)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._pool is not None:
            await self._pool.aclose()
            self._pool = None


async def probe(
    pool: UpstreamPool,
    generation: int,
    port: int,
    headers: dict[str, str],
    *,
    timeout: float,
    warm_up: bool,
    embeddings: bool,
) -> HealthResult:
    response: Response | None = None
    try:
        async with asyncio.timeout(timeout):
            response = await pool.send("GET", f"http://127.0.0.1:{port}/health", b"", {})
            raw = await response.read()
        if response.status == 503:
            return HealthResult(generation, {"state": "loading"})  # llama-server: "Loading model"
        if response.status != 200:
            return HealthResult(generation, None, error=f"HTTP {response.status}")
        body = json.loads(raw)
        if warm_up:
            async with asyncio.timeout(WARM_UP_SECONDS):
                await _warm_up(pool, port, headers, embeddings)
        return HealthResult(generation, {**body, "state": "ready"})
    except (TimeoutError, ConnectTimeout):
        if response is not None:
            response.abort()  # a stopped worker never answers: its connection must not linger
        return HealthResult(generation, None, error="timed out", timed_out=True)
    except (ConnectionFailed, ValueError) as error:
        return HealthResult(generation, None, error=f"{type(error).__name__}: {error}")


async def _warm_up(pool: UpstreamPool, port: int, headers: dict[str, str], embeddings: bool) -> None:
    """One token (one embedding) through the whole path, so the first real request finds everything
    paged in."""
    request: dict[str, Any]
    if embeddings:
        path, request = "/v1/embeddings", {"input": "Hi"}
    else:
        path, request = "/completion", {"prompt": "Hi", "n_predict": 1, "cache_prompt": False}
    sent = await pool.send(
        "POST",
        f"http://127.0.0.1:{port}{path}",
        json.dumps(request).encode(),
        {"Content-Type": "application/json", **headers},
    )
    await sent.read()
    if sent.status != 200:
        raise ConnectionFailed(f"warm-up answered HTTP {sent.status}")
