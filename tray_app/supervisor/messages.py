"""What callers and the owner task exchange (its queue's messages, the error a refused request raises) and
what the owner keeps about the process it spawned: plain data."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal

import psutil

from tray_app.engine import offload
from tray_app.engine.profile import WorkerProfile
from tray_app.supervisor.process import WorkerProcess


class SupervisorError(RuntimeError):
    """A request to the supervisor could not be carried out (e.g. faults armed on a worker that is down)."""


CommandName = Literal["start", "ensure_started", "stop", "restart", "mark_unhealthy", "update_profile"]


@dataclass
class Command:
    name: CommandName
    reason: str = ""
    kind: str = ""
    # mark_unhealthy: the process the report is about; None when the reporter could not tell.
    pid: int | None = None
    profile: WorkerProfile | None = None  # update_profile
    done: asyncio.Future[Any] | None = None


@dataclass
class Exited:
    generation: int
    returncode: int


@dataclass
class HealthResult:
    generation: int
    body: dict[str, Any] | None
    error: str = ""
    timed_out: bool = False


Message = Command | Exited | HealthResult


@dataclass
class Attempt:
    """One spawned process and what the owner tracks about it."""

    generation: int
    process: WorkerProcess
    port: int
    started_at: float
    # The profile it was started with: a new one from update_profile applies to the next start, so the
    # checks of this load must not read it.
    profile: WorkerProfile
    ready_at: float | None = None
    probe_due: float = 0.0
    probe_in_flight: bool = False
    unanswered_since: float | None = None
    outcome: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    psutil_process: psutil.Process | None = None
    load_seconds: float | None = None
    memory_limit: int | None = None  # RLIMIT_AS of a worker on a simulated device
    placement: offload.Offload | None = None  # where llama.cpp put the model, read once it is loaded
