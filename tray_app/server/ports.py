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
from tray_app.jobs.intake import Jobs
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


class GenerationView(Protocol):
    """What the dialects' routes read (OpenAI's, Ollama's, Anthropic's, Responses, the jobs API): the jobs
    facade, the models a request may name, the settings."""

    jobs: Jobs
    admin_token: str

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
    def catalog(self) -> Catalog: ...

    @property
    def library(self) -> ModelLibrary: ...

    @property
    def plan_set(self) -> PlanSet: ...

    def caps(self) -> dict[str, int]: ...

    def worker_status(self, role: str) -> WorkerStatus: ...


class StatusView(Protocol):
    """What the status page and the phone's action links read: the status, the recent events, the jobs
    waiting for a decision, the signer of links and logins."""

    jobs: Jobs
    bus: EventBus
    admin_token: str
    signer: Signer  # the phone's Approve/Reject links and the status page's login (reach.capability)

    @property
    def cfg(self) -> Config: ...

    def status(self) -> ServiceStatus: ...


class ControlView(GenerationView, StatusView, Protocol):
    """The control API: what the others read, and the service's own levers (workers, GPU, config)."""

    @property
    def enable_faults(self) -> bool: ...

    @property
    def workers(self) -> Mapping[str, WorkerActions]: ...

    @property
    def simulated_device(self) -> SimulatedDevice | None: ...

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


class ServiceView(ControlView, Protocol):
    """The whole service as the app factory takes it: every view, and its start and stop."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
