"""One peer: another machine's server, seen by the job engine as a worker (it satisfies
`tray_app.jobs.worker_port.Worker` by its shape; this package does not import the engine).

There is no process here to start or restart: a peer is ready when its last probe said so, down after a
failed probe or a failed request, and asked again after a backoff (2, 4, 8, ... up to 120 s); a ready peer
is asked every 30 s. The local admin token is never sent: a peer gets its own api_key, nothing else."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

from tray_app.config.peers import PeerConfig
from tray_app.contract.roles import PEER_ROLE_PREFIX
from tray_app.peers.health import HealthAnswer, ask_health

PeerState = Literal["unknown", "ready", "down"]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeSchedule:
    """When a peer is asked how it is, and how long one asking may take (tests shorten these)."""

    timeout: float = 3.0  # a probe in all: the name's resolution, the connection and the answer
    ready_every: float = 30.0
    backoff_base: float = 2.0  # the first wait after a failure; doubled at each failure in a row
    backoff_max: float = 120.0

    def backoff(self, failures: int) -> float:
        """The wait after `failures` failures in a row (at least one)."""
        return min(self.backoff_base * 2 ** min(max(failures - 1, 0), 32), self.backoff_max)


class Peer:
    """One `[[peers]]` entry, as a worker: its state, where to send a request and with which headers."""

    def __init__(
        self,
        config: PeerConfig,
        *,
        schedule: ProbeSchedule | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = config.name
        self.role = f"{PEER_ROLE_PREFIX}{config.name}"
        self.priority = config.priority
        self.slots = config.slots
        self.models: tuple[str, ...] = tuple(config.models)
        self.url = config.url.rstrip("/")
        self._api_key = config.api_key
        self._schedule = schedule or ProbeSchedule()
        self._clock = clock
        self._state: PeerState = "unknown"
        self._gpu_ready: bool | None = None
        self._last_failure: dict[str, Any] | None = None
        self._failures = 0  # in a row, for the backoff
        self._next_probe_at = clock()  # never probed: due now
        self._probing = asyncio.Lock()  # one probe at a time: jobs waiting on a down peer share it
        self._client: httpx.AsyncClient | None = None
        # Told when the next probe moves (a failed request): the directory's loop then wakes earlier.
        self.on_schedule_change: Callable[[], None] | None = None

    # The Worker protocol.

    @property
    def state(self) -> PeerState:
        return self._state

    @property
    def base_url(self) -> str | None:
        return self.url if self._state == "ready" else None

    @property
    def pid(self) -> int | None:
        return None  # no process here

    @property
    def last_failure(self) -> dict[str, Any] | None:
        """The latest failure: kind, message and when (wall clock)."""
        return self._last_failure

    @property
    def request_headers(self) -> dict[str, str]:
        """The peer's own key, when it has one; never anything else (not the local admin token)."""
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    async def ensure_ready(self, timeout: float) -> bool:
        """True when ready; when down (or never probed) and a probe is due, the answer of one made now
        within `timeout`; otherwise False at once: a job does not wait out a down peer's backoff."""
        if self._state == "ready":
            return True
        if not self.probe_due():
            return False
        try:
            async with asyncio.timeout(timeout):
                await self.probe_if_due(self._client)
        except TimeoutError:
            pass
        return self._state == "ready"

    def mark_unhealthy(self, reason: str, kind: str, *, pid: int | None = None) -> None:
        """A request to this peer failed: down now, asked again after the backoff. Several jobs that saw
        one incident report it each; only the first pushes the backoff on."""
        if self._state == "down":
            self._last_failure = self._failure(kind, reason)
            return
        self._fail(kind, reason)

    async def failure_of(self, pid: int, timeout: float) -> dict[str, Any] | None:
        return None  # no process here whose end could be classified

    def note_tokens(self, count: int) -> None:
        return None  # no faults to arm on another machine

    # Probes.

    def serves(self, model: str, main_model: str) -> bool:
        """Whether this peer is asked for `model`: one of its models, or the main one when it lists none."""
        return model in self.models if self.models else model == main_model

    @property
    def gpu_ready(self) -> bool | None:
        """From the last probe: a Failsoft peer's GPU worker ready (True) or not (False); None when the
        server does not say."""
        return self._gpu_ready

    def probe_due(self) -> bool:
        return self._clock() >= self._next_probe_at

    def seconds_to_next_probe(self) -> float:
        return max(self._next_probe_at - self._clock(), 0.0)

    def use_client(self, client: httpx.AsyncClient | None) -> None:
        """The directory's shared client for `ensure_ready`'s probes (None: a client of its own each time)."""
        self._client = client

    async def probe(self, client: httpx.AsyncClient) -> bool:
        """Ask the peer now, whatever the schedule says; True when it is ready."""
        async with self._probing:
            self._record(await self._ask(client))
        return self._state == "ready"

    async def probe_if_due(self, client: httpx.AsyncClient | None) -> bool:
        """Ask the peer when its probe is due and no one else just did; True when it is ready."""
        async with self._probing:
            if self.probe_due():
                if client is None:
                    async with new_client() as own:
                        self._record(await self._ask(own))
                else:
                    self._record(await self._ask(client))
        return self._state == "ready"

    def status(self) -> dict[str, Any]:
        """For the status: no key, and the URL as scheme://host[:port] only."""
        parts = urlsplit(self.url)
        return {
            "name": self.name,
            "url": f"{parts.scheme}://{parts.netloc}",
            "state": self._state,
            "gpu_ready": self._gpu_ready,
            "priority": self.priority,
            "slots": self.slots,
            "models": list(self.models),
            "last_failure": self._last_failure,
            "next_probe_in": None if self._state == "unknown" else round(self.seconds_to_next_probe(), 3),
        }

    async def _ask(self, client: httpx.AsyncClient) -> HealthAnswer:
        return await ask_health(client, self.url, self.request_headers, self._schedule.timeout)

    def _record(self, answer: HealthAnswer) -> None:
        self._gpu_ready = answer.gpu_ready
        if not answer.ready:
            self._fail(answer.kind, answer.message)
            return
        if self._state != "ready":
            log.info("peer %s is ready (%s)", self.name, self.url)
        self._state = "ready"
        self._failures = 0
        self._next_probe_at = self._clock() + self._schedule.ready_every

    def _fail(self, kind: str, message: str) -> None:
        if self._state != "down" or self._last_failure is None or self._last_failure["kind"] != kind:
            log.warning("peer %s is down: %s: %s", self.name, kind, message)
        self._state = "down"
        self._last_failure = self._failure(kind, message)
        self._failures += 1
        self._next_probe_at = self._clock() + self._schedule.backoff(self._failures)
        if self.on_schedule_change is not None:
            self.on_schedule_change()

    @staticmethod
    def _failure(kind: str, message: str) -> dict[str, Any]:
        return {"kind": kind, "message": message, "at": time.time()}


def new_client() -> httpx.AsyncClient:
    """A client for peers. Not the environment's proxy (trust_env off): it would take the prompts and the
    peer's key off the local network, past the plain-HTTP rule."""
    return httpx.AsyncClient(trust_env=False, follow_redirects=False)
