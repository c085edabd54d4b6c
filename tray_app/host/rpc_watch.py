"""The RPC boxes of the running GPU worker, looked at every WATCH_SECONDS. llama-server notices a lost RPC
server only when it next computes there, so a box gone while the worker is idle would cost the next request
a failover: the worker is restarted now instead, and its start plans without the box (gpu_side's gate)."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Mapping
from typing import Protocol

from tray_app.config.peers import split_endpoint
from tray_app.engine.profile import WorkerProfile

log = logging.getLogger(__name__)

WATCH_SECONDS = 10.0
CONNECT_TIMEOUT_S = 3.0


class RestartableWorker(Protocol):
    @property
    def state(self) -> str: ...

    @property
    def running_profile(self) -> WorkerProfile: ...

    async def restart(self, reason: str) -> bool: ...


def answers(endpoint: str) -> bool:
    """Whether something accepts a connection at `endpoint` (a TCP connect, closed at once)."""
    try:
        host, port = split_endpoint(endpoint)
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError):
        return False
    return True


class RpcWatch:
    def __init__(
        self,
        workers: Callable[[], Mapping[str, RestartableWorker]],
        in_flight: Callable[[str], int],
        answering: Callable[[str], bool] = answers,
    ) -> None:
        self._workers = workers
        self._in_flight = in_flight
        self._answering = answering

    async def run(self) -> None:
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            try:
                await self.check()
            except Exception:  # a bug here must not end the watch
                log.exception("the RPC boxes' check failed")

    async def check(self) -> str | None:
        """Restart the idle GPU worker when one of its boxes does not answer; why, or None."""
        worker = self._workers().get("gpu")
        if worker is None or worker.state != "ready" or not worker.running_profile.rpc:
            return None
        endpoints = worker.running_profile.rpc
        gone = [e for e in endpoints if not await asyncio.to_thread(self._answering, e)]
        if not gone or self._in_flight("gpu"):
            return None  # a request in flight there fails over as from any crashed worker
        reason = f"RPC box {', '.join(gone)} does not answer: the GPU worker starts again without it"
        log.warning(reason)
        await worker.restart(reason)
        return reason
