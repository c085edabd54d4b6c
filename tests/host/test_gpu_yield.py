"""The yield and return (host.gpu_yield) against fake workers and a fake clock: new jobs stop seeing the GPU
at once, jobs in flight finish before the workers stop, a `gpu.yield_to` program triggers it, and the
return waits for `return_after`, is bounded per window, and a manual yield waits for `resume`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from tray_app.config import GpuConfig
from tray_app.device.snapshot import DeviceProcess, DeviceSnapshot
from tray_app.host.gpu_yield import GpuYield, Hidden

GIB = 1024**3


@dataclass
class FakeWorker:
    state: str = "ready"
    starts: int = 0
    stops: int = 0
    base_url: str | None = "http://127.0.0.1:1"
    pid: int | None = 11
    last_failure: dict[str, Any] | None = None
    request_headers: dict[str, str] = field(default_factory=dict)

    async def start(self) -> bool:
        self.starts += 1
        self.state = "ready"
        return True

    async def stop(self) -> None:
        self.stops += 1
        self.state = "stopped"

    async def ensure_ready(self, timeout: float) -> bool:
        return self.state == "ready"

    def mark_unhealthy(self, reason: str, kind: str, *, pid: int | None = None) -> None:
        pass

    async def failure_of(self, pid: int, timeout: float) -> dict[str, Any] | None:
        return None

    def note_tokens(self, count: int) -> None:
        pass


@dataclass
class FakeHost:
    settings: GpuConfig = field(default_factory=lambda: GpuConfig(return_after=30.0, max_returns=2))
    workers: dict[str, FakeWorker] = field(default_factory=lambda: {"gpu": FakeWorker()})
    busy: dict[str, int] = field(default_factory=dict)
    fits: bool = True
    held_back: bool = False
    unloaded: list[str] = field(default_factory=list)
    path_changes: int = 0

    def gpu_settings(self) -> GpuConfig:
        return self.settings

    def gpu_workers(self) -> dict[str, FakeWorker]:
        return self.workers

    def in_flight(self, role: str) -> int:
        return self.busy.get(role, 0)

    async def unload_from_gpu(self, role: str) -> bool:
        if role.startswith("gpu@"):
            self.unloaded.append(role)
            self.workers[role].state = "stopped"
            return True
        return False

    def main_fits_now(self, snapshot: DeviceSnapshot) -> bool:
        return self.fits

    def main_held_back(self) -> bool:
        return self.held_back

    def path_changed(self) -> None:
        self.path_changes += 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reading(*others: tuple[str, str]) -> DeviceSnapshot:
    processes = tuple(
        DeviceProcess(100 + i, name, GIB, False, label) for i, (name, label) in enumerate(others)
    )
    return DeviceSnapshot(
        at=0.0,
        source="simulated",
        device="simulated GPU",
        simulated=True,
        state="normal",
        total_bytes=8 * GIB,
        free_bytes=8 * GIB - len(others) * GIB,
        used_bytes=len(others) * GIB,
        processes=processes,
    )


async def test_a_yield_hides_the_gpu_from_new_jobs_and_stops_it_once_its_jobs_finished() -> None:
    host = FakeHost(workers={"gpu": FakeWorker(), "gpu@gemma": FakeWorker()}, busy={"gpu": 1})
    yielding = GpuYield(host)
    done = yielding.start_yield("asked with failsoft yield", manual=True)
    hidden = yielding.hide("gpu", host.workers["gpu"])
    assert isinstance(hidden, Hidden) and hidden.state == "stopped"
    assert not await hidden.ensure_ready(10) and hidden.base_url == "http://127.0.0.1:1"
    assert yielding.hide("cpu", FakeWorker()).state == "ready"  # the CPU is not yielded
    await asyncio.sleep(0.3)
    assert host.workers["gpu"].stops == 0  # its job is still running
    host.busy["gpu"] = 0
    await asyncio.wait_for(done, 5)
    assert host.workers["gpu"].stops == 1 and host.unloaded == ["gpu@gemma"]
    assert yielding.yielded is not None and yielding.yielded.phase == "stopped"


async def test_a_yield_to_program_triggers_it_and_the_gpu_returns_after_return_after() -> None:
    host = FakeHost(settings=GpuConfig(yield_to=["comfy*"], return_after=30.0))
    clock = Clock()
    yielding = GpuYield(host, clock)
    await yielding.check(reading(("python3", "ComfyUI")))
    assert yielding.yielded is not None and "ComfyUI (python3, pid 100)" in yielding.yielded.reason
    await asyncio.sleep(0.2)  # the drain: nothing in flight
    assert host.workers["gpu"].state == "stopped"
    await yielding.check(reading(("python3", "ComfyUI")))
    assert yielding.yielded.note == "a program the GPU is yielded to still holds memory"
    await yielding.check(reading())  # it left: free from now on
    clock.now += 29
    await yielding.check(reading())
    assert yielding.yielded is not None and host.workers["gpu"].starts == 0
    clock.now += 2
    await yielding.check(reading())
    await asyncio.sleep(0)
    assert yielding.yielded is None and host.workers["gpu"].starts == 1
    assert yielding.to_dict()["returns_in_window"] == 1


async def test_returns_are_bounded_per_window() -> None:
    host = FakeHost(settings=GpuConfig(return_after=0.0, max_returns=2, return_window=600.0))
    clock = Clock()
    yielding = GpuYield(host, clock)
    for _ in range(3):
        await asyncio.wait_for(yielding.start_yield("asked", manual=False), 5)
        await yielding.check(reading())
        await asyncio.sleep(0)
    assert host.workers["gpu"].starts == 2
    assert yielding.yielded is not None and "gpu.max_returns" in yielding.yielded.note
    clock.now += 601
    await yielding.check(reading())
    await asyncio.sleep(0)
    assert yielding.yielded is None and host.workers["gpu"].starts == 3


async def test_a_manual_yield_waits_for_resume_and_is_not_yielded_again_to_the_same_program() -> None:
    host = FakeHost(settings=GpuConfig(yield_to=["comfyui"], return_after=30.0))
    yielding = GpuYield(host, Clock())
    await asyncio.wait_for(yielding.start_yield("asked with failsoft yield", manual=True), 5)
    await yielding.check(reading())
    assert yielding.yielded is not None and "failsoft resume" in yielding.yielded.note
    await yielding.check(reading(("python3", "comfyui")))
    yielding.resume()
    await yielding.check(reading(("python3", "comfyui")))  # the user wants it back, comfyui or not
    await asyncio.sleep(0)
    assert yielding.yielded is None and host.workers["gpu"].starts == 1
    await yielding.check(reading(("python3", "comfyui")))
    assert yielding.yielded is None  # resumed over it: not yielded again while it stays


async def test_a_start_held_back_for_memory_comes_back_the_same_way() -> None:
    host = FakeHost(held_back=True, fits=False)
    host.workers["gpu"].state = "stopped"
    clock = Clock()
    yielding = GpuYield(host, clock)
    await yielding.check(reading())
    assert host.workers["gpu"].starts == 0  # no room yet
    host.fits = True
    await yielding.check(reading())
    clock.now += 31
    await yielding.check(reading())
    await asyncio.sleep(0)
    assert host.workers["gpu"].starts == 1
