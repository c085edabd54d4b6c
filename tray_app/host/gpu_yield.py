"""Give the GPU back, and come back by itself (jobs.gpu_policy decides when).

A yield (asked with `failsoft yield`, or a program of `gpu.yield_to` appearing on the card) hides the GPU
workers from new jobs at once, lets the jobs in flight on them finish (up to `gpu.drain_timeout`), then stops
them, so their memory is free. It ends once the memory the main plan needs has stayed free for
`gpu.return_after` seconds (at once for `failsoft resume`), at most `gpu.max_returns` times per
`gpu.return_window`. A GPU worker whose start the gate held back for want of memory comes back the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tray_app.config import GpuConfig
from tray_app.device.snapshot import DeviceSnapshot
from tray_app.jobs import gpu_policy
from tray_app.jobs.worker_port import Worker

log = logging.getLogger(__name__)

DRAIN_POLL_SECONDS = 0.1


class GpuWorker(Worker, Protocol):
    """A GPU worker as the yield stops and starts it (its supervisor)."""

    async def start(self) -> bool: ...

    async def stop(self) -> None: ...


@dataclass
class Yielded:
    reason: str  # why, in words: "asked with failsoft yield", "comfyui (python3, pid 4242) appeared"
    manual: bool
    since: float = field(default_factory=time.time)
    phase: str = "draining"  # draining: jobs in flight finish; stopped: the GPU workers' memory is free
    resume_asked: bool = False
    note: str = ""  # the last return decision's reason (why it has not returned yet)

    def to_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "manual": self.manual,
            "since": self.since,
            "phase": self.phase,
            "resume_asked": self.resume_asked,
            "waiting": self.note,
        }


class Hidden:
    """A GPU worker as new jobs see it during a yield: stopped, and it does not start. The jobs already on
    it keep the supervisor's real face through everything else."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    @property
    def state(self) -> str:
        return "stopped"

    @property
    def base_url(self) -> str | None:
        return self._worker.base_url

    @property
    def pid(self) -> int | None:
        return self._worker.pid

    @property
    def last_failure(self) -> dict[str, Any] | None:
        return self._worker.last_failure

    @property
    def request_headers(self) -> dict[str, str]:
        return self._worker.request_headers

    async def ensure_ready(self, timeout: float) -> bool:
        return False

    def mark_unhealthy(self, reason: str, kind: str, *, pid: int | None = None) -> None:
        self._worker.mark_unhealthy(reason, kind, pid=pid)

    async def failure_of(self, pid: int, timeout: float) -> dict[str, Any] | None:
        return await self._worker.failure_of(pid, timeout)

    def note_tokens(self, count: int) -> None:
        self._worker.note_tokens(count)


class YieldHost(Protocol):
    """What the yield needs of the service."""

    def gpu_settings(self) -> GpuConfig: ...

    def gpu_workers(self) -> Mapping[str, GpuWorker]: ...

    def in_flight(self, role: str) -> int: ...

    async def unload_from_gpu(self, role: str) -> bool:
        """Stop a library model's GPU worker the library's way; False when `role` is not one."""
        ...

    def main_fits_now(self, snapshot: DeviceSnapshot) -> bool: ...

    def main_held_back(self) -> bool:
        """The main GPU worker is stopped because the gate found no room for it."""
        ...

    def path_changed(self) -> None: ...


