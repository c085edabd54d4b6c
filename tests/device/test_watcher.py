"""The device watcher over a scripted source: what it tells and when, the ring's bound, and its loop."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterable

import pytest

from tests.device.conftest import GIB, MIB
from tests.support.waits import wait_until_async
from tray_app.config import DeviceConfig
from tray_app.contract.events import DeviceChanged, Event, EventBus, OtherProcessAppeared, OtherProcessLeft
from tray_app.device.changes import compare
from tray_app.device.cost import ledger_poll_cost, measure_poll_cost, watcher_cost_lines
from tray_app.device.ledger import Ledger
from tray_app.device.snapshot import DeviceProcess, DeviceSnapshot, DeviceState, SourceKind
from tray_app.device.sources import LedgerSource
from tray_app.device.watcher import DeviceWatcher
from tray_app.host import gpu_watch as gpu_watch_module
from tray_app.host.gpu_watch import GpuWatch

WORKER = DeviceProcess(pid=100, name="llama-server", used_bytes=2 * GIB, own=True)
COMFY = DeviceProcess(pid=4242, name="python3", used_bytes=3 * GIB, own=False, label="")


def reading(
    free: int, processes: Iterable[DeviceProcess] = (), state: DeviceState = "normal", at: float = 0.0
) -> DeviceSnapshot:
    return DeviceSnapshot(
        at=at,
        source="nvml",
        device="GPU",
        simulated=False,
        state=state,
        total_bytes=16 * GIB,
        free_bytes=free,
        used_bytes=16 * GIB - free,
        processes=tuple(processes),
    )


class ScriptedSource:
    """Hands out the readings it was given, one per read; the last one again when they run out."""

    kind: SourceKind = "nvml"
    blocking = False

    def __init__(self, readings: Iterable[DeviceSnapshot]) -> None:
        self.readings = list(readings)
        self.closed = False

    def read(self) -> DeviceSnapshot:
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]

    def close(self) -> None:
        self.closed = True


def run(readings: list[DeviceSnapshot], threshold: int = 64 * MIB) -> list[list[Event]]:
    """The events each poll published, poll by poll."""
    published: list[Event] = []
    watcher = DeviceWatcher(ScriptedSource(readings), published.append, threshold_bytes=threshold)
    per_poll = []
    for _ in readings:
        before = len(published)
        watcher.poll_once()
        per_poll.append(published[before:])
    return per_poll


def types(events: list[Event]) -> list[str]:
    return [event.type for event in events]


def test_small_moves_are_not_told_until_they_add_up_to_the_threshold() -> None:
    free = 10 * GIB
    polls = run([reading(free), reading(free - 30 * MIB), reading(free - 60 * MIB), reading(free - 90 * MIB)])
    assert types(polls[0]) == ["device_changed"]  # the first reading is always told
    assert polls[1] == [] and polls[2] == []  # 30 and 60 MiB from the last telling: under 64 MiB
    (told,) = polls[3]
    assert isinstance(told, DeviceChanged) and told.free_bytes == free - 90 * MIB
    assert "free 10.00 GiB -> 9.91 GiB" in told.reason


def test_another_process_coming_and_going_is_told_by_name() -> None:
    free = 10 * GIB
    polls = run(
        [
            reading(free, [WORKER]),
            reading(free, [WORKER, COMFY]),  # appears; free has not moved yet (the driver lags)
            reading(free - 3 * GIB, [WORKER, COMFY]),
            reading(free - 3 * GIB, [WORKER, COMFY]),
            reading(free, [WORKER]),
        ]
    )
    appeared = polls[1]
    assert types(appeared) == ["device_changed", "other_process_appeared"]
    assert isinstance(appeared[1], OtherProcessAppeared)
    assert (appeared[1].pid, appeared[1].name, appeared[1].used_bytes) == (4242, "python3", 3 * GIB)
    assert "python3 (pid 4242) appeared with 3.00 GiB" in appeared[0].to_dict()["reason"]
    assert types(polls[2]) == ["device_changed"] and polls[3] == []
    left = polls[4]
    assert types(left) == ["device_changed", "other_process_left"]
    assert isinstance(left[1], OtherProcessLeft) and left[1].pid == 4242


def test_own_workers_change_the_device_but_are_not_other_processes() -> None:
    polls = run([reading(10 * GIB), reading(8 * GIB, [WORKER]), reading(10 * GIB)])
    assert types(polls[1]) == ["device_changed"] and types(polls[2]) == ["device_changed"]
    told = polls[1][0]
    assert isinstance(told, DeviceChanged)
    # 8 GiB in use, 2 of them the worker's: the other 6 are someone else's (processes or the driver)
    assert (told.own_bytes, told.others_bytes) == (2 * GIB, 6 * GIB)
    assert told.processes == (
        {"pid": 100, "name": "llama-server", "used_bytes": 2 * GIB, "own": True, "label": ""},
    )


def test_a_process_growing_past_the_threshold_is_told() -> None:
    bigger = DeviceProcess(pid=4242, name="python3", used_bytes=3 * GIB + 100 * MIB, own=False)
    polls = run([reading(10 * GIB, [COMFY]), reading(10 * GIB, [bigger])])
    assert types(polls[1]) == ["device_changed"]
    unknown = DeviceProcess(pid=4242, name="python3", used_bytes=None, own=False)
    assert compare(reading(10 * GIB, [COMFY]), reading(10 * GIB, [unknown]), 64 * MIB)


def test_a_lost_device_is_told_at_once() -> None:
    polls = run([reading(10 * GIB), reading(10 * GIB, state="lost")])
    (told,) = polls[1]
    assert isinstance(told, DeviceChanged) and told.state == "lost"


def test_the_ring_keeps_the_last_window_only() -> None:
    source = ScriptedSource([reading(GIB * index, at=float(index)) for index in range(12)])
    watcher = DeviceWatcher(source, poll_seconds=1.0, history_seconds=5.0)
    assert watcher.history_limit == 5
    for _ in range(12):
        watcher.poll_once()
    assert [s.at for s in watcher.history()] == [7.0, 8.0, 9.0, 10.0, 11.0]
    assert [s.at for s in watcher.history(since=10.0)] == [10.0, 11.0]
    assert watcher.latest is not None and watcher.latest.at == 11.0 and watcher.polls == 12
    # The default: fifteen minutes at one poll a second.
    assert DeviceWatcher(source).history_limit == 900


def test_a_failing_source_gives_an_unknown_reading_not_a_dead_watcher() -> None:
    class Broken(ScriptedSource):
        def read(self) -> DeviceSnapshot:
            raise RuntimeError("driver bug")

    watcher = DeviceWatcher(Broken([reading(GIB)]))
    snapshot = watcher.poll_once()
    assert snapshot.state == "unknown" and "driver bug" in snapshot.reason


async def test_the_loop_polls_the_ledger_and_stops(ledger: Ledger) -> None:
    source = LedgerSource(ledger, own_pids=lambda: {os.getpid()})
    published: list[Event] = []
    watcher = DeviceWatcher(source, published.append, poll_seconds=0.05)
    watcher.start()
    try:
        await watcher.wait_for(lambda s: True, timeout=10)  # the first reading: nothing held
        ledger.take("gpu", 1 * GIB)
        snapshot = await watcher.wait_for(lambda s: s.own_bytes == 1 * GIB, timeout=10)
        assert snapshot.simulated and "simulated" in snapshot.device
        assert snapshot.processes[0].own and snapshot.processes[0].label == "gpu"
        polls = watcher.polls
        await watcher.wait_for(lambda s: watcher.polls >= polls + 2, timeout=10)  # it keeps polling
        with pytest.raises(TimeoutError):
            await watcher.wait_for(lambda s: s.free_bytes == 0, timeout=0.2)
    finally:
        await watcher.stop()
    assert types(published) == ["device_changed", "device_changed"]  # empty, then our own 1 GiB
    polls = watcher.polls
    await asyncio.sleep(0.15)
    assert watcher.polls == polls  # stopped


def test_the_cost_per_poll_is_measured_and_printed() -> None:
    cost = ledger_poll_cost(polls=20)
    assert cost.polls == 20 and cost.cpu_seconds > 0 and cost.wall_seconds > 0
    scripted = measure_poll_cost(ScriptedSource([reading(GIB)]), polls=5)
    assert scripted.polls == 5
    with pytest.raises(ValueError):
        measure_poll_cost(ScriptedSource([reading(GIB)]), polls=0)
    figures = {"poll_seconds": 1.0, "ledger": cost.to_dict(), "nvml": {"absent": "no NVIDIA GPU: none here"}}
    blank, line = watcher_cost_lines(figures)
    assert blank == "" and line.startswith("device watcher, per poll: simulated GPU's ledger ")
    assert "µs CPU" in line and "NVML not measured (no NVIDIA GPU: none here)" in line
    assert watcher_cost_lines(None) == []


class DriverSource(ScriptedSource):
    """A blocking source (a driver's, as NVML's): notes the thread each read runs on; while `hang` is clear a
    read waits for it (a wedged driver), up to a bound so a failed test cannot hold its thread for good."""

    blocking = True

    def __init__(self, readings: Iterable[DeviceSnapshot]) -> None:
        super().__init__(readings)
        self.threads: list[str] = []
        self.hang = threading.Event()
        self.hang.set()

    def read(self) -> DeviceSnapshot:
        self.threads.append(threading.current_thread().name)
        self.hang.wait(timeout=30)
        return super().read()


async def test_a_blocking_sources_fresh_reading_is_taken_on_the_watchers_thread() -> None:
    """Review F15: the GPU start gate's fresh reading (read_fresh) ran the driver's calls on the event
    loop; the watcher's own polls ran them on the default executor, shared with the rest of the service."""
    source = DriverSource([reading(10 * GIB, at=1.0), reading(9 * GIB, at=2.0), reading(8 * GIB, at=3.0)])
    published: list[Event] = []
    watcher = DeviceWatcher(source, published.append)
    try:
        first = await watcher.poll()
        fresh = watcher.read_fresh()
        assert (first.at, fresh is not None and fresh.at) == (1.0, 2.0)
        assert watcher.latest is fresh and watcher.polls == 2  # recorded as a poll's
        assert types(published) == ["device_changed", "device_changed"]  # and told
        assert source.threads == ["device-reader_0", "device-reader_0"]  # never the loop's, nor the pool's
    finally:
        await watcher.stop()
    assert source.closed


