"""The job engine over stand-ins for its effects (fast tier): the real job registry, journal, event bus and
slot pool, a scripted relay and stand-in workers. Each case here is also covered through real worker
processes elsewhere; these pin the decisions the executor makes at each step (issue 14)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.engine_parts import engine_context
from tests.support.prompts import ScriptedPrompts
from tray_app.contract.events import EventBus
from tray_app.engine.argv import PROMPT_BATCH
from tray_app.jobs import policy
from tray_app.jobs.admission import SlotPool
from tray_app.jobs.assemble import Assembler
from tray_app.jobs.context import EngineHooks
from tray_app.jobs.embeddings import EmbeddingRunner
from tray_app.jobs.engine import Executor
from tray_app.jobs.journal import Journal
from tray_app.jobs.outcomes import Ended, Finished, JobError, JobFailed, Outcome, Piece
from tray_app.jobs.registry import Job, JobRegistry, new_id
from tray_app.jobs.relay import Chunk, UpstreamError
from tray_app.jobs.worker_port import CpuSpeed, ExecutorSettings
from tray_app.server.streaming import outcome_bytes

Step = dict[str, Any] | Exception


@dataclass
class StandInWorker:
    role: str
    state: str = "ready"
    base_url: str | None = "http://127.0.0.1:9"
    pid: int | None = 4242
    last_failure: dict[str, Any] | None = None
    request_headers: dict[str, str] = field(default_factory=dict)
    unhealthy: list[str] = field(default_factory=list)

    async def ensure_ready(self, timeout: float) -> bool:
        return self.state == "ready"

    def mark_unhealthy(self, reason: str, kind: str, *, pid: int | None = None) -> None:
        self.unhealthy.append(kind)

    async def failure_of(self, pid: int, timeout: float) -> dict[str, Any] | None:
        return None

    def note_tokens(self, count: int) -> None:
        pass


@dataclass
class DispatchedRequest:
    """What ScriptedRelay.dispatch hands out in place of a written request: whether it was dropped."""

    url: str
    aborted: bool = False

    def abort(self) -> None:
        self.aborted = True


class ScriptedRelay:
    """Answers the n-th attempt with the n-th script: chunks, then optionally an exception."""

    def __init__(self, *scripts: list[Step]) -> None:
        self.scripts = list(scripts)
        self.handed = 0
        self.bodies: list[dict[str, Any]] = []
        self.dispatched: list[DispatchedRequest] = []
        self.taken_up: list[DispatchedRequest | None] = []  # per attempt: the dispatched request it read
        self.prepared: list[tuple[str, int]] = []  # per prepare_next: the url, and chunks handed out by then

    def prepare_next(self, url: str) -> None:
        self.prepared.append((url, self.handed))

    def dispatch(self, url: str, body: bytes, headers: dict[str, str]) -> DispatchedRequest:
        self.dispatched.append(DispatchedRequest(url))
        return self.dispatched[-1]

    async def stream(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        first: float,
        every: float,
        sent: DispatchedRequest | None = None,
    ) -> AsyncGenerator[Chunk, None]:
        self.taken_up.append(sent)
        self.bodies.append(json.loads(body))
        for step in self.scripts.pop(0):
            if isinstance(step, Exception):
                raise step
            self.handed += 1
            yield Chunk(json.dumps(step), step, 0.0, 0.0)


def chat_chunk(content: str | None = None, tool: bool = False, finish: str | None = None) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if tool:
        call = {"index": 0, "id": "call_1", "type": "function"}
        delta["tool_calls"] = [{**call, "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]
    return {
        "id": "c1",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


CPU_FAST = policy.CpuState(
    enabled=True, ready=True, ram_ok=True, tokens_per_second=1000.0, n_ctx_per_seq=4096
)
CPU_SLOW = policy.CpuState(enabled=True, ready=True, ram_ok=True, tokens_per_second=0.01, n_ctx_per_seq=4096)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    opened = Journal(tmp_path / "journal.sqlite3")
    yield opened
    opened.close()


Factory = Callable[..., tuple[Executor, JobRegistry, dict[str, StandInWorker]]]


@pytest.fixture
def make_executor(journal: Journal) -> Factory:
    def make(
        relay: ScriptedRelay,
        cpu: policy.CpuState = CPU_FAST,
        prompts: ScriptedPrompts | None = None,
        mirror: HeldPrompt | None = None,
        **settings: Any,
    ) -> tuple[Executor, JobRegistry, dict[str, StandInWorker]]:
        bus = EventBus()
        registry = JobRegistry(journal, bus)
        workers = {"gpu": StandInWorker("gpu"), "cpu": StandInWorker("cpu", pid=4343)}

        async def cpu_state(time_left: float, role: str | None = "cpu") -> policy.CpuState:
            return cpu

        executor = Executor(
            engine_context(registry, SlotPool({"gpu": 2, "cpu": 2}, queue_limit=8), relay, workers.get),
            ExecutorSettings(
                policy=policy.Settings(**settings.pop("policy", {})),
                stall_seconds=5.0,
                queue_timeout=5.0,
                cpu_tokens_per_second=0.0,
                **settings,
            ),
            EngineHooks(cpu_state, lambda model: prompts or ScriptedPrompts()),
            mirror,  # type: ignore[arg-type]
        )
        return executor, registry, workers

    return make


def new_job(registry: JobRegistry, *, stream: bool = True, **body: Any) -> Job:
    job = Job(
        id=new_id("job"),
        request_id="req-1",
        kind="chat",
        body={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "seed": 1, **body},
        stream=stream,
        background=False,
        body_hash="h",
        idempotency_key=None,
        prompt_tokens=5,
        max_tokens=16,
        deadline=1e12,
    )
    registry.add(job)
    return job


async def run(executor: Executor, job: Job, deliver: bool = True) -> list[Outcome]:
    return [outcome async for outcome in executor.run(job, deliver=deliver)]


def ended_with(outcomes: list[Outcome]) -> JobError:
    """The error the stream ends with: the last outcome, an Ended."""
    last = outcomes[-1]
    assert isinstance(last, Ended), outcomes
    return last.error


def text_of(outcomes: list[Outcome]) -> str:
    deltas = [o.obj["choices"][0].get("delta") or {} for o in outcomes if isinstance(o, Piece)]
    return "".join(delta.get("content") or "" for delta in deltas)


async def test_an_error_inside_the_router_ends_the_job_instead_of_leaving_it_running(
    make_executor: Factory,
) -> None:
    executor, registry, _ = make_executor(ScriptedRelay([chat_chunk("Hel"), RuntimeError("a bug")]))
    job = new_job(registry)
    outcomes = await run(executor, job)
    assert job.state == "failed" and job.final
    assert job.error is not None and job.error["code"] == "internal_error"
    error = ended_with(outcomes)  # the client is told, not left hanging
    assert (error.status, error.code, text_of(outcomes)) == (500, "internal_error", "Hel")


async def test_a_background_job_with_an_internal_error_is_failed_too(make_executor: Factory) -> None:
    executor, registry, _ = make_executor(ScriptedRelay([KeyError("a bug")]))
    job = new_job(registry, stream=False)
    await executor.drain(job)
    assert (job.state, (job.error or {}).get("code")) == ("failed", "internal_error")
    assert job.finished.is_set()


async def test_a_delivered_tool_call_is_recorded_on_the_job_and_in_the_journal(
    make_executor: Factory, journal: Journal
) -> None:
    crash = UpstreamError("exited", "connection dropped")
    executor, registry, _ = make_executor(ScriptedRelay([chat_chunk(tool=True), crash]))
    job = new_job(registry, tools=[{"type": "function", "function": {"name": "get_weather"}}])
    outcomes = await run(executor, job)
    assert job.state == "failed" and job.effects_delivered
    assert ended_with(outcomes).code == policy.EFFECTS_DELIVERED
    journal.flush()
    stored = journal.job(job.id)
    assert stored is not None and stored.effects_delivered


@pytest.mark.parametrize(
    "shape",
    [{"response_format": {"type": "json_object"}}, {"logprobs": True, "top_logprobs": 2}],
    ids=["schema", "log probabilities"],
)
async def test_a_stream_with_a_shape_is_not_resumed_without_it(
    make_executor: Factory, shape: dict[str, Any]
) -> None:
    crash = UpstreamError("exited", "connection dropped")
    relay = ScriptedRelay([chat_chunk('{"a"'), crash], [chat_chunk(": 1}", finish="stop")])
    executor, registry, _ = make_executor(relay)
    job = new_job(registry, **shape)
    outcomes = await run(executor, job)
    assert job.state == "failed" and len(relay.bodies) == 1  # no second attempt without the format
    assert ended_with(outcomes).code == policy.CONSTRAINED_STREAM_STARTED


async def test_a_plain_stream_is_still_resumed_on_the_cpu(make_executor: Factory) -> None:
    crash = UpstreamError("exited", "connection dropped")
    resumed = {"id": "c2", "choices": [{"index": 0, "text": " is blue.", "finish_reason": "stop"}]}
    relay = ScriptedRelay([chat_chunk("The sea"), crash], [resumed])  # a completion continues the text
    executor, registry, _ = make_executor(relay)
    job = new_job(registry)
    outcomes = await run(executor, job)
    assert (job.state, job.worker, len(relay.bodies)) == ("completed", "cpu", 2)
    assert relay.bodies[1]["prompt"].endswith("The sea") and relay.bodies[1]["return_progress"] is False
    assert text_of(outcomes) == "The sea is blue."
    finished = outcomes[-1]
    assert isinstance(finished, Finished) and finished.result["failsoft"]["attempts"] == 2


async def test_the_cpu_speed_sample_counts_the_cpus_own_tokens_only(make_executor: Factory) -> None:
    """The speed the policy estimates CPU runs with: a resumed answer's part the GPU wrote, and the time
    before the CPU's first token (a cold start, the prompt read), are not the CPU's generation."""
    gpu_part = [chat_chunk(word) for word in ("One", " two", " three", " four", " five", " six")]
    cpu_part = [
        {"id": "c2", "choices": [{"index": 0, "text": word, "finish_reason": None}]}
        for word in (" seven", " eight", " nine", " ten", " eleven")
    ]
    relay = ScriptedRelay([*gpu_part, UpstreamError("exited", "connection dropped")], cpu_part)
    executor, registry, _ = make_executor(relay)
    samples: list[tuple[int, float]] = []
    executor.cpu_speed.record = lambda tokens, seconds: samples.append((tokens, seconds))  # type: ignore[method-assign]
    job = new_job(registry)
    await run(executor, job)
    assert job.state == "completed" and job.worker == "cpu"
    # 5 CPU chunks: 4 tokens generated after its first one, timed from that first one (the whole answer
    # was 11 tokens, and its time included the GPU's attempt).
    assert [tokens for tokens, _ in samples] == [4]


async def test_a_resumed_answer_keeps_to_the_requests_budget_when_a_chunk_carried_several_tokens(
    make_executor: Factory,
) -> None:
    # The client has "The sea" from one chunk, two tokens: the CPU may write 16 - 2 more, not 16 - 1.
    crash = UpstreamError("exited", "connection dropped")
    resumed = {"id": "c2", "choices": [{"index": 0, "text": " is blue.", "finish_reason": "stop"}]}
    relay = ScriptedRelay([chat_chunk("The sea"), crash], [resumed])
    executor, registry, _ = make_executor(relay, prompts=ScriptedPrompts({"The sea": 2}))
    await run(executor, new_job(registry))
    assert relay.bodies[1]["max_tokens"] == 14
    relay = ScriptedRelay([chat_chunk("The"), chat_chunk(" sea"), crash], [resumed])
    executor, registry, _ = make_executor(relay, prompts=ScriptedPrompts({"The sea": 1}))
    await run(executor, new_job(registry))
    assert relay.bodies[1]["max_tokens"] == 14  # two chunks are two tokens, whatever a recount says


@pytest.mark.parametrize(
    ("prompt_tokens", "progress"), [(5, False), (PROMPT_BATCH, False), (PROMPT_BATCH + 1, True)]
)
async def test_progress_events_are_asked_for_only_when_the_prompt_takes_more_than_one_step(
    make_executor: Callable[..., tuple[Executor, JobRegistry, Journal]], prompt_tokens: int, progress: bool
) -> None:
    """llama-server reads up to one logical batch per step: a prompt that fits one step would only get a
    progress event at its start and one just before the first token, which that token would wait for."""
    crash = UpstreamError("exited", "connection dropped")
    resumed = {"id": "c2", "choices": [{"index": 0, "text": " is blue.", "finish_reason": "stop"}]}
    relay = ScriptedRelay([chat_chunk("The sea"), crash], [resumed])
    executor, registry, _ = make_executor(relay)
    job = new_job(registry)
    job.prompt_tokens = prompt_tokens
    await run(executor, job)
    first, resumed_body = relay.bodies
    assert first["stream"] is True and first["return_progress"] is progress
    # The continuation reads the prompt and the one token delivered: at PROMPT_BATCH, one step too many.
    assert resumed_body["return_progress"] is (prompt_tokens + 1 > PROMPT_BATCH)


async def test_the_approval_backlog_is_bounded(make_executor: Factory) -> None:
    executor, registry, _ = make_executor(ScriptedRelay(), CPU_SLOW, max_pending_approvals=2)
    decision = policy.Decision("approval", policy.CPU_TOO_SLOW, 120.0)
    first, second, third = (new_job(registry, stream=False) for _ in range(3))
    assert executor.desk.request_approval(first, decision) is None
    assert executor.desk.request_approval(second, decision) is None
    refused = executor.desk.request_approval(third, decision)
    assert refused is not None and refused.reason == policy.APPROVAL_BACKLOG_FULL
    assert third.state == "queued"  # untouched: the caller refuses it with the reason
    assert executor.desk.approve(first)  # approved but still in line for the CPU: it still takes a place
    assert executor.desk.request_approval(third, decision) is not None
    registry.fail(second, "rejected", {"message": "rejected by the user", "code": "rejected"})
    assert executor.desk.request_approval(third, decision) is None
    assert registry.count("awaiting_approval") == 1 and executor.desk.approval_backlog() == 2


async def test_a_failure_that_needs_approval_beyond_the_backlog_is_refused_with_the_reason(
    make_executor: Factory,
) -> None:
    crash = UpstreamError("exited", "connection dropped")
    executor, registry, _ = make_executor(ScriptedRelay([crash]), CPU_SLOW, max_pending_approvals=1)
    waiting = new_job(registry, stream=False)
    assert (
        executor.desk.request_approval(waiting, policy.Decision("approval", policy.CPU_TOO_SLOW, 99.0))
        is None
    )
    job = new_job(registry, stream=False)
    job.deadline = 0.0  # the client cannot wait: the CPU run would need approval
    await executor.drain(job)
    assert (job.state, (job.error or {}).get("code")) == ("failed", policy.APPROVAL_BACKLOG_FULL)


def test_the_http_layer_renders_outcomes_as_openai_events(journal: Journal) -> None:
    registry = JobRegistry(journal, EventBus())
    job = new_job(registry)
    piece = outcome_bytes(job, Piece(chat_chunk("Hi")))
    assert piece.startswith(b"data: {") and json.loads(piece[6:])["choices"][0]["delta"] == {"content": "Hi"}
    last = outcome_bytes(job, Finished({"usage": {"total_tokens": 3}}, "c1", 1, "m")).split(b"\n\n")
    assert json.loads(last[0][6:])["failsoft"]["job_id"] == job.id and last[1] == b"data: [DONE]"
    error = outcome_bytes(job, Ended(JobError(503, "cpu_too_slow", "too slow", details={"job_id": job.id})))
    body = json.loads(error.split(b"\n\n")[0][6:])
    assert body["error"] == {
        "message": "too slow",
        "type": "service_unavailable",
        "param": None,
        "code": "cpu_too_slow",
        "job_id": job.id,
    }


class ScriptedPost:
    """A relay for whole answers: the n-th call gets the n-th answer (or raises it)."""

    def __init__(self, *answers: dict[str, Any] | Exception) -> None:
        self.answers = list(answers)
        self.urls: list[str] = []

    async def post(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> bytes:
        self.urls.append(url)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return json.dumps(answer).encode()


VECTORS = {"object": "list", "data": [{"index": 0, "embedding": [0.1, 0.2]}], "usage": {"prompt_tokens": 2}}


def embedding_runner(journal: Journal, relay: ScriptedPost) -> tuple[EmbeddingRunner, JobRegistry, Any]:
    registry = JobRegistry(journal, EventBus())
    workers = {
        "gpu-embed": StandInWorker("gpu-embed", base_url="http://gpu"),
        "cpu-embed": StandInWorker("cpu-embed", base_url="http://cpu", pid=4444),
    }
    settings = ExecutorSettings(policy.Settings(), 5.0, 5.0, 0.0, model_id="model.gguf")
    slots = SlotPool({"gpu-embed": 1, "cpu-embed": 1}, queue_limit=4)
    runner = EmbeddingRunner(engine_context(registry, slots, relay, workers.get), settings)
    return runner, registry, workers


def embedding_job(registry: JobRegistry) -> Job:
    job = new_job(registry, stream=False)
    job.body = {"input": ["hello"], "encoding_format": "float"}
    return job


async def test_embeddings_fail_over_once_and_the_journal_keeps_no_vectors(journal: Journal) -> None:
    relay = ScriptedPost(UpstreamError("exited", "connection dropped"), VECTORS)
    runner, registry, workers = embedding_runner(journal, relay)
    job = embedding_job(registry)
    answer = await runner.run(job)
    assert relay.urls == ["http://gpu/v1/embeddings", "http://cpu/v1/embeddings"]
    assert answer["data"] == VECTORS["data"] and answer["model"] == "model.gguf"
    assert answer["failsoft"] == {**job.failsoft(), "worker": "cpu", "attempts": 2}
    assert (job.state, job.fallback_reason) == ("completed", "exited")
    assert workers["gpu-embed"].unhealthy == ["exited"]  # its supervisor restarts it
    assert job.result is not None and "data" not in job.result and job.result["dimensions"] == 2


async def test_an_embedding_the_worker_refuses_is_the_clients_error_without_failover(
    journal: Journal,
) -> None:
    relay = ScriptedPost(UpstreamError("client_error", "input is too long", status=400))
    runner, registry, workers = embedding_runner(journal, relay)
    job = embedding_job(registry)
    with pytest.raises(JobFailed) as failed:
        await runner.run(job)
    assert (failed.value.error.status, failed.value.error.code) == (400, "invalid_request")
    assert len(relay.urls) == 1 and not workers["gpu-embed"].unhealthy and job.state == "failed"


async def test_the_first_attempt_reads_the_request_its_handler_dispatched(make_executor: Factory) -> None:
    relay = ScriptedRelay([chat_chunk("Hi", finish="stop")])
    executor, registry, _ = make_executor(relay)
    job = new_job(registry)
    executor.dispatch(job)
    assert text_of(await run(executor, job)) == "Hi"
    (dispatched,) = relay.dispatched
    assert dispatched.url == "http://127.0.0.1:9/v1/chat/completions"
    assert relay.taken_up == [dispatched] and not dispatched.aborted  # read, not sent a second time


async def test_a_replay_sends_its_own_request(make_executor: Factory) -> None:
    crash = UpstreamError("exited", "the worker closed the connection")
    relay = ScriptedRelay([crash], [chat_chunk("Hi", finish="stop")])
    executor, registry, _ = make_executor(relay)
    job = new_job(registry)
    executor.dispatch(job)
    assert text_of(await run(executor, job)) == "Hi"
    assert relay.taken_up == [relay.dispatched[0], None]  # the CPU attempt wrote a request of its own


async def test_a_dispatched_request_of_a_job_that_ended_first_is_dropped(make_executor: Factory) -> None:
    relay = ScriptedRelay()
    executor, registry, _ = make_executor(relay)
    job = new_job(registry)
    executor.dispatch(job)
    registry.fail(job, "cancelled", {"message": "gone", "code": "cancelled"}, "client_disconnected")
    await run(executor, job)
    assert relay.dispatched[0].aborted and relay.taken_up == []  # the worker sees the request go away


async def test_nothing_is_dispatched_to_a_worker_that_is_not_ready(make_executor: Factory) -> None:
    relay = ScriptedRelay([chat_chunk("Hi", finish="stop")])
    executor, registry, workers = make_executor(relay)
    workers["gpu"].state = "starting"
    executor.dispatch(new_job(registry))
    assert relay.dispatched == []


def role_chunk() -> dict[str, Any]:
    return {**chat_chunk(), "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}


def events_of(job: Job, outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """What a streamed client reads, event by event (without the last chunk and [DONE])."""
    wire = b"".join(outcome_bytes(job, o) for o in outcomes if isinstance(o, Piece))
    return [json.loads(event[6:]) for event in wire.split(b"\n\n") if event]


async def test_the_role_travels_with_the_first_token(make_executor: Factory) -> None:
    relay = ScriptedRelay([role_chunk(), chat_chunk("Hi"), chat_chunk(finish="stop")])
    executor, registry, _ = make_executor(relay)
    job = new_job(registry)
    outcomes = await run(executor, job)
    pieces = [o for o in outcomes if isinstance(o, Piece)]
    assert pieces[0].output and [p.obj for p in pieces[0].before] == [role_chunk()]  # one outcome, not two
    deltas = [event["choices"][0]["delta"] for event in events_of(job, outcomes)]
    assert deltas == [{"role": "assistant"}, {"content": "Hi"}, {}]


async def test_an_answer_with_no_output_still_announces_its_role(make_executor: Factory) -> None:
    executor, registry, _ = make_executor(ScriptedRelay([role_chunk(), chat_chunk(finish="length")]))
    job = new_job(registry)
    outcomes = await run(executor, job)
    assert job.state == "completed" and text_of(outcomes) == ""
    finishes = [event["choices"][0]["finish_reason"] for event in events_of(job, outcomes)]
    assert finishes == [None, "length"]


async def test_a_role_announced_before_a_crash_goes_out_once(make_executor: Factory) -> None:
    """The GPU announced the role, then failed before its first token: the announcement still reaches the
    client, ahead of the CPU's answer, and the CPU's own announcement is not sent a second time."""
    crash = UpstreamError("exited", "connection dropped")
    relay = ScriptedRelay([role_chunk(), crash], [role_chunk(), chat_chunk("Hi"), chat_chunk(finish="stop")])
    executor, registry, _ = make_executor(relay)
    job = new_job(registry)
    outcomes = await run(executor, job)
    assert (job.state, job.worker) == ("completed", "cpu")
    deltas = [event["choices"][0]["delta"] for event in events_of(job, outcomes)]
    assert deltas == [{"role": "assistant"}, {"content": "Hi"}, {}]


async def test_the_next_connection_is_prepared_once_the_client_has_its_first_token(
    make_executor: Factory,
) -> None:
    role = {**chat_chunk(), "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
    relay = ScriptedRelay([role, chat_chunk("Hi"), chat_chunk(" there"), chat_chunk(finish="stop")])
    executor, registry, _ = make_executor(relay)
    outcomes: list[Outcome] = []
    async for outcome in executor.run(new_job(registry), deliver=True):
        if isinstance(outcome, Piece) and outcome.output and not text_of(outcomes):
            assert relay.prepared == []  # not before the first token has reached its reader
        outcomes.append(outcome)
    # Once, right after the first token (the second chunk, after the role) was taken up; not per token.
    assert relay.prepared == [("http://127.0.0.1:9/v1/chat/completions", 2)]
    assert text_of(outcomes) == "Hi there"


def reasoning_chunk(text: str) -> dict[str, Any]:
    return {
        **chat_chunk(),
        "choices": [{"index": 0, "delta": {"reasoning_content": text}, "finish_reason": None}],
    }


async def test_a_thinking_models_reasoning_reaches_the_client_and_its_answer(make_executor: Factory) -> None:
    relay = ScriptedRelay(
        [
            role_chunk(),
            reasoning_chunk("Two and"),
            reasoning_chunk(" two."),
            chat_chunk("4"),
            chat_chunk(finish="stop"),
        ]
    )
    executor, registry, _ = make_executor(relay)
    job = new_job(registry)
    outcomes = await run(executor, job)
    deltas = [event["choices"][0]["delta"] for event in events_of(job, outcomes)]
    assert deltas == [
        {"role": "assistant"},
        {"reasoning_content": "Two and"},
        {"reasoning_content": " two."},
        {"content": "4"},
        {},
    ]
    message = job.result["choices"][0]["message"] if job.result else {}
    assert (message["reasoning_content"], message["content"]) == ("Two and two.", "4")


async def test_a_stream_that_failed_mid_thought_is_continued_by_the_cpu_without_repeats(
    make_executor: Factory,
) -> None:
    """The delivered reasoning counts as delivered output: the CPU continues it as an assistant message,
    and the continuation's repeat of it (llama-server's) is cut before anything reaches the client."""
    crash = UpstreamError("exited", "connection dropped")
    continued = [
        role_chunk(),
        reasoning_chunk("Two and two"),
        reasoning_chunk(" make four."),
        chat_chunk("4"),
    ]
    relay = ScriptedRelay(
        [role_chunk(), reasoning_chunk("Two and"), crash], [*continued, chat_chunk(finish="stop")]
    )
    executor, registry, _ = make_executor(relay)
    job = new_job(registry)
    outcomes = await run(executor, job)
    assert (job.state, job.worker, len(relay.bodies)) == ("completed", "cpu", 2)
    resumed = relay.bodies[1]
    assert resumed["messages"][-1] == {"role": "assistant", "content": "", "reasoning_content": "Two and"}
    assert "prompt" not in resumed and resumed["max_tokens"] == 15
    deltas = [event["choices"][0]["delta"] for event in events_of(job, outcomes)]
    assert deltas == [
        {"role": "assistant"},
        {"reasoning_content": "Two and"},
        {"reasoning_content": " two"},
        {"reasoning_content": " make four."},
        {"content": "4"},
        {},
    ]
    assert all(event["id"] == "c1" for event in events_of(job, outcomes))


async def test_a_stream_that_delivered_only_reasoning_follows_the_stream_rule(make_executor: Factory) -> None:
    crash = UpstreamError("exited", "connection dropped")
    relay = ScriptedRelay([reasoning_chunk("Two and"), crash], [reasoning_chunk("Two and two.")])
    executor, registry, _ = make_executor(relay, policy={"stream_after_content": "error"})
    job = new_job(registry)
    outcomes = await run(executor, job)
    assert job.state == "failed" and len(relay.bodies) == 1
    assert ended_with(outcomes).code == policy.STREAM_STARTED


@pytest.mark.parametrize(
    ("shape", "resumed"),
    [
        ({"tools": [{"type": "function", "function": {"name": "add"}}]}, True),
        ({"response_format": {"type": "json_object"}}, True),
        ({"grammar": 'root ::= "x"'}, False),  # from the first token: a continuation cannot promise it
    ],
)
async def test_a_shape_is_kept_when_only_reasoning_was_delivered(
    make_executor: Factory, shape: dict[str, Any], resumed: bool
) -> None:
    """Tools and a response format shape the answer still to come, and llama-server's continuation applies
    them to it: a stream that had sent only reasoning goes on with them."""
    crash = UpstreamError("exited", "connection dropped")
    relay = ScriptedRelay([reasoning_chunk("Add"), crash], [reasoning_chunk("Add them."), chat_chunk("{}")])
    executor, registry, _ = make_executor(relay)
    job = new_job(registry, **shape)
    outcomes = await run(executor, job)
    if resumed:
        assert (job.state, len(relay.bodies)) == ("completed", 2)
        assert {key: relay.bodies[1][key] for key in shape} == shape
    else:
        assert job.state == "failed" and len(relay.bodies) == 1
        assert ended_with(outcomes).code == policy.CONSTRAINED_STREAM_STARTED


async def test_a_request_with_its_own_prefill_is_resumed_as_a_completion(make_executor: Factory) -> None:
    """llama-server continues one trailing assistant message, not two: after a prefill of the request's own
    the plain continuation of the text so far is used."""
    crash = UpstreamError("exited", "connection dropped")
    resumed = {"id": "c2", "choices": [{"index": 0, "text": " more.", "finish_reason": "stop"}]}
    relay = ScriptedRelay([reasoning_chunk("Hm"), chat_chunk("Yes"), crash], [resumed])
    executor, registry, _ = make_executor(relay)
    prefill = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Well,"}]
    job = new_job(registry, messages=prefill)
    await run(executor, job)
    assert (job.state, job.worker) == ("completed", "cpu")
    assert relay.bodies[1]["prompt"].endswith("Yes")


def test_a_gpu_ready_without_an_address_does_not_spin_the_loop(make_executor: Factory) -> None:
    """Left from the last review: a GPU worker "ready" with no address yet sent each attempt straight back
    to the failure path, which tried the GPU again at once: a loop with no await that nothing could stop.
    Run in a thread of its own, so a spinning loop fails the test instead of hanging it."""
    relay = ScriptedRelay([chat_chunk("never sent")])
    executor, registry, workers = make_executor(relay, cpu=policy.CpuState(False, False, False, 0.0, 0))
    workers["gpu"].base_url = None
    job = new_job(registry)
    outcomes: list[Outcome] = []

    def drive() -> None:
        async def go() -> None:
            outcomes.extend(await run(executor, job))

        asyncio.run(go())

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "the executor kept going round"
    assert job.final and relay.bodies == [] and isinstance(outcomes[-1], Ended)


async def test_the_first_tokens_deadline_allows_for_a_slow_cpus_prompt_read(make_executor: Factory) -> None:
    """Left from the last review: 15 s + prompt/100 killed a CPU worker reading 2,000 tokens at 20-40
    tokens/s as hung. Now the CPU's measured speed sets it, and an unknown one allows for the slowest."""
    executor, _, _ = make_executor(ScriptedRelay())
    assert 2000 / executor._prompt_rate("cpu") >= 2000 / 5.0  # unknown: 5 tokens/s at least
    executor.cpu_speed.record(40, 10.0)  # 4 tokens/s generated: prompts read at 16/s with the margin
    assert executor._prompt_rate("cpu") == pytest.approx(4 * policy.PROMPT_SPEEDUP / 2)
    assert executor._prompt_rate("cpu@notes") == executor._prompt_rate("cpu")
    assert executor._prompt_rate("gpu") == 100.0
    executor.cpu_speed.record_prompt(300, 10.0)  # measured reading (the mirror's, llama-server's timings)
    assert executor._prompt_rate("cpu") == pytest.approx(30 / 2)