class GpuYield:
    """Owns whether the GPU is yielded, and the returns (nobody else starts a yielded GPU worker)."""

    def __init__(self, host: YieldHost, clock: Callable[[], float] = time.monotonic) -> None:
        self._host = host
        self._clock = clock
        self.yielded: Yielded | None = None
        self.returns: deque[float] = deque(maxlen=64)
        self.last_return: dict[str, Any] | None = None
        self._fits_since: float | None = None
        self._drain: asyncio.Task[None] | None = None
        self._start: asyncio.Task[bool] | None = None
        self._resumed_over: set[str] = set()

    @property
    def reason(self) -> str | None:
        return self.yielded.reason if self.yielded is not None else None

    def hide(self, role: str, worker: Worker) -> Worker:
        """What new jobs see of the GPU worker `role`."""
        if self.yielded is not None and role in self._host.gpu_workers():
            return Hidden(worker)
        return worker

    # ------------------------------------------------------------------------------------ yielding
    def start_yield(self, reason: str, *, manual: bool) -> Awaitable[None]:
        """Yield now (a yield in progress is kept; a manual request makes it manual). The drain runs in a
        task; the returned awaitable ends once the GPU workers are stopped."""
        if self.yielded is not None:
            self.yielded.manual = self.yielded.manual or manual
            self.yielded.resume_asked = False
        else:
            log.info("yielding the GPU: %s", reason)
            self.yielded = Yielded(reason, manual)
            self._fits_since = None
            self._host.path_changed()
        if self._drain is None or self._drain.done():
            self._drain = asyncio.get_running_loop().create_task(self._drain_and_stop(), name="gpu-yield")
        return asyncio.shield(self._drain)

    async def _drain_and_stop(self) -> None:
        settings = self._host.gpu_settings()
        deadline = self._clock() + settings.drain_timeout
        roles = list(self._host.gpu_workers())
        while any(self._host.in_flight(role) for role in roles) and self._clock() < deadline:
            await asyncio.sleep(DRAIN_POLL_SECONDS)
        for role, worker in self._host.gpu_workers().items():
            if not await self._host.unload_from_gpu(role):
                await worker.stop()
        if self.yielded is not None:
            self.yielded.phase = "stopped"
            self._host.path_changed()

    def resume(self) -> None:
        """The user gives the GPU back to Failsoft: it returns as soon as the main plan fits."""
        if self.yielded is not None:
            self.yielded.manual = False
            self.yielded.resume_asked = True

    async def stop(self) -> None:
        for task in (self._drain, self._start):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    # ------------------------------------------------------------------------------------ returning
    async def check(self, snapshot: DeviceSnapshot | None) -> None:
        """After each reading: yield to a program of `gpu.yield_to` that appeared, or return when due."""
        if snapshot is None:
            return
        settings = self._host.gpu_settings()
        programs = [gpu_policy.Program(p.name, p.label, p.describe(), p.used_bytes) for p in snapshot.others]
        targets = gpu_policy.yield_targets(programs, settings.yield_to)
        # A program the user resumed over is not yielded to again (that would undo the resume at once).
        new = [t for t in targets if t.describe not in self._resumed_over]
        self._resumed_over &= {t.describe for t in targets}
        if new and self.yielded is None:
            names = ", ".join(t.describe for t in new)
            self.start_yield(f"{names} appeared on the GPU (gpu.yield_to)", manual=False)
            return
        if self.yielded is None and not self._host.main_held_back():
            self._fits_since = None
            return
        if self.yielded is not None and self.yielded.phase != "stopped":
            return
        decision = self._return_decision(snapshot, settings, bool(new))
        if self.yielded is not None:
            self.yielded.note = decision.reason
        if decision.action == "return":
            if self.yielded is not None and self.yielded.resume_asked:
                self._resumed_over = {t.describe for t in targets}
            self._return(decision.reason)

    def _return_decision(
        self, snapshot: DeviceSnapshot, settings: GpuConfig, targets_present: bool
    ) -> gpu_policy.ReturnDecision:
        now = self._clock()
        resume_asked = self.yielded is not None and self.yielded.resume_asked
        # The wait for return_after starts once the program yielded to is gone, not while it stays.
        fits = self._host.main_fits_now(snapshot) and (resume_asked or not targets_present)
        if not fits:
            self._fits_since = None
        elif self._fits_since is None:
            self._fits_since = now
        yielded = self.yielded
        return gpu_policy.decide_return(
            gpu_policy.ReturnCheck(
                manual=yielded.manual if yielded else False,
                resume_asked=yielded.resume_asked if yielded else False,
                targets_present=targets_present,
                fits_now=fits,
                fits_since=self._fits_since,
                now=now,
                return_after=settings.return_after,
                recent_returns=tuple(self.returns),
                max_returns=settings.max_returns,
                return_window=settings.return_window,
            )
        )

    def _return(self, reason: str) -> None:
        log.info("the GPU worker comes back: %s", reason)
        self.returns.append(self._clock())
        self.yielded = None
        self._fits_since = None
        self.last_return = {"at": time.time(), "reason": reason}
        self._host.path_changed()
        main = self._host.gpu_workers().get("gpu")
        if main is not None and (self._start is None or self._start.done()):
            # In a task: the watching goes on while it loads. The gate weighs it once more on a fresh reading.
            self._start = asyncio.get_running_loop().create_task(main.start(), name="gpu-return")

    def to_dict(self) -> dict[str, Any]:
        return {
            "yielded": self.yielded.to_dict() if self.yielded is not None else None,
            "returns_in_window": len(
                [t for t in self.returns if self._clock() - t < self._host.gpu_settings().return_window]
            ),
            "last_return": self.last_return,
        }
