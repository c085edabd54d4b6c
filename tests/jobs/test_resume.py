"""Review N7: jobs the journal held as unfinished came back after a restart on the main model (their library
model forgotten) and forced onto the GPU route. Now they come back on the model their body names, routed
again. Over the real journal and registry; the models and the executor's run are stand-ins."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tray_app import config
from tray_app.contract.events import EventBus
from tray_app.jobs.admission import SlotPool
from tray_app.jobs.intake import Jobs
from tray_app.jobs.journal import Journal
from tray_app.jobs.policy import Settings
from tray_app.jobs.registry import Job, JobRegistry
from tray_app.library.catalog import Catalog, ModelEntry

MAIN = ModelEntry("main.gguf", Path("main.gguf"), (), main=True)
# A library model that runs on the CPU only: a job for it can never take the GPU route.
CPU_ONLY = ModelEntry("notes-7b", Path("notes.gguf"), (), main=False, devices=("cpu",))


class Models:
    catalog = Catalog([MAIN, CPU_ONLY])
    model_names = frozenset({"main.gguf", "notes-7b"})

    def find(self, name: str | None) -> ModelEntry | None:
        return self.catalog.find(name)

    def stand_in_for(self, entry: ModelEntry) -> ModelEntry | None:
        return None

    def roles(self, entry: ModelEntry) -> dict[str, str]:
        return {"gpu": "gpu", "cpu": "cpu"} if entry.main else {"cpu": "cpu@notes-7b"}

    def n_ctx_per_seq(self, entry: ModelEntry, device: str) -> int:
        return 2048 if entry.main or device == "cpu" else 0

    def cpu_plan(self, role: str | None) -> Any:
        return SimpleNamespace(n_ctx_per_seq=2048, weights_bytes=1, kv_bytes=1, compute_bytes=1)

    def count_prompt(self, kind: str, body: dict[str, Any], model: str = "") -> int:
        return 10

    def tool_call_opener_for(self, model: str) -> str:
        return ""

    def grammar_error(self, grammar: str) -> str | None:
        return None

    def touch(self, name: str, keep_alive: float | None) -> None:
        return None

    async def load(self, entry: ModelEntry, device: str, wait: float) -> bool:
        return False


class RecordingExecutor:
    """Records the jobs it is asked to run, and on which worker, instead of running them."""

    def __init__(self) -> None:
        self.settings = SimpleNamespace(policy=Settings(), max_pending_approvals=8)
        self.ran: list[tuple[str, str | None, str]] = []
        self.cpu_speed = SimpleNamespace(tokens_per_second=1000.0)

    async def drain(self, job: Job, held_slot: float | None = None) -> None:
        self.ran.append((job.id, job.worker_role(job.route), job.model))


def jobs_over(journal: Journal, executor: RecordingExecutor) -> tuple[Jobs, JobRegistry]:
    bus = EventBus()
    registry = JobRegistry(journal, bus)
    ready = SimpleNamespace(state="ready")
    jobs = Jobs(
        Models(),  # type: ignore[arg-type]
        registry,
        executor,  # type: ignore[arg-type]
        SlotPool({"gpu": 1, "cpu": 1, "cpu@notes-7b": 1}, 8),
        journal,
        bus,
        lambda role: ready,  # type: ignore[arg-type,return-value]
        lambda: config.Config(),
    )
    return jobs, registry


async def test_a_resumed_job_keeps_its_model_and_is_routed_again(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite3")
    body = {"model": "notes-7b", "messages": [{"role": "user", "content": "Summarise"}], "max_tokens": 50}
    accepted = Job(
        id="job-library",
        request_id="req-1",
        kind="chat",
        body=body,
        stream=False,
        background=True,
        body_hash="",
        idempotency_key=None,
        prompt_tokens=10,
        max_tokens=50,
        deadline=time.monotonic() + 60,
        asked_model="notes-7b",
        models={"cpu": "notes-7b"},
        roles={"cpu": "cpu@notes-7b"},
    )
    _, first_run = jobs_over(journal, RecordingExecutor())
    first_run.add(accepted)
    journal.flush()
    journal.close()

    restarted = Journal(tmp_path / "journal.sqlite3")  # the next run of the service
    executor = RecordingExecutor()
    jobs, registry = jobs_over(restarted, executor)
    jobs.resume_unfinished()
    resumed = registry.get("job-library")
    assert resumed is not None and resumed.task is not None
    await resumed.task
    assert (resumed.asked_model, resumed.roles) == ("notes-7b", {"cpu": "cpu@notes-7b"})
    assert executor.ran == [("job-library", "cpu@notes-7b", "notes-7b")]  # not the main model, not the GPU
    restarted.close()
