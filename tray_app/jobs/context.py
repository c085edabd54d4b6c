"""What the parts of the jobs engine share, made once by the host (host/service.py): each part (the facade,
the routing, the executor, the embeddings runner, the CPU mirror) takes this one record instead of the same
list of collaborators, so adding a collaborator is one field, not five constructors. What the parts ask of
the host, or of each other, as they go is a record of hooks beside it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tray_app.config import Config
from tray_app.contract.events import EventBus
from tray_app.jobs.admission import SlotPool
from tray_app.jobs.gpu_policy import GpuPath
from tray_app.jobs.journal import Journal
from tray_app.jobs.policy import CpuState
from tray_app.jobs.registry import Job, JobRegistry
from tray_app.jobs.relay import Relay
from tray_app.jobs.worker_port import Prompts, StandIn, Worker


@dataclass(frozen=True)
class JobsContext:
    registry: JobRegistry  # the only place a job's state changes
    journal: Journal
    slots: SlotPool
    relay: Relay  # HTTP to the workers
    bus: EventBus
    workers: Callable[[str], Worker | None]  # by role ("gpu", "cpu@name", ...): the supervisors' workers
    config: Callable[[], Config]  # read at each decision: a config reload takes effect
    # By model name: the worker role ("peer:<name>") of the peer that would answer it now (ready, serving the
    # model, the first by priority), or None: the ladder's rung between this machine's GPU and its CPU.
    peer_for: Callable[[str], str | None] = lambda model: None


def _no_count(route: str, outcome: str) -> None:
    pass


def _normal_path() -> tuple[GpuPath, str]:
    return "normal", ""


@dataclass(frozen=True)
class HostHooks:
    """What the facade and its routing ask of the host as they go; each has a default for tests."""

    # Requests by route and outcome (the service's metrics).
    count: Callable[[str, str], None] = _no_count
    # The first CPU speed measurement while it runs (a route waits for it rather than guess the speed).
    cpu_speed_ready: Callable[[], asyncio.Task[None] | None] = lambda: None
    # The device side's path state and why (host.gpu_path owns it).
    gpu_path: Callable[[], tuple[GpuPath, str]] = _normal_path


NO_HOOKS = HostHooks()  # a service's parts tested on their own


async def _no_stand_in(job: Job, *, offer: bool = False, chosen: bool = False) -> StandIn | None:
    return None


@dataclass(frozen=True)
class EngineHooks:
    """What the executor asks as it runs a job, of the routing (made after it) and of the host."""

    # async (time_left, CPU worker role) -> the CPU worker as the policy sees it (Routing.cpu_state).
    cpu_state: Callable[[float, str | None], Awaitable[CpuState]]
    # By model name (the models may change): its tokenizer and template, in the tokenizer helper.
    prompts: Callable[[str], Prompts]
    # async (job, offer=False): the job's stand-in on the GPU now, if the config lets it answer on its own;
    # with offer=True, one the approval window may offer instead ("ask") (Routing.stand_in).
    stand_in: Callable[..., Awaitable[StandIn | None]] = _no_stand_in
    on_fallback: Callable[[str], None] = lambda outcome: None  # started, completed, refused: the metrics