async def test_a_wedged_driver_does_not_stall_the_loop() -> None:
    source = DriverSource([reading(10 * GIB, at=1.0), reading(9 * GIB, at=2.0)])
    watcher = DeviceWatcher(source)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    try:
        await watcher.poll()
        source.hang.clear()  # the driver stops answering
        stood_in = watcher.read_fresh(wait=0.05)
        assert stood_in is watcher.latest and stood_in is not None and stood_in.at == 1.0  # the latest one
        # The loop goes on while the read hangs on the watcher's thread...
        before = ticks
        await wait_until_async(lambda: ticks > before + 10, timeout=10, what="the loop to run")
        # ...and a read hanging past the wait is not waited for again, nor is a second one started.
        assert watcher.read_fresh(wait=30) is stood_in and len(source.threads) == 2
        source.hang.set()  # the driver answers at last: its reading is recorded on the loop
        await wait_until_async(lambda: watcher.polls == 2, timeout=10, what="the late reading")
        assert watcher.latest is not None and watcher.latest.at == 2.0
    finally:
        source.hang.set()
        ticker.cancel()
        await watcher.stop()


async def test_the_gpu_start_gates_reading_comes_from_the_watchers_thread() -> None:
    watch = GpuWatch(DeviceConfig(), EventBus(), dict, lambda role: 0)
    source = DriverSource([reading(10 * GIB, at=1.0), reading(9 * GIB, at=2.0)])
    watch.watcher = DeviceWatcher(source)
    try:
        await watch.watcher.poll()
        source.hang.clear()
        assert watch.read_now() is watch.latest and len(source.threads) == 2  # asked, not waited for long
    finally:
        source.hang.set()
        await watch.watcher.stop()


async def test_the_gpu_start_gate_awaits_its_reading_and_the_loop_runs_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The supervisors await the gate (host.gpu_side): a driver that does not answer holds the start for
    FRESH_READ_AWAIT_SECONDS at most, and the event loop not at all."""
    monkeypatch.setattr(gpu_watch_module, "FRESH_READ_AWAIT_SECONDS", 0.3)
    watch = GpuWatch(DeviceConfig(), EventBus(), dict, lambda role: 0)
    source = DriverSource([reading(10 * GIB, at=1.0), reading(9 * GIB, at=2.0), reading(8 * GIB, at=3.0)])
    watch.watcher = DeviceWatcher(source)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    try:
        fresh = await watch.read_now_async()
        assert fresh is not None and fresh.at == 1.0  # the driver answered: its reading
        source.hang.clear()
        before = ticks
        stood_in = await watch.read_now_async()
        assert stood_in is watch.latest and stood_in is fresh  # the latest stands in
        assert ticks > before  # the loop ran while the start waited
        source.hang.set()
        await wait_until_async(
            lambda: watch.latest is not None and watch.latest.at == 2.0, 10, "the late one"
        )
    finally:
        source.hang.set()
        ticker.cancel()
        await watch.watcher.stop()
