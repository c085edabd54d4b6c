"""Issue 14, finding 2: a job cancelled while it waited for a CPU slot or a cold CPU start later started and
completed (counted both cancelled and completed). The registry is the only writer of a job's state, terminal
states are final, and the executor does not start a job that ended while it waited."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from tests.support.engine_parts import engine_context
from tests.support.prompts import ScriptedPrompts
from tray_app.contract.events import ApprovalNeeded, Event, EventBus, JobStateChanged
from tray_app.jobs import policy
from tray_app.jobs import registry as jobs_registry
from tray_app.jobs.admission import SlotPool
from tray_app.jobs.context import EngineHooks
from tray_app.jobs.engine import Executor
from tray_app.jobs.journal import Journal
from tray_app.jobs.registry import FINAL_STATES, STATES, TRANSITIONS, Job, JobRegistry, can_move, new_id
from tray_app.jobs.relay import Chunk
from tray_app.jobs.worker_port import ExecutorSettings


def make_job(**overrides: Any) -> Job:
    values: dict[str, Any] = {
        "id": new_id("job"),
        "request_id": "req",
        "kind": "completion",
        "body": {"prompt": "1, 2, 3,", "max_tokens": 2},
        "stream": False,
        "background": True,
        "body_hash": "hash",
        "idempotency_key": None,
        "prompt_tokens": 4,
        "max_tokens": 2,
        "deadline": 1e12,
    }
    values.update(overrides)
    return Job(**values)


@pytest.fixture
def events() -> list[Event]:
    return []


@pytest.fixture
def registry(journal: Journal, events: list[Event]) -> JobRegistry:
    bus = EventBus()
    bus.add_listener(events.append)
    return JobRegistry(journal, bus)


def states_of(events: list[Event], job: Job) -> list[str]:
    return [event.state for event in events if isinstance(event, JobStateChanged) and event.job_id == job.id]


# ------------------------------------------------------------------------------------------ the table
def test_final_states_have_no_way_out() -> None:
    for state in FINAL_STATES:
        assert TRANSITIONS[state] == frozenset()
        for other in STATES:
            assert not can_move(state, other)
    assert set(TRANSITIONS) == set(STATES)
    assert not can_move("queued", "completed")  # an answer needs an attempt
    assert not can_move("awaiting_approval", "running")  # approval queues the job first
    assert not can_move("awaiting_approval", "completed")
    assert can_move("awaiting_approval", "queued")
    assert can_move("running", "awaiting_approval")


# ------------------------------------------------------------------------------------------ the registry
def test_a_cancelled_job_cannot_start_or_complete(registry: JobRegistry, events: list[Event]) -> None:
    job = make_job()
    registry.add(job)
    assert registry.fail(job, "cancelled", {"message": "cancelled by request"}, "cancelled_by_request")
    assert registry.start_attempt(job, "cpu") == 0
    assert job.state == "cancelled"
    assert job.attempts == 0
    assert not registry.complete(job, {"choices": []})
    assert job.result is None
    assert not registry.fail(job, "failed", {"message": "late failure"})
    assert not registry.set_state(job, "queued", "approved")
    assert not registry.await_approval(job, 5.0, "cpu_too_slow")
    assert registry.counters["cancelled"] == 1
    assert registry.counters["completed"] == 0
    assert registry.counters["failed"] == 0
    assert states_of(events, job) == ["queued", "cancelled"]
    assert not [event for event in events if isinstance(event, ApprovalNeeded)]


def test_two_final_transitions_cannot_both_win(registry: JobRegistry) -> None:
    job = make_job()
    registry.add(job)
    assert registry.start_attempt(job, "gpu") == 1
    assert registry.complete(job, {"choices": [{"text": "4"}]})
    assert not registry.fail(job, "cancelled", {"message": "too late"})
    assert not registry.complete(job, {"choices": [{"text": "again"}]})
    assert job.state == "completed"
    assert job.result == {"choices": [{"text": "4"}]}
    assert sum(registry.counters[state] for state in FINAL_STATES) == 1


def test_a_job_waiting_for_approval_does_not_start_before_it_is_approved(registry: JobRegistry) -> None:
    job = make_job()
    registry.add(job)
    assert registry.await_approval(job, 30.0, "cpu_too_slow")
    assert registry.start_attempt(job, "cpu") == 0
    assert not registry.complete(job, {"choices": []})
    assert registry.set_state(job, "queued", "approved")
    assert registry.start_attempt(job, "cpu") == 1
    assert job.state == "running"
    assert registry.complete(job, {"choices": []})


def test_fail_only_ends_jobs(registry: JobRegistry) -> None:
    job = make_job()
    registry.add(job)
    with pytest.raises(ValueError):
        registry.fail(job, "completed", {"message": "not an answer"})
    assert not registry.set_state(job, "cancelled")  # final states only through complete() and fail()
    assert job.state == "queued"


def test_the_journal_keeps_the_first_final_state(registry: JobRegistry, journal: Journal) -> None:
    job = make_job()
    registry.add(job)
    registry.fail(job, "cancelled", {"message": "cancelled by request"})
    registry.start_attempt(job, "cpu")
    registry.complete(job, {"choices": []})
    journal.flush()
    stored = journal.job(job.id)
    assert stored is not None
    assert stored.state == "cancelled"
    assert stored.result is None
    assert journal.attempts(job.id) == []


# ------------------------------------------------------------------------------------------ the executor
class ColdWorker:
    """A CPU worker that is still loading: `ensure_ready` returns only when the test lets it."""

    def __init__(self) -> None:
        self.loaded = asyncio.Event()
        self.waiting = asyncio.Event()
        self.state = "starting"
        self.base_url: str | None = None
        self.pid: int | None = 1234
        self.last_failure: dict[str, Any] | None = None
        self.request_headers: dict[str, str] = {}

    async def ensure_ready(self, timeout: float) -> bool:
        self.waiting.set()
        await self.loaded.wait()
        self.state, self.base_url = "ready", "http://127.0.0.1:9"
        return True

    def mark_unhealthy(self, reason: str, kind: str, *, pid: int | None = None) -> None:
        self.state = "unhealthy"

    def note_tokens(self, count: int) -> None:
        pass


class CountingRelay:
    """Stands in for the relay: each call is one generation on the worker."""

    def __init__(self) -> None:
        self.calls = 0

    def prepare_next(self, url: str) -> None:
        pass  # no connections here

    async def stream(
        self, url: str, body: bytes, headers: dict[str, str], *timeouts: float
    ) -> AsyncGenerator[Chunk]:
        self.calls += 1
        for text in ("4", ","):
            obj = {
                "id": "c",
                "object": "text_completion",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "text": text, "finish_reason": None}],
            }
            yield Chunk("", obj, 0.0, 0.0)


def make_executor(
    registry: JobRegistry, worker: ColdWorker, relay: CountingRelay, slots: SlotPool
) -> Executor:
    settings = ExecutorSettings(
        policy=policy.Settings(fallback="approval", stream_after_content="resume", auto_approve_seconds=0.0),
        stall_seconds=5.0,
        queue_timeout=5.0,
        cpu_tokens_per_second=10.0,
    )

    async def cpu_state(time_left: float) -> policy.CpuState:
        return policy.CpuState(True, True, True, 10.0, 2048)

    workers = {"cpu": worker}
    context = engine_context(registry, slots, relay, workers.get)
    return Executor(context, settings, EngineHooks(cpu_state, lambda model: ScriptedPrompts()))  # type: ignore[arg-type]


async def test_a_job_cancelled_during_a_cold_cpu_start_never_runs(registry: JobRegistry) -> None:
    worker, relay = ColdWorker(), CountingRelay()
    executor = make_executor(registry, worker, relay, SlotPool({"gpu": 1, "cpu": 1}, 8))
    runner = asyncio.create_task(executor.desk.run_approved())
    try:
        job = make_job(route="cpu")
        registry.add(job)
        registry.await_approval(job, 30.0, "cpu_too_slow")
        assert executor.desk.approve(job)
        await asyncio.wait_for(worker.waiting.wait(), 5)  # the approved run waits for the cold CPU worker
        assert registry.fail(job, "cancelled", {"message": "cancelled by request"}, "cancelled_by_request")
        worker.loaded.set()
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert job.state == "cancelled"
        assert relay.calls == 0  # nothing was generated for it
        assert job.attempts == 0
        assert registry.counters["completed"] == 0
        assert registry.counters["cancelled"] == 1

        # The runner is still alive and runs the next approved job to completion.
        second = make_job(route="cpu")
        registry.add(second)
        registry.await_approval(second, 30.0, "cpu_too_slow")
        executor.desk.approve(second)
        await asyncio.wait_for(second.finished.wait(), 5)
        assert second.state == "completed"
        assert relay.calls == 1
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_a_job_cancelled_while_it_waits_for_a_cpu_slot_never_runs(registry: JobRegistry) -> None:
    worker, relay = ColdWorker(), CountingRelay()
    worker.loaded.set()
    slots = SlotPool({"gpu": 1, "cpu": 1}, 8)
    executor = make_executor(registry, worker, relay, slots)
    held = await slots.acquire("cpu", "someone-else", 1.0)  # the only CPU slot is busy
    job = make_job(route="cpu")
    registry.add(job)
    registry.await_approval(job, 30.0, "cpu_too_slow")
    executor.desk.approve(job)
    runner = asyncio.create_task(executor.desk.run_approved())
    try:
        for _ in range(10):
            await asyncio.sleep(0.01)
        assert registry.fail(job, "cancelled", {"message": "cancelled by request"}, "cancelled_by_request")
        slots.release("cpu", held)
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert job.state == "cancelled"
        assert relay.calls == 0
        assert registry.counters["completed"] == 0
        assert slots.in_flight("cpu") == 0  # the slot it took went back
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


def test_idempotency_keys_are_owned_by_the_registry_and_bounded_with_its_jobs(
    registry: JobRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15: the key map had two writers (the router and the restart path) and grew for the whole run.
    The registry registers a job's key when it adds the job and drops it with the job it keeps no longer
    (older keys are answered from the journal)."""
    monkeypatch.setattr(jobs_registry, "KEEP_FINISHED", 2)
    made = [make_job(idempotency_key=f"key-{n}") for n in range(3)]
    for job in made:
        registry.add(job)
        assert registry.by_key(job.idempotency_key or "") is job
        registry.fail(job, "cancelled", {"message": "cancelled", "code": "cancelled"})
    assert registry.by_key("key-0") is None  # evicted with its job
    assert [registry.by_key(f"key-{n}") for n in (1, 2)] == made[1:]
    retry = make_job(idempotency_key="key-2")
    registry.add(retry)
    assert registry.by_key("key-2") is retry  # the latest job under the key
