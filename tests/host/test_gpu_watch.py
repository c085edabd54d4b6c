"""The service's device watch, in-process: the simulated GPU's ledger lives from start to stop, a GPU worker's
share is held on it under the worker's pid while the worker is ready, and the plan reads the watcher."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest

from tray_app.config import DeviceConfig
from tray_app.contract.events import EventBus, WorkerStateChanged
from tray_app.device.ledger import Ledger
from tray_app.host.gpu_watch import GpuWatch

GIB = 1024**3
MIB = 1024**2


@dataclass
class Profile:
    on_gpu: bool


@dataclass
class FakeWorker:
    pid: int | None
    profile: Profile
    reports: list[tuple[str, str, int | None]] = field(default_factory=list)

    def mark_unhealthy(self, reason: str, kind: str, *, pid: int | None = None) -> None:
        self.reports.append((reason, kind, pid))


def ready(role: str, pid: int | None) -> WorkerStateChanged:
    return WorkerStateChanged(role=role, old="starting", new="ready", reason="", pid=pid)


def stopped(role: str) -> WorkerStateChanged:
    return WorkerStateChanged(role=role, old="ready", new="unhealthy", reason="killed", pid=None)


@pytest.fixture
def workers() -> dict[str, FakeWorker]:
    return {"gpu": FakeWorker(os.getpid(), Profile(True)), "cpu": FakeWorker(os.getpid(), Profile(False))}


async def test_the_ledger_lives_from_start_to_stop_and_holds_a_ready_gpu_workers_share(
    workers: dict[str, FakeWorker],
) -> None:
    bus = EventBus()
    watch = GpuWatch(DeviceConfig(simulate_vram="4GiB"), bus, lambda: workers, lambda role: 1 * GIB)
    ledger = Ledger()
    assert not ledger.exists()  # nothing is created before the service starts
    await watch.start()
    try:
        assert ledger.read().total_bytes == 4 * GIB
        bus.publish(ready("cpu", os.getpid()))
        assert ledger.read().holdings == ()  # a CPU worker holds nothing on the GPU
        bus.publish(ready("gpu", os.getpid()))
        assert ledger.read().held_by(os.getpid()) == {"gpu": 1 * GIB}
        reading = watch.read_now()
        assert reading is not None and reading.own_bytes == 1 * GIB and reading.others_bytes == 0
        (gpu,) = reading.processes
        assert (gpu.label, gpu.own) == ("gpu", True)
        bus.publish(stopped("gpu"))
        assert ledger.read().holdings == ()
    finally:
        await watch.stop()
    assert not ledger.exists()


async def test_the_plan_reads_the_watcher_and_counts_only_others(workers: dict[str, FakeWorker]) -> None:
    bus = EventBus()
    watch = GpuWatch(DeviceConfig(simulate_vram="4GiB"), bus, lambda: workers, lambda role: 1 * GIB)
    await watch.start()
    try:
        bus.publish(ready("gpu", os.getpid()))
        Ledger().take("comfyui", 512 * MIB, pid=os.getppid())
        assert not watch.plan_is_stale()  # the watcher has not read it yet
        watch.read_now()
        assert watch.plan_is_stale()
        memory = watch.device.memory()
        # Our own worker's gigabyte is what the plan is about: available to it, not "others".
        assert (memory.used_by_others_bytes, memory.free_bytes) == (512 * MIB, 4 * GIB - 512 * MIB)
        assert memory.simulated and memory.kind == "simulated"
        assert [p.name for p in memory.processes] == [f"comfyui ({_name(os.getppid())}, pid {os.getppid()})"]
        watch.planned()
        assert not watch.plan_is_stale()
    finally:
        await watch.stop()


async def test_a_share_that_no_longer_fits_fails_the_worker_as_a_load_out_of_memory(
    workers: dict[str, FakeWorker],
) -> None:
    bus = EventBus()
    watch = GpuWatch(DeviceConfig(simulate_vram="4GiB"), bus, lambda: workers, lambda role: 1 * GIB)
    await watch.start()
    try:
        Ledger().take("game", 3584 * MIB, pid=os.getppid())  # taken while the worker was loading
        bus.publish(ready("gpu", os.getpid()))
        ((reason, kind, pid),) = workers["gpu"].reports
        assert (kind, pid) == ("oom_load", os.getpid()) and "out of memory" in reason
        assert watch.held() == {}
    finally:
        await watch.stop()


async def test_no_ledger_without_a_simulated_gpu(workers: dict[str, FakeWorker]) -> None:
    bus = EventBus()
    watch = GpuWatch(DeviceConfig(gpu_index=99), bus, lambda: workers, lambda role: 1 * GIB)
    await watch.start()
    try:
        assert watch.simulated is None and not Ledger().exists()
        bus.publish(ready("gpu", os.getpid()))
        assert watch.held() == {}
    finally:
        await watch.stop()


def _name(pid: int) -> str:
    import psutil

    return str(psutil.Process(pid).name())
