"""The service's hold on "the device now": the device watcher from start to stop, the simulated GPU's ledger
(created at start, removed at stop), and each GPU worker's planned share taken on that ledger under the
worker's own pid while it is ready, so the watcher tells Failsoft's memory from other programs' the same
way on the simulated device as through NVML."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

from tray_app.budget.device import (
    AbsentDevice,
    NvmlDevice,
    SimulatedDevice,
    WatchedGpu,
    probe_gpu,
)
from tray_app.config import DeviceConfig
from tray_app.contract.events import Event, EventBus, WorkerStateChanged
from tray_app.contract.sizes import parse_size
from tray_app.device.ledger import NoSimulatedDevice
from tray_app.device.snapshot import DeviceSnapshot
from tray_app.device.sources import pick_source
from tray_app.device.watcher import DEFAULT_THRESHOLD_BYTES, DeviceWatcher

FRESH_READ_AWAIT_SECONDS = 2.0  # a start waits this long for the driver's reading, the loop not at all

log = logging.getLogger(__name__)

PlanningDevice = SimulatedDevice | NvmlDevice | AbsentDevice | WatchedGpu


class WatchedWorker(Protocol):
    """What the watch needs of a worker's supervisor."""

    @property
    def pid(self) -> int | None: ...

    def mark_unhealthy(self, reason: str, kind: str, *, pid: int | None = None) -> None: ...


class GpuWatch:
    """Owns the watcher and the ledger for one run of the service. Before `start()` the device is the one
    probed at construction (the first plan is made on it); after, the planner reads the watcher's latest
    reading (a simulated GPU, or an NVIDIA one through NVML)."""

    def __init__(
        self,
        settings: DeviceConfig,
        bus: EventBus,
        workers: Callable[[], Mapping[str, WatchedWorker]],
        share_of: Callable[[str], int],
    ) -> None:
        self.settings = settings
        self.bus = bus
        self._workers = workers
        self._share_of = share_of  # a GPU worker's planned bytes on the device, by role
        self.device: PlanningDevice = probe_gpu(settings)
        self.simulated: SimulatedDevice | None = (
            self.device if isinstance(self.device, SimulatedDevice) else None
        )
        self.watcher: DeviceWatcher | None = None
        self.source_note = "not started"  # which source the watcher reads, or why there is none
        self._holding: dict[str, int] = {}  # role -> the pid its share is held under on the ledger
        self._planned_on: DeviceSnapshot | None = None
        self._remove_listener: Callable[[], None] | None = None

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Create the simulated GPU's ledger (with --simulate-vram), start watching, read once."""
        settings = self.settings
        ledger = None
        if settings.simulate_vram:
            self.simulated = SimulatedDevice.on_ledger(parse_size(settings.simulate_vram))
            ledger = self.simulated.ledger
        source, self.source_note = pick_source(
            simulated=bool(settings.simulate_vram),
            gpu_index=settings.gpu_index,
            own_pids=self.own_pids,
            ledger=ledger,
        )
        self._remove_listener = self.bus.add_listener(self._on_event)
        if source is None:
            return  # nothing to watch: the plan stays the probed one
        self.watcher = DeviceWatcher(source, self.bus.publish, poll_seconds=settings.poll_seconds)
        first = await self.watcher.poll()
        if source.kind in ("simulated", "nvml"):
            # On AMD only free memory is read (no processes) and no GPU worker runs there yet: keep the probe.
            self.device = WatchedGpu(self.latest_or_read, simulated=source.kind == "simulated")
        self._planned_on = first
        self.watcher.start()

    async def stop(self) -> None:
        """Stop watching; the simulated GPU goes away with the service (its ledger file is removed)."""
        if self._remove_listener is not None:
            self._remove_listener()
            self._remove_listener = None
        if self.watcher is not None:
            await self.watcher.stop()
            self.watcher = None
        if self.simulated is not None:
            self.simulated.close()
        self._holding.clear()

    # ------------------------------------------------------------------------------------- readings
    def own_pids(self) -> Collection[int]:
        """Failsoft's own processes on the device: its workers' (the watcher reads this at every poll)."""
        return {worker.pid for worker in self._workers().values() if worker.pid is not None}

    @property
    def latest(self) -> DeviceSnapshot | None:
        return self.watcher.latest if self.watcher is not None else None

    def latest_or_read(self) -> DeviceSnapshot:
        assert self.watcher is not None, "read only once the watcher runs"
        return self.watcher.latest or self.watcher.poll_once()

    def read_now(self) -> DeviceSnapshot | None:
        """A fresh reading, recorded (and told) as a poll would be: a GPU start is weighed on it. The start
        gate is called without an await, so a driver's reading (NVML) is taken on the watcher's thread and
        waited for briefly, never on the event loop itself (DeviceWatcher.read_fresh)."""
        return self.watcher.read_fresh() if self.watcher is not None else None

    async def read_now_async(self) -> DeviceSnapshot | None:
        """A fresh reading, awaited (on the watcher's thread for a driver's source): what a GPU start is
        weighed on. A driver that does not answer in FRESH_READ_AWAIT_SECONDS leaves the latest reading to
        stand in; the late one is recorded when it comes."""
        watcher = self.watcher
        if watcher is None:
            return None
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(watcher.poll()), FRESH_READ_AWAIT_SECONDS)
        return watcher.latest

    def plan_is_stale(self) -> bool:
        """Whether others' memory, the size or the state moved by the watcher's threshold since the plan
        was last made on a reading (Failsoft's own workers coming and going do not count)."""
        now, then = self.latest, self._planned_on
        if now is None or now.state == "unknown":
            return False  # nothing better to plan on than what was planned
        if then is None:
            return True
        threshold = self.watcher.threshold_bytes if self.watcher else DEFAULT_THRESHOLD_BYTES
        return (
            now.state != then.state
            or now.total_bytes != then.total_bytes
            or abs(now.others_bytes - then.others_bytes) >= threshold
        )

    def planned(self) -> None:
        """The plan was just made on the latest reading."""
        self._planned_on = self.latest

    # ------------------------------------------------------------------ the workers' shares (simulated)
    def _on_event(self, event: Event) -> None:
        if not isinstance(event, WorkerStateChanged) or self.simulated is None:
            return
        worker = self._workers().get(event.role)
        if worker is None:
            return
        # By role: the profile is the one for the next start; what this one was weighed to hold is share_of's.
        if event.new == "ready" and event.pid is not None and event.role.startswith("gpu"):
            self._take(event.role, event.pid, worker)
        elif event.new != "ready" and event.role in self._holding:
            self._release(event.role)

    def _take(self, role: str, pid: int, worker: WatchedWorker) -> None:
        ledger = self.simulated.ledger if self.simulated is not None else None
        if ledger is None:
            return
        size = self._share_of(role)
        if size <= 0:
            return  # no layer on the GPU: nothing held there
        try:
            ledger.take(role, size, pid=pid)
        except MemoryError as error:
            # What a real card does to a load that finds the memory gone: the allocation fails.
            worker.mark_unhealthy(
                f"cudaMalloc failed: out of memory (simulated): {error}", "oom_load", pid=pid
            )
            return
        except NoSimulatedDevice:
            return
        self._holding[role] = pid

    def _release(self, role: str) -> None:
        pid = self._holding.pop(role)
        ledger = self.simulated.ledger if self.simulated is not None else None
        if ledger is not None:
            ledger.release(role, pid=pid)

    def held(self) -> dict[str, int]:
        """role -> the pid its share is held under on the simulated GPU."""
        return dict(self._holding)
