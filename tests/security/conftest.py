"""Fast security tests: the real ASGI app (create_app) over a stand-in service with the real job registry,
journal and event bus, and no workers. Requests go through starlette's TestClient, addressed to
http://127.0.0.1:8750 so that Host and the scope's server port are what a local client sends."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.support.in_process_prompts import FixedPrompts
from tray_app import config, paths
from tray_app.contract.events import EventBus
from tray_app.jobs import policy
from tray_app.jobs.admission import SlotPool
from tray_app.jobs.context import JobsContext
from tray_app.jobs.intake import Jobs
from tray_app.jobs.journal import Journal
from tray_app.jobs.registry import Job, JobRegistry
from tray_app.jobs.relay import Relay
from tray_app.jobs.worker_port import CpuSpeed
from tray_app.library.catalog import Catalog, ModelEntry
from tray_app.reach import admin_token
from tray_app.reach.capability import Signer
from tray_app.server.routes import create_app

BASE_URL = "http://127.0.0.1:8750"
ADMIN_TOKEN = "admin-token-of-the-test"
JOB_BODY: dict[str, Any] = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}


class StandInExecutor:
    """The executor's effects the intake uses: nothing runs; `drain` records the job it was asked to run."""

    def __init__(self, registry: JobRegistry, spawned: list[str]) -> None:
        self.registry = registry
        self.spawned = spawned
        self.approved: list[str] = []
        self.settings = SimpleNamespace(policy=policy.Settings())
        self.cpu_speed = CpuSpeed()  # never measured: a route to the CPU asks the config's speed
        self.desk = self  # the approval desk's part, here in one stand-in

    def dispatch(self, job: Job) -> None:
        return None

    async def drain(self, job: Job, held_slot: float | None = None) -> None:
        self.spawned.append(job.id)

    def request_approval(self, job: Job, decision: Any, stand_in_offer: str | None = None) -> None:
        self.registry.set_route(job, "cpu")
        self.registry.await_approval(job, decision.estimated_seconds, decision.reason, stand_in_offer)

    def approve(self, job: Job) -> bool:
        if job.state != "awaiting_approval":
            return False
        self.registry.set_state(job, "queued", "approved")
        self.approved.append(job.id)
        return True


@dataclass
class StandInService:
    """What the app's routes use of `Service`, without workers or a tokenizer: `spawn` records the jobs it
    was asked to run (an execution), and nothing runs them."""

    cfg: config.Config
    journal: Journal
    bus: EventBus = field(default_factory=EventBus)
    enable_faults: bool = False
    spawned: list[str] = field(default_factory=list)
    model_names: set[str] = field(default_factory=lambda: {"default", "model.gguf"})
    model_id: str = "model.gguf"
    tool_call_opener: str = ""  # what the engine starts a tool call with (none: these tests send no tools)
    admin_token: str = ADMIN_TOKEN

    def __post_init__(self) -> None:
        self.registry = JobRegistry(self.journal, self.bus)
        self.executor = StandInExecutor(self.registry, self.spawned)
        # Links and the page's login sessions (in memory here), bound to this admin token.
        self.signer = Signer(b"signing key of the test".ljust(32, b"."), owner=ADMIN_TOKEN)
        self.workers = {"gpu": SimpleNamespace(state="ready"), "cpu": SimpleNamespace(state="ready")}
        self.plan_set = SimpleNamespace(
            gpu=SimpleNamespace(n_ctx_per_seq=2048), device=SimpleNamespace(simulated=True)
        )
        self.tokens = FixedPrompts(5)
        main = ModelEntry(self.model_id, Path(self.model_id), ("default",), main=True)
        self.catalog = Catalog([main])
        self.library = SimpleNamespace(
            roles=lambda entry: {"gpu": "gpu", "cpu": "cpu"},
            touch=lambda name, keep_alive=None: None,
        )
        self.slots = SlotPool({"gpu": 4, "cpu": 4}, 8)
        self.jobs = self.facade()

    def facade(self) -> Jobs:
        """The jobs facade over this service's parts (made again by a subclass that replaces them)."""
        context = JobsContext(
            self.registry,
            self.journal,
            self.slots,
            Relay(),
            self.bus,
            self.workers.get,  # type: ignore[arg-type]
            lambda: self.cfg,
        )
        return Jobs(context, self, self.executor)  # type: ignore[arg-type]

    # What the intake asks of the models (jobs.intake.Models).
    def find(self, name: str | None) -> ModelEntry | None:
        return self.catalog.find(name)

    def stand_in_for(self, entry: ModelEntry) -> ModelEntry | None:
        return None  # one model: no stand-in

    def roles(self, entry: ModelEntry) -> dict[str, str]:
        return {"gpu": "gpu", "cpu": "cpu"}

    def n_ctx_per_seq(self, entry: ModelEntry, device: str) -> int:
        return 2048

    def cpu_plan(self, role: str | None) -> Any:
        return SimpleNamespace(n_ctx_per_seq=8192, weights_bytes=1, kv_bytes=1, compute_bytes=1)

    def touch(self, name: str, keep_alive: float | None) -> None:
        return None

    async def load(self, entry: ModelEntry, device: str, wait: float) -> bool:
        return False

    def tool_call_opener_for(self, model: str) -> str:
        return self.tool_call_opener

    def prompts(self, model: str = "") -> Any:
        return self.tokens

    def file_prompts(self, model_file: str) -> Any:
        return self.tokens

    def status(self) -> dict[str, Any]:
        return {"stand_in": True}

    def worker_status(self, role: str) -> dict[str, Any]:
        return {"state": self.workers[role].state}


def make_config(**server: Any) -> config.Config:
    return config.from_dict({"server": server} if server else {})


@pytest.fixture
def journal(isolated_dirs: Path) -> Iterator[Journal]:
    opened = Journal(paths.data_dir() / "journal.sqlite3")
    yield opened
    opened.close()


def client_for(app: Any, **kwargs: Any) -> TestClient:
    """A client as the tray is one: it sends the admin token (`admin=False`: as any other local program)."""
    headers = admin_token.headers(ADMIN_TOKEN) if kwargs.pop("admin", True) else {}
    return TestClient(app, base_url=kwargs.pop("base_url", BASE_URL), headers=headers, **kwargs)


@pytest.fixture
def make_service(journal: Journal) -> Any:
    def make(**server: Any) -> StandInService:
        return StandInService(make_config(**server), journal)

    return make


@pytest.fixture
def service(make_service: Any) -> StandInService:
    svc: StandInService = make_service()
    return svc


@pytest.fixture
def client(service: StandInService) -> Iterator[TestClient]:
    with client_for(create_app(service, manage_lifecycle=False)) as test_client:  # type: ignore[arg-type]
        yield test_client