class Followed:
    """What the executor hands a mirror about one GPU attempt: each chunk, and the whole answer."""

    def __init__(self) -> None:
        self.chunks = 0
        self.answer: str | None = None

    def grew(self, progress: object) -> None:
        self.chunks += 1

    def finished(self, assembler: Assembler) -> None:
        self.answer = assembler.text


class HeldPrompt:
    """A CPU mirror that holds every job's whole prompt: what the executor asks of it at a failure."""

    def __init__(self) -> None:
        self.speed = CpuSpeed()
        self.on_cpu: list[str] = []
        self.followed: list[Followed] = []

    def follow(self, job: Job, prompts: object, streaming: bool) -> Followed:
        self.followed.append(Followed())
        return self.followed[-1]

    async def settle(self, job: Job) -> None:
        self.on_cpu.append(job.id)

    def taken(self, job: Job) -> None:
        pass

    def held(self, job: Job) -> int:
        return job.prompt_tokens


async def test_a_mirrored_prompt_runs_on_the_cpu_without_asking_and_says_what_was_cached(
    make_executor: Factory,
) -> None:
    """A long prompt on a slow CPU would wait for approval; mirrored, it runs at once, and the answer's
    failsoft object carries llama-server's `cache_n` from the CPU attempt."""
    crash = UpstreamError("exited", "connection dropped")
    timings = {"cache_n": 3999, "prompt_n": 1, "prompt_ms": 9}
    cpu_answer = {**chat_chunk("Hi.", finish="stop"), "timings": timings}
    relay = ScriptedRelay([crash], [cpu_answer])
    slow = policy.CpuState(enabled=True, ready=True, ram_ok=True, tokens_per_second=10.0, n_ctx_per_seq=8192)
    mirror = HeldPrompt()
    executor, registry, _ = make_executor(
        relay, slow, mirror=mirror, policy={"fallback": "approval", "auto_approve_seconds": 10.0}
    )
    job = new_job(registry, stream=False)
    job.prompt_tokens = 4000  # 4000/8 tokens at 10 tokens/s: 50 s unread, under 10 s mirrored
    await executor.drain(job)
    assert (job.state, job.worker) == ("completed", "cpu")
    assert job.result is not None and job.result["failsoft"]["cpu_cached_tokens"] == 3999
    assert mirror.on_cpu == [job.id]  # the mirror stops reading for a job the CPU now reads itself


async def test_the_mirror_hears_a_gpu_answer_grow_and_end(make_executor: Factory) -> None:
    """Each chunk the client gets (a resume would continue after it), then the whole answer (the
    conversation's next turn starts with it)."""
    relay = ScriptedRelay([chat_chunk("The sea"), chat_chunk(" is blue.", finish="stop")])
    mirror = HeldPrompt()
    executor, registry, _ = make_executor(relay, mirror=mirror)
    job = new_job(registry)
    await run(executor, job)
    assert job.state == "completed" and len(mirror.followed) == 1
    assert (mirror.followed[0].chunks, mirror.followed[0].answer) == (2, "The sea is blue.")
