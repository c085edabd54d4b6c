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

from tray_app.contract.events import DeviceChanged, Event, OtherProcessAppeared, OtherProcessLeft
from tray_app.device.changes import Change, compare
from tray_app.device.snapshot import DeviceSnapshot, unknown_snapshot
from tray_app.device.sources import DeviceSource

log = logging.getLogger(__name__)

MIB = 1024 * 1024
DEFAULT_POLL_SECONDS = 1.0
DEFAULT_THRESHOLD_BYTES = 64 * MIB
HISTORY_SECONDS = 15 * 60.0

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
        """Read (off the loop when the source may block) and record."""
        if self.source.blocking:
            snapshot = await asyncio.to_thread(self._read)
        else:
            snapshot = self._read()
        return self.record(snapshot)

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
