"""The device watcher: the one owner of "the device now".

It reads its source every `poll_seconds`, keeps the latest snapshot and a bounded ring of them (the last
15 minutes at one a second, for a timeline), and publishes events only when something moved by more than
a threshold. Others read `latest` or wait on it; none of them reads the device itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from tray_app.contract.events import DeviceChanged, Event, OtherProcessAppeared, OtherProcessLeft
from tray_app.device.changes import Change, compare
from tray_app.device.snapshot import DeviceSnapshot, unknown_snapshot
from tray_app.device.sources import DeviceSource

log = logging.getLogger(__name__)

MIB = 1024 * 1024
DEFAULT_POLL_SECONDS = 1.0
DEFAULT_THRESHOLD_BYTES = 64 * MIB
HISTORY_SECONDS = 15 * 60.0
# The longest a caller on the loop that cannot await (the GPU start gate) waits for a blocking source's fresh
# reading before it takes the latest one: an NVML reading takes milliseconds; a wedged driver, forever.
FRESH_READ_WAIT_SECONDS = 0.25

Publish = Callable[[Event], None]


def _drop(_event: Event) -> None:
    pass


class DeviceWatcher:
    def __init__(
        self,
        source: DeviceSource,
        publish: Publish | None = None,
        *,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        threshold_bytes: int = DEFAULT_THRESHOLD_BYTES,
        history_seconds: float = HISTORY_SECONDS,
    ) -> None:
        if poll_seconds <= 0:
            raise ValueError(f"poll_seconds must be positive, got {poll_seconds}")
        self.source = source
        self.poll_seconds = poll_seconds
        self.threshold_bytes = threshold_bytes
        self.polls = 0  # readings recorded so far: lets a caller count polls rather than time them
        self._publish = publish or _drop
        self._latest: DeviceSnapshot | None = None
        self._told: DeviceSnapshot | None = None  # the reading the last DeviceChanged described
        self._history: deque[DeviceSnapshot] = deque(maxlen=max(1, math.ceil(history_seconds / poll_seconds)))
        self._task: asyncio.Task[None] | None = None
        self._waiters: list[asyncio.Future[None]] = []
        # A blocking source is read on the watcher's own thread, one read at a time (never on the default
        # executor, which serves the rest of the service): the read in progress, its number, its start.
        self._reader: ThreadPoolExecutor | None = None
        self._reading: Future[DeviceSnapshot] | None = None
        self._reading_number = 0
        self._reading_since = 0.0
        self._recorded_number = 0  # the newest of those reads recorded (each is recorded once, in order)
        self._overdue: Future[DeviceSnapshot] | None = None  # a read that outlived a caller's wait

    @property
    def latest(self) -> DeviceSnapshot | None:
        return self._latest

    def history(self, since: float | None = None) -> list[DeviceSnapshot]:
        """The ring's readings, oldest first; `since`: only those at or after that wall-clock time."""
        return [s for s in self._history if since is None or s.at >= since]

    @property
    def history_limit(self) -> int:
        return self._history.maxlen or 0

    def poll_once(self) -> DeviceSnapshot:
        """Read and record now, in the calling thread (tests, the cost measurement)."""
        return self.record(self._read())

    async def poll(self) -> DeviceSnapshot:
        """Read (on the watcher's thread when the source may block) and record."""
        if not self.source.blocking:
            return self.record(self._read())
        number, reading = self._read_on_thread()
        snapshot = await asyncio.wrap_future(reading)
        self._arrived(number, reading)
        return self._latest or snapshot

    def read_fresh(self, wait: float = FRESH_READ_WAIT_SECONDS) -> DeviceSnapshot | None:
        """A reading taken now for a caller on the loop that cannot await (the GPU start gate), recorded as
        a poll's. A source that does not block is read here. A blocking one (NVML: driver calls) is read on
        the watcher's thread, waited for at most `wait` seconds; past that the latest reading is the answer
        (the late one is recorded if it ever comes), and a read that outlived one caller's wait is not
        waited for again: a wedged driver stalls the loop for `wait` once, never for good."""
        if not self.source.blocking:
            return self.poll_once()
        number, reading = self._read_on_thread()
        left = wait - (time.monotonic() - self._reading_since)
        if left > 0 and reading is not self._overdue:
            with contextlib.suppress(TimeoutError):
                reading.result(timeout=left)
        if reading.done():
            self._arrived(number, reading)
        elif reading is not self._overdue:
            self._overdue = reading
            waited = time.monotonic() - self._reading_since
            log.warning("the device has not answered a reading for %.1f s: the latest one stands in", waited)
        return self._latest

    def _read_on_thread(self) -> tuple[int, Future[DeviceSnapshot]]:
        """The read of the source on the watcher's thread: the one in progress, or a new one. Its result is
        recorded on the loop when it comes, unless its caller recorded it first."""
        if self._reading is None or self._reading.done():
            if self._reader is None:
                self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="device-reader")
            loop = asyncio.get_running_loop()
            self._reading_number += 1
            number = self._reading_number
            self._reading, self._reading_since = self._reader.submit(self._read), time.monotonic()

            def arrive(done: Future[DeviceSnapshot]) -> None:  # on the reader's thread
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody to tell
                    loop.call_soon_threadsafe(self._arrived, number, done)

            self._reading.add_done_callback(arrive)
        return self._reading_number, self._reading

    def _arrived(self, number: int, reading: Future[DeviceSnapshot]) -> None:
        """On the loop: record a finished read of the watcher's thread, once, and never after a newer one."""
        if number <= self._recorded_number or reading.cancelled() or reading.exception() is not None:
            return
        self._recorded_number = number
        self.record(reading.result())

    def record(self, snapshot: DeviceSnapshot) -> DeviceSnapshot:
        """Keep `snapshot` as the device now, in the ring, and tell what changed since the last telling."""
        self._latest = snapshot
        self._history.append(snapshot)
        self.polls += 1
        change = compare(self._told, snapshot, self.threshold_bytes)
        if change:
            self._told = snapshot
            for event in self._events(snapshot, change):
                self._publish(event)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        return snapshot

    async def wait_for(
        self, predicate: Callable[[DeviceSnapshot], bool], timeout: float | None = None
    ) -> DeviceSnapshot:
        """The first reading from the latest on for which `predicate` holds; TimeoutError after `timeout`."""

        async def watch() -> DeviceSnapshot:
            while True:
                if self._latest is not None and predicate(self._latest):
                    return self._latest
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                await waiter

        return await asyncio.wait_for(watch(), timeout)

    def start(self) -> asyncio.Task[None]:
        """Poll in a task of the running loop until `stop()`."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="device-watcher")
        return self._task

    async def stop(self) -> None:
        """Stop polling and close the source."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._reader is not None:
            self._reader.shutdown(wait=False, cancel_futures=True)  # a read hanging in the driver stays
            self._reader = None
        self.source.close()

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            await self.poll()
            # A fixed rate: a slow reading shortens the pause after it rather than drifting the next one.
            await asyncio.sleep(max(0.0, self.poll_seconds - (time.monotonic() - started)))

    def _read(self) -> DeviceSnapshot:
        try:
            return self.source.read()
        except Exception as error:  # a source's own bug must not end the watching
            log.exception("device source %s failed", self.source.kind)
            return unknown_snapshot(time.time(), self.source.kind, "?", False, f"reading failed: {error!r}")

    def _events(self, snapshot: DeviceSnapshot, change: Change) -> list[Event]:
        events: list[Event] = [
            DeviceChanged(
                device=snapshot.device,
                simulated=snapshot.simulated,
                state=snapshot.state,
                total_bytes=snapshot.total_bytes,
                free_bytes=snapshot.free_bytes,
                own_bytes=snapshot.own_bytes,
                others_bytes=snapshot.others_bytes,
                processes=tuple(snapshot.to_dict()["processes"]),
                processes_known=snapshot.processes_known,
                reason="; ".join(change.reasons),
            )
        ]
        events.extend(
            OtherProcessAppeared(pid=p.pid, name=p.name, label=p.label, used_bytes=p.used_bytes)
            for p in change.appeared
            if not p.own
        )
        events.extend(
            OtherProcessLeft(pid=p.pid, name=p.name, label=p.label, used_bytes=p.used_bytes)
            for p in change.left
            if not p.own
        )
        return events
