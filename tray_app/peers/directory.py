"""Every configured peer, probed by one task: all at once at start, then each when it is due."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from tray_app.config.peers import PeerConfig
from tray_app.peers.peer import Peer, ProbeSchedule, new_client

log = logging.getLogger(__name__)


class Peers:
    """The `[[peers]]` with a URL as `Peer`s, in config order, and the task that keeps their states."""

    def __init__(
        self,
        configs: list[PeerConfig],
        *,
        schedule: ProbeSchedule | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # A peer with `rpc` alone is a device for the GPU worker (budget.remote), not a server to ask.
        self._peers = [Peer(config, schedule=schedule, clock=clock) for config in configs if config.url]
        self._by_role = {peer.role: peer for peer in self._peers}
        self._wake = asyncio.Event()  # a peer's next probe moved earlier (a failed request)
        self._closed = False
        self._ended: asyncio.Event | None = None  # set when `run`, once started, has closed its client
        for peer in self._peers:
            peer.on_schedule_change = self._wake.set

    def __iter__(self) -> Iterator[Peer]:
        return iter(self._peers)

    def __len__(self) -> int:
        return len(self._peers)

    def all(self) -> list[Peer]:
        """Every peer, in config order."""
        return list(self._peers)

    def get(self, role: str) -> Peer | None:
        return self._by_role.get(role)

    def roles(self) -> list[str]:
        return [peer.role for peer in self._peers]

    def ready_for(self, model: str, main_model: str) -> Peer | None:
        """The ready peer serving `model` that is asked first: the lowest priority, then config order."""
        ready = [peer for peer in self._peers if peer.state == "ready" and peer.serves(model, main_model)]
        return min(ready, key=lambda peer: peer.priority, default=None)  # min keeps the first of equals

    async def run(self) -> None:
        """Probe the peers until `close` (or cancellation), with one client shared by them all."""
        if self._closed or not self._peers:
            return
        ended = self._ended = asyncio.Event()
        try:
            async with new_client() as client:
                try:
                    self._share(client)
                    while not self._closed:
                        self._wake.clear()
                        await self._probe_those_due(client)
                        wait = min(peer.seconds_to_next_probe() for peer in self._peers)
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._wake.wait(), timeout=wait)
                finally:
                    self._share(None)  # before the client closes: a job's probe then makes its own
        finally:
            ended.set()

    def _share(self, client: httpx.AsyncClient | None) -> None:
        for peer in self._peers:
            peer.use_client(client)

    async def _probe_those_due(self, client: httpx.AsyncClient) -> None:
        due = [peer for peer in self._peers if peer.probe_due()]
        results = await asyncio.gather(*(peer.probe_if_due(client) for peer in due), return_exceptions=True)
        for peer, result in zip(due, results, strict=True):
            if isinstance(result, Exception):  # a bug, not the peer's failure: the others go on
                log.error("probing peer %s failed", peer.name, exc_info=result)

    async def close(self) -> None:
        """End `run` and wait until its client is closed (at once when it is not running, or was cancelled);
        the peers keep their last states, and `ensure_ready` still probes with a client of its own."""
        self._closed = True
        self._wake.set()
        if self._ended is not None:
            await self._ended.wait()

    def status(self) -> list[dict[str, Any]]:
        return [peer.status() for peer in self._peers]
