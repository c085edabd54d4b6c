"""The RPC boxes of the running GPU worker, looked at every WATCH_SECONDS. llama-server notices a lost RPC
server only when it next computes there, so a box gone while the worker is idle would cost the next request
a failover: the worker is restarted now instead, and its start plans without the box (gpu_side's gate).

Read, not probed: rpc-server serves one client at a time with a backlog of one (ggml-rpc.cpp,
ggml_backend_rpc_start_server), so a connection of ours would wait behind the worker's and the next one
would not be answered at all. What is read is the worker's own connection to the box: an rpc-server that
ended closed it (the worker's side is then CLOSE_WAIT, or gone). A box that lost power says nothing until
the worker sends to it; that request fails over as from any crashed worker."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Mapping
from typing import Protocol

import psutil

from tray_app.config.peers import split_endpoint
from tray_app.engine.profile import WorkerProfile

log = logging.getLogger(__name__)

WATCH_SECONDS = 10.0


class RestartableWorker(Protocol):
    @property
    def state(self) -> str: ...

    @property
    def running_profile(self) -> WorkerProfile: ...

    @property
    def pid(self) -> int | None: ...

    async def restart(self, reason: str) -> bool: ...


def connected(pid: int, endpoint: str) -> bool:
    """Whether process `pid` holds an established TCP connection to `endpoint` (host:port)."""
    try:
        host, port = split_endpoint(endpoint)
        addresses = {info[4][0] for info in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)}
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except (OSError, ValueError, psutil.Error):
        return False
    return any(
        c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port == port and c.raddr.ip in addresses
        for c in connections
    )


class RpcWatch:
    def __init__(
        self,
        workers: Callable[[], Mapping[str, RestartableWorker]],
        in_flight: Callable[[str], int],
        holds: Callable[[int, str], bool] = connected,
    ) -> None:
        self._workers = workers
        self._in_flight = in_flight
        self._holds = holds

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
        pid = worker.pid if worker is not None else None
        if worker is None or pid is None or worker.state != "ready" or not worker.running_profile.rpc:
            return None
        endpoints = worker.running_profile.rpc
        gone = [e for e in endpoints if not await asyncio.to_thread(self._holds, pid, e)]
        if not gone or self._in_flight("gpu"):
            return None  # a request in flight there fails over as from any crashed worker
        reason = (
            f"RPC box {', '.join(gone)} is gone (it closed the GPU worker's connection): "
            "the GPU worker starts again without it"
        )
        log.warning(reason)
        await worker.restart(reason)
        return reason
