"""Review N7: jobs the journal held as unfinished came back after a restart on the main model (their library
model forgotten) and forced onto the GPU route. Now they come back on the model their body names, routed
again. Over the real journal and registry; the models and the executor's run are stand-ins.

After a crash, background jobs were failed with no_cpu_worker instead of resumed: they were routed before
the service had even told its workers to start (both read as stopped), and the CPU's readiness was read
before the wait for it. Now a resumed job waits for its GPU worker's start; interactive jobs, whose client
is gone, end saying so."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support.waits import wait_until_async
from tray_app import config
from tray_app.contract.events import EventBus
from tray_app.contract.vocabulary import Reason
from tray_app.jobs.admission import SlotPool
from tray_app.jobs.context import HostHooks, JobsContext
from tray_app.jobs.intake import Jobs
from tray_app.jobs.journal import Journal
from tray_app.jobs.policy import Settings
from tray_app.jobs.registry import Job, JobRegistry
from tray_app.jobs.relay import Relay
from tray_app.jobs.resume import ATTEMPT_CUT_OFF, CLIENT_LOST
from tray_app.library.catalog import Catalog, ModelEntry

MAIN = ModelEntry("main.gguf", Path("main.gguf"), (), main=True)
# A library model that runs on the CPU only: a job for it can never take the GPU route.
CPU_ONLY = ModelEntry("notes-7b", Path("notes.gguf"), (), main=False, devices=("cpu",))


class TenTokens:
    """A model's tokenizer that counts every prompt as ten tokens."""

    async def count(self, kind: str, body: dict[str, Any]) -> int:
        return 10


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

    def prompts(self, model: str = "") -> Any:
        return TenTokens()

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


def jobs_over(
    journal: Journal,
    executor: RecordingExecutor,
    workers: dict[str, Any] | None = None,
    cpu_speed_ready: Callable[[], asyncio.Task[None] | None] = lambda: None,
) -> tuple[Jobs, JobRegistry]:
    bus = EventBus()
    registry = JobRegistry(journal, bus)
    ready = SimpleNamespace(state="ready")

    def worker(role: str) -> Any:
        return workers.get(role) if workers is not None else ready

    slots = SlotPool({"gpu": 1, "cpu": 1, "cpu@notes-7b": 1}, 8)
    context = JobsContext(registry, journal, slots, Relay(), bus, worker, lambda: config.Config())
    jobs = Jobs(
        context,
        Models(),  # type: ignore[arg-type]
        executor,  # type: ignore[arg-type]
        HostHooks(cpu_speed_ready=cpu_speed_ready),
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


class StartingWorker:
    """A worker as the service has it just after start: stopped (not told to start yet), then settled by
    the test: ready, or failed."""

    def __init__(self) -> None:
        self.state = "stopped"
        self.base_url: str | None = None
        self.settled = asyncio.Event()
        self.waits: list[float] = []

    async def ensure_ready(self, timeout: float) -> bool:
        self.waits.append(timeout)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.settled.wait(), timeout)
        return self.state == "ready"

    def settle(self, state: str) -> None:
        self.state = state
        self.base_url = "http://127.0.0.1:9" if state == "ready" else None
        self.settled.set()


def main_job(job_id: str, *, background: bool = True, stream: bool = False) -> Job:
    body = {"model": "main.gguf", "prompt": "1, 2, 3,", "max_tokens": 120}
    return Job(
        id=job_id,
        request_id=f"req-{job_id}",
        kind="completion",
        body=body,
        stream=stream,
        background=background,
        body_hash="",
        idempotency_key=f"key-{job_id}",
        prompt_tokens=10,
        max_tokens=120,
        deadline=time.monotonic() + 60,
        asked_model="main.gguf",
        models={"gpu": "main.gguf", "cpu": "main.gguf"},
        roles={"gpu": "gpu", "cpu": "cpu"},
    )


def crashed_run(path: Path, running: list[Job], queued: list[Job]) -> None:
    """An earlier run that accepted these jobs and died (no shutdown): the running ones' attempts open."""
    journal = Journal(path)
    _, registry = jobs_over(journal, RecordingExecutor())
    for job in [*running, *queued]:
        registry.add(job)
    for job in running:
        assert registry.start_attempt(job, "gpu") == 1
    journal.flush()
    journal.close()


async def test_a_resumed_background_job_waits_for_its_gpu_worker_to_start(tmp_path: Path) -> None:
    running, queued = main_job("job-running"), main_job("job-queued")
    crashed_run(tmp_path / "journal.sqlite3", [running], [queued])

    restarted = Journal(tmp_path / "journal.sqlite3")
    gpu, cpu = StartingWorker(), StartingWorker()
    executor = RecordingExecutor()
    jobs, registry = jobs_over(restarted, executor, {"gpu": gpu, "cpu": cpu})
    jobs.resume_unfinished()  # as the service does: before its workers' starts were even handled
    for _ in range(20):
        await asyncio.sleep(0)
    resumed = [registry.get("job-running"), registry.get("job-queued")]
    assert all(job is not None and not job.final for job in resumed)
    assert executor.ran == []  # waiting for the GPU worker, not routed off it, not failed
    gpu.settle("ready")
    await asyncio.wait_for(asyncio.gather(*(job.task for job in resumed if job and job.task)), 5)

    assert sorted(executor.ran) == [("job-queued", "gpu", "main.gguf"), ("job-running", "gpu", "main.gguf")]
    assert [job.state for job in resumed if job] == ["running", "queued"]  # neither failed nor refused
    assert gpu.waits and min(gpu.waits) > 10  # as long as a start may take (supervisor.start_timeout)
    # The attempt the dead process left open is closed as cut off; the next one is numbered after it, and
    # the creator's read token still reads the job.
    restarted.flush()
    assert [(a["number"], a["outcome"], a["error"]) for a in restarted.attempts("job-running")] == [
        (1, "cancelled", ATTEMPT_CUT_OFF)
    ]
    first = resumed[0]
    assert first is not None and first.attempts == 1 and first.read_token == running.read_token
    assert first.prompt_tokens == 10  # counted again: the journal keeps no count
    restarted.close()


