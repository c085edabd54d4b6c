"""Events are plain data. This module imports nothing else of the project, so any layer can publish them and
any client (the HTTP event stream, the Qt tray adapter, tests) can consume them.

Every event has a `type` (its wire name), a wall-clock `at`, and fields of its own. `to_dict()` is what goes
out on /failsoft/events as the JSON `data:` of a server-sent event whose `event:` is the type; an event's
`PRIVATE` fields never do (nor into the status page, a webhook's `events` or a repr): they are for a
listener in this process that hands them on only where the user allowed it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class Event:
    type: ClassVar[str] = "event"
    # Fields that stay in the process: to_dict() (the wire) leaves them out.
    PRIVATE: ClassVar[frozenset[str]] = frozenset()
    at: float = field(default_factory=time.time, kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        fields = dataclasses.asdict(self)
        return {"type": self.type, **{key: value for key, value in fields.items() if key not in self.PRIVATE}}


@dataclass(frozen=True)
class WorkerStateChanged(Event):
    type: ClassVar[str] = "worker_state"
    role: str
    old: str
    new: str
    reason: str
    pid: int | None = None


@dataclass(frozen=True)
class WorkerUnhealthy(Event):
    type: ClassVar[str] = "worker_unhealthy"
    role: str
    kind: str  # failure kind: oom_load, oom_decode, crash_abort, killed, hung, bad_config, exited
    reason: str
    # oom_load: the device allocation that failed, and the device bytes the load had reached with it (0: the
    # load's lines did not say)
    failed_bytes: int = 0
    reached_bytes: int = 0


@dataclass(frozen=True)
class WorkerRestarted(Event):
    type: ClassVar[str] = "worker_restarted"
    role: str
    pid: int | None
    attempt: int
    reason: str


@dataclass(frozen=True)
class BudgetUpdated(Event):
    type: ClassVar[str] = "budget"
    plan: dict[str, Any]


@dataclass(frozen=True)
class RouteDecided(Event):
    type: ClassVar[str] = "route_decided"
    job_id: str
    route: str  # gpu, cpu, approval, refused
    reason: str
    detail: str = ""  # off the GPU because of the GPU path: which program squeezed it or took it back


@dataclass(frozen=True)
class JobStateChanged(Event):
    type: ClassVar[str] = "job_state"
    job_id: str
    state: str
    worker: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class QueueChanged(Event):
    type: ClassVar[str] = "queue"
    depth: int
    limit: int


@dataclass(frozen=True)
class FallbackEvent(Event):
    """A step of a job's move to the CPU worker; each step is its own type (a listener tells them apart)."""

    job_id: str
    # Started, completed: why the job left the GPU (a failure kind or reason code). Refused: why the CPU may
    # not take it (cpu_too_slow, cpu_ram_insufficient, no_cpu_worker, effects_delivered, stream_started, ...).
    reason: str


@dataclass(frozen=True)
class FallbackStarted(FallbackEvent):
    type: ClassVar[str] = "fallback_started"
    to: str = "cpu"  # where the job continues: "cpu", or "peer:<name>" (another machine's GPU, [[peers]])


@dataclass(frozen=True)
class FallbackCompleted(FallbackEvent):
    type: ClassVar[str] = "fallback_completed"
    seconds: float


@dataclass(frozen=True)
class FallbackRefused(FallbackEvent):
    type: ClassVar[str] = "fallback_refused"
    detail: str = ""


@dataclass(frozen=True)
class ApprovalNeeded(Event):
    """A job waits for the user's yes or no to a slow CPU run. On the wire it says which model, how large and
    why, never what the prompt says: /failsoft/events needs no admin token. The prompt's opening is read
    through the admin routes (/failsoft/jobs, /failsoft/view), and reaches a notification channel only with
    its `preview = true` (`prompt_preview`, which to_dict() leaves out)."""

    type: ClassVar[str] = "approval_needed"
    PRIVATE: ClassVar[frozenset[str]] = frozenset({"prompt_preview"})
    job_id: str
    estimated_seconds: float
    model: str = ""  # the model that would answer on the CPU
    prompt_tokens: int = 0
    # A reason code: why it left the GPU (crash_abort, exceeds_gpu_profile), else why it waits (cpu_too_slow)
    reason: str = ""
    stand_in: str | None = None  # a smaller model the user may pick instead: it answers on the GPU now
    prompt_preview: str = field(default="", repr=False, kw_only=True)


@dataclass(frozen=True)
class JournalFailed(Event):
    """The journal lost a write: the service is degraded and takes no background job until it restarts."""

    type: ClassVar[str] = "journal_failed"
    reason: str


@dataclass(frozen=True)
class DeviceChanged(Event):
    """The GPU's memory, state or processes moved by more than the watcher's threshold. `processes`: each a
    dict of pid, name, used_bytes (None: the driver does not say), own, label."""

    type: ClassVar[str] = "device_changed"
    device: str
    simulated: bool
    state: str  # normal, lost, unknown
    total_bytes: int
    free_bytes: int
    own_bytes: int
    others_bytes: int
    processes: tuple[dict[str, Any], ...]
    processes_known: bool
    reason: str  # what changed, in words


@dataclass(frozen=True)
class OtherProcessEvent(Event):
    """A process that is not one of Failsoft's workers, as the device watcher last read it."""

    pid: int
    name: str
    label: str
    used_bytes: int | None  # what it holds (appeared), or held at the last reading (left)


@dataclass(frozen=True)
class OtherProcessAppeared(OtherProcessEvent):
    """A process that is not one of Failsoft's workers now holds memory on the GPU."""

    type: ClassVar[str] = "other_process_appeared"


@dataclass(frozen=True)
class OtherProcessLeft(OtherProcessEvent):
    """A process that was not one of Failsoft's workers holds no memory on the GPU any more."""

    type: ClassVar[str] = "other_process_left"


@dataclass(frozen=True)
class GpuPathChanged(Event):
    """The GPU path moved between normal, squeezed (another program ate into the reserve), yielded (given
    to another program on purpose) and lost (the device failed): who caused it and what Failsoft does."""

    type: ClassVar[str] = "gpu_path"
    state: str  # normal, squeezed, yielded, lost
    previous: str
    reason: str  # what happened, naming the programs that hold the memory
    action: str  # what Failsoft does about it, in words


Listener = Callable[[Event], None]


class EventBus:
    """Fan-out of events to listeners and async subscribers; safe to publish from any thread.

    Keeps the last `history` events so a client that connects late can catch up.
    """

    def __init__(self, history: int = 200) -> None:
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []
        self._queues: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[Event]]] = []
        self._recent: deque[Event] = deque(maxlen=history)

    def publish(self, event: Event) -> None:
        with self._lock:
            self._recent.append(event)
            listeners = list(self._listeners)
            queues = list(self._queues)
        for listener in listeners:
            listener(event)
        if not queues:
            return
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for loop, queue in queues:
            if loop is current:
                # The same queue of callbacks as below (order kept), without waking the loop through its
                # self-pipe: it is this thread's loop, and running.
                loop.call_soon(queue.put_nowait, event)
            elif not loop.is_closed():
                loop.call_soon_threadsafe(queue.put_nowait, event)

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        with self._lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return remove

    def recent(self) -> list[Event]:
        with self._lock:
            return list(self._recent)

    async def subscribe(self) -> AsyncIterator[Event]:
        """Events published from now on, in order, until the consumer stops iterating."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        entry = (asyncio.get_running_loop(), queue)
        with self._lock:
            self._queues.append(entry)
        try:
            while True:
                yield await queue.get()
        finally:
            with self._lock:
                self._queues.remove(entry)
