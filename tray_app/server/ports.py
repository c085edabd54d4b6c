"""What the HTTP layer needs of the rest of the service, as interfaces: the jobs facade (jobs.intake), the
models and workers it shows and acts on, the settings it reads and changes. The host's `Service` provides
them; `server/` never imports `host/` or `supervisor/`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from tray_app.budget.device import SimulatedDevice
from tray_app.budget.plan_set import PlanSet
from tray_app.config import Config
from tray_app.contract.events import EventBus
from tray_app.contract.status import ModelStatus, ServiceStatus, WorkerStatus
from tray_app.jobs.admission import SlotPool
from tray_app.jobs.embeddings import EmbeddingRunner
from tray_app.jobs.engine import Executor
from tray_app.jobs.intake import Jobs
from tray_app.jobs.journal import Journal
from tray_app.jobs.path_timing import PathTimings
from tray_app.jobs.registry import JobRegistry
from tray_app.library.catalog import Catalog, ModelEntry
from tray_app.reach.capability import Signer


class RequestMetrics(Protocol):
    """The Prometheus metrics the routes count into and `/metrics` renders."""

    requests: Any  # a labelled counter: .labels(route=..., outcome=...).inc()

    def render(self) -> bytes: ...


class WorkerActions(Protocol):
    """A worker as the control API acts on it (its supervisor owns its state)."""

    @property
    def pid(self) -> int | None: ...

    async def start(self) -> Any: ...

    async def stop(self) -> Any: ...

    async def restart(self, reason: str) -> Any: ...

    async def arm_fault(self, kind: str, after_tokens: int) -> dict[str, Any]:
        """RuntimeError when the worker cannot take the fault now (e.g. it is down)."""
        ...


class ModelLibrary(Protocol):
    """The library of models as the routes show and load them."""

    @property
    def catalog(self) -> Catalog: ...

    @property
    def plans(self) -> Mapping[str, Any]: ...

    def status(self, plan_set: PlanSet, in_flight: Callable[[str], int]) -> list[ModelStatus]: ...

    def roles(self, entry: ModelEntry) -> dict[str, str]: ...

    def busy(self, name: str) -> int: ...

    async def load(self, entry: ModelEntry, device: str, wait: float) -> bool: ...

    async def unload(self, name: str, devices: tuple[str, ...] = ..., *, if_idle: bool = ...) -> bool: ...


class ConfigChange(Protocol):
    @property
    def applied(self) -> list[str]: ...

    @property
    def needs_restart(self) -> list[str]: ...

    @property
    def restarted(self) -> bool: ...


class ServiceView(Protocol):
    """Everything `server/` reads or asks: one narrow view of the service."""

    jobs: Jobs
    registry: JobRegistry
    executor: Executor
    embeddings: EmbeddingRunner
    journal: Journal
    slots: SlotPool
    bus: EventBus
    path_timings: PathTimings
    admin_token: str
    signer: Signer  # the phone's Approve/Reject links and the status page's login (reach.capability)

    @property
    def cfg(self) -> Config: ...

    @property
    def metrics(self) -> RequestMetrics: ...

    @property
    def model_names(self) -> set[str]: ...

    @property
    def model_id(self) -> str: ...

    @property
    def started_at(self) -> float: ...

    @property
    def enable_faults(self) -> bool: ...

    @property
    def catalog(self) -> Catalog: ...

    @property
    def library(self) -> ModelLibrary: ...

    @property
    def plan_set(self) -> PlanSet: ...

    @property
    def workers(self) -> Mapping[str, WorkerActions]: ...

    @property
    def simulated_device(self) -> SimulatedDevice | None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def caps(self) -> dict[str, int]: ...

    def status(self) -> ServiceStatus: ...

    def worker_status(self, role: str) -> WorkerStatus: ...

    def replan(self) -> PlanSet: ...

    async def yield_gpu(self, wait: bool = True) -> dict[str, Any]:
        """Give the GPU to other programs (drain, then stop the GPU workers); the GPU path after it."""
        ...

    def resume_gpu(self) -> dict[str, Any]:
        """Take the GPU back as soon as the main plan fits; the GPU path after it."""
        ...

    def device_history(self, since: float | None = None) -> dict[str, Any]:
        """The device watcher's ring of readings, oldest first."""
        ...

    async def read_device(self) -> PlanSet:
        """Read the device now; the plans after it (planned again if others' memory moved)."""
        ...

    async def take_config(self, fresh: Config, *, restart: bool) -> ConfigChange: ...

    async def change_config(
        self, changes: dict[str, dict[str, Any]], *, restart: bool
    ) -> tuple[ConfigChange, list[str]]: ...