async def test_a_resumed_job_is_not_refused_for_a_cpu_worker_that_became_ready_meanwhile(
    tmp_path: Path,
) -> None:
    """The GPU worker fails its start; the CPU worker becomes ready while its first speed measurement,
    which the routing waits for, runs. Its readiness is read after that wait: the job runs on the CPU."""
    crashed_run(tmp_path / "journal.sqlite3", [], [main_job("job-1")])
    restarted = Journal(tmp_path / "journal.sqlite3")
    gpu, cpu = StartingWorker(), StartingWorker()
    cpu.state = "starting"
    executor = RecordingExecutor()
    executor.cpu_speed.tokens_per_second = 0.0  # not measured yet
    measuring: list[asyncio.Task[None]] = []

    async def measure() -> None:  # the service's first measurement, once the CPU worker is ready
        cpu.settle("ready")
        executor.cpu_speed.tokens_per_second = 50.0

    def speed_ready() -> asyncio.Task[None]:
        if not measuring:
            measuring.append(asyncio.create_task(measure()))
        return measuring[0]

    jobs, registry = jobs_over(restarted, executor, {"gpu": gpu, "cpu": cpu}, speed_ready)
    jobs.resume_unfinished()
    gpu.settle("failed")
    job = registry.get("job-1")
    assert job is not None and job.task is not None
    await asyncio.wait_for(job.task, 5)

    assert job.error is None, job.error
    assert executor.ran == [("job-1", "cpu", "main.gguf")]
    assert job.fallback_reason == Reason.GPU_UNAVAILABLE
    restarted.close()


async def test_a_background_job_waits_for_a_cpu_worker_still_starting(tmp_path: Path) -> None:
    """With no GPU, a resumed (background) job waits for the CPU worker's start, not a few seconds."""
    crashed_run(tmp_path / "journal.sqlite3", [], [main_job("job-1")])
    restarted = Journal(tmp_path / "journal.sqlite3")
    gpu, cpu = StartingWorker(), StartingWorker()
    cpu.state = "starting"
    executor = RecordingExecutor()
    jobs, registry = jobs_over(restarted, executor, {"gpu": gpu, "cpu": cpu})
    jobs.resume_unfinished()
    gpu.settle("failed")
    job = registry.get("job-1")
    assert job is not None and job.task is not None
    await wait_until_async(lambda: cpu.waits, 5, "the routing to wait for the CPU worker")
    assert not job.final and cpu.waits == [config.Config().supervisor.start_timeout]
    cpu.settle("ready")
    await asyncio.wait_for(job.task, 5)
    assert executor.ran == [("job-1", "cpu", "main.gguf")]
    restarted.close()


@pytest.mark.parametrize(
    ("stream", "running", "state"),
    [
        (False, False, "cancelled"),
        (False, True, "cancelled"),
        (True, False, "cancelled"),
        (True, True, "failed"),
    ],
)
async def test_an_interactive_job_whose_client_is_gone_ends_at_a_restart(
    tmp_path: Path, stream: bool, running: bool, state: str
) -> None:
    job = main_job("job-chat", background=False, stream=stream)
    crashed_run(tmp_path / "journal.sqlite3", [job] if running else [], [] if running else [job])
    restarted = Journal(tmp_path / "journal.sqlite3")
    executor = RecordingExecutor()
    jobs, registry = jobs_over(restarted, executor)
    jobs.resume_unfinished()
    ended = registry.get("job-chat")
    assert ended is not None and ended.task is None and executor.ran == []
    assert ended.state == state
    assert ended.error is not None and ended.error["message"].startswith(CLIENT_LOST)
    assert ended.error["code"] == Reason.SERVICE_RESTARTED
    restarted.flush()
    stored = restarted.job("job-chat")
    assert stored is not None and stored.state == state
    assert all(a["ended_at"] is not None for a in restarted.attempts("job-chat"))
    restarted.close()


async def test_an_interactive_job_in_the_users_hands_goes_on_after_a_restart(tmp_path: Path) -> None:
    """Awaiting approval, it stays there; approved (queued for the CPU), it runs: the user's, not its
    client's."""
    waiting, approved = main_job("job-waiting", background=False), main_job("job-approved", background=False)
    journal = Journal(tmp_path / "journal.sqlite3")
    _, registry = jobs_over(journal, RecordingExecutor())
    for job in (waiting, approved):
        registry.add(job)
        registry.set_route(job, "cpu")
        registry.await_approval(job, 40.0, Reason.APPROVAL_REQUIRED)
    registry.set_state(approved, "queued", "approved")
    journal.flush()
    journal.close()

    restarted = Journal(tmp_path / "journal.sqlite3")
    executor = RecordingExecutor()
    jobs, registry = jobs_over(restarted, executor)
    jobs.resume_unfinished()
    still_waiting, resumed = registry.get("job-waiting"), registry.get("job-approved")
    assert still_waiting is not None and still_waiting.state == "awaiting_approval"
    assert resumed is not None and resumed.task is not None and still_waiting.task is not None
    await asyncio.gather(resumed.task, still_waiting.task)
    assert still_waiting.state == "awaiting_approval" and still_waiting.prompt_tokens == 10
    assert executor.ran == [("job-approved", "gpu", "main.gguf")]
    restarted.close()
