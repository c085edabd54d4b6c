"""Admission control: bound how many requests run on each worker and how many wait (FIFO, with known
positions; a full queue answers at once). A request's tokens are counted by the tokenizer helper
(tray_app.tokenizer)."""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


def requested_tokens(prompt_tokens: int, max_tokens: int | None, n_ctx_per_seq: int) -> int:
    """The generation budget a request claims: its max_tokens, else whatever the context leaves."""
    if max_tokens is not None:
        return max_tokens
    return max(n_ctx_per_seq - prompt_tokens, 1)


class QueueFull(Exception):
    def __init__(self, depth: int, retry_after: int) -> None:
        super().__init__(f"the wait queue is full ({depth} waiting)")
        self.depth = depth
        self.retry_after = retry_after


class QueueTimeout(Exception):
    def __init__(self, waited: float, retry_after: int) -> None:
        super().__init__(f"waited {waited:.1f}s for a free slot")
        self.retry_after = retry_after


@dataclass
class _Waiter:
    job_id: str
    future: asyncio.Future[None]
    accepted: bool = False  # accepted work (a replay, a background job): not counted against the limit


@dataclass
class _Worker:
    capacity: int
    in_flight: int = 0
    background: int = 0  # of in_flight: held by background work (the CPU mirror), which real work pre-empts
    waiters: deque[_Waiter] = field(default_factory=deque)
    seconds_per_job: float = 1.0  # moving average, for Retry-After

    @property
    def real_work(self) -> bool:
        """Requests in flight or waiting that are not background work."""
        return self.in_flight > self.background or bool(self.waiters)


# listener(role, wanted): True when real work asks for a slot on `role` (background work there steps aside
# at once), False when a slot on `role` was given back.
SlotListener = Callable[[str, bool], None]


class SlotPool:
    """At most `capacity` requests in flight per worker; the rest wait in FIFO order, up to `queue_limit`
    waiting in all. Replays of accepted work (`accepted=True`) are never turned away by the limit.
    Background work (`try_acquire_background`) only takes a slot of a worker with no real work, and its
    listeners hear when real work wants one."""

    def __init__(
        self,
        capacities: dict[str, int],
        queue_limit: int,
        on_change: Callable[[int], None] | None = None,
    ) -> None:
        self._workers = {role: _Worker(max(capacity, 1)) for role, capacity in capacities.items()}
        self.queue_limit = queue_limit
        self._on_change = on_change
        self._listeners: list[SlotListener] = []

    def listen(self, listener: SlotListener) -> None:
        self._listeners.append(listener)

    def _tell(self, role: str, wanted: bool) -> None:
        for listener in self._listeners:
            listener(role, wanted)

    @property
    def depth(self) -> int:
        return sum(len(worker.waiters) for worker in self._workers.values())

    @property
    def interactive_depth(self) -> int:
        """Waiting requests the limit counts: accepted work waits too, but never crowds out new requests."""
        return sum(not w.accepted for worker in self._workers.values() for w in worker.waiters)

    def in_flight(self, role: str) -> int:
        return self._workers[role].in_flight

    def capacity(self, role: str) -> int:
        return self._workers[role].capacity

    @property
    def roles(self) -> frozenset[str]:
        return frozenset(self._workers)

    def position(self, job_id: str) -> int | None:
        """1-based place in its worker's line, or None when not waiting."""
        for worker in self._workers.values():
            for index, waiter in enumerate(worker.waiters):
                if waiter.job_id == job_id:
                    return index + 1
        return None

    def retry_after(self, role: str) -> int:
        worker = self._workers[role]
        waiting = len(worker.waiters) + worker.in_flight
        return max(1, math.ceil(waiting * worker.seconds_per_job / worker.capacity))

    def try_acquire(self, role: str) -> float | None:
        """A slot on `role` if one is free and nobody waits for it (the acquisition time, for `release`);
        None otherwise. Background work on `role` is told to step aside either way."""
        self._tell(role, True)
        worker = self._workers[role]
        if worker.in_flight < worker.capacity and not worker.waiters:
            worker.in_flight += 1
            return time.monotonic()
        return None

    def try_acquire_background(self, role: str, most: int) -> float | None:
        """A slot on `role` for background work: only while the worker has no real work in flight or
        waiting, a slot is free, and background work holds fewer than `most`; never queued."""
        worker = self._workers.get(role)
        if worker is None or worker.real_work or worker.background >= most:
            return None
        if worker.in_flight >= worker.capacity:
            return None
        worker.in_flight += 1
        worker.background += 1
        return time.monotonic()

    def release_background(self, role: str, acquired_at: float) -> None:
        worker = self._workers[role]
        worker.background = max(worker.background - 1, 0)
        self.release(role, acquired_at, record=False)  # its time says nothing of a request's

    def idle_for_background(self, role: str) -> bool:
        """Whether `role` has no real work in flight or waiting."""
        worker = self._workers.get(role)
        return worker is not None and not worker.real_work

    async def acquire(self, role: str, job_id: str, timeout: float, *, accepted: bool = False) -> float:
        """Wait for a slot on `role`; returns the acquisition time (pass it to `release`)."""
        worker = self._workers[role]
        held = self.try_acquire(role)
        if held is not None:
            return held
        if not accepted and self.interactive_depth >= self.queue_limit:
            raise QueueFull(self.interactive_depth, self.retry_after(role))
        waiter = _Waiter(job_id, asyncio.get_running_loop().create_future(), accepted)
        worker.waiters.append(waiter)
        self._changed()
        started = time.monotonic()
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), timeout)
        except (TimeoutError, asyncio.CancelledError) as error:
            if waiter in worker.waiters:
                worker.waiters.remove(waiter)
                self._changed()
            elif waiter.future.done():
                # The slot was handed over just as we gave up: pass it on.
                self.release(role, time.monotonic(), record=False)
            if isinstance(error, TimeoutError):
                raise QueueTimeout(time.monotonic() - started, self.retry_after(role)) from None
            raise
        return time.monotonic()

    def resize(self, role: str, capacity: int) -> None:
        """The worker `role` now serves `capacity` requests at once (it restarted with another plan): more
        room goes to those waiting at once; less takes effect as requests in flight finish."""
        worker = self._workers.get(role)
        if worker is None:
            return
        worker.capacity = max(capacity, 1)
        while worker.in_flight < worker.capacity and worker.waiters:
            waiter = worker.waiters.popleft()
            if not waiter.future.done():
                worker.in_flight += 1
                waiter.future.set_result(None)
        self._changed()

    def release(self, role: str, acquired_at: float, *, record: bool = True) -> None:
        worker = self._workers[role]
        if record:
            elapsed = time.monotonic() - acquired_at
            worker.seconds_per_job = 0.8 * worker.seconds_per_job + 0.2 * elapsed
        while worker.waiters and worker.in_flight <= worker.capacity:
            waiter = worker.waiters.popleft()
            if not waiter.future.done():
                waiter.future.set_result(None)  # the slot passes straight to the next in line
                self._changed()
                return
        worker.in_flight -= 1
        self._changed()
        self._tell(role, False)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.depth)
