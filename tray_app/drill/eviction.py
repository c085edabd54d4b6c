"""Scenario j: the eviction rule, against the real service. One library model loaded and idle, then a
request for another while a stream on the main model runs: the idle one is unloaded, the stream goes on.
Then, with a stream in flight on the other model, a request for the first: the busy model is never
unloaded, and the first goes down the ladder (library.max_loaded 1 in the drill's own service)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from tray_app.contract.status import ModelStatus, ServiceStatus, WorkerStatus
from tray_app.drill.bodies import BASE, PROMPT_ALLOWANCE, STORY, ask
from tray_app.drill.client import Answer, DrillError
from tray_app.drill.context import DrillContext, count_answer, read_trace
from tray_app.drill.expected import EVICTED_FOR, TITLES
from tray_app.drill.ladder_checks import (
    gone_problems,
    kept_problems,
    overlap_problem,
    pid_alive,
    record_problems,
)
from tray_app.drill.ladder_plan import (
    LadderModels,
    eviction_skip,
    find_models,
    ladder_why,
    model_context,
    model_named,
    on_device,
    while_busy,
)
from tray_app.drill.records import Expectation, JobTrace, ScenarioRecord, answerer

# A stream that must still run while the drill does something else: as long as its slot allows, up to this
# (while a model loads; while a stand-in answers, which is quicker).
LONG_STREAM_CAP = 1024
BUSY_STREAM_CAP = 512
LOAD_WAIT = 120.0


@dataclass(frozen=True)
class Overlap:
    """A request answered while a stream ran: both answers, their jobs, and the service's status after."""

    stream: Answer
    asked: Answer
    stream_trace: JobTrace | None
    asked_trace: JobTrace | None
    status: ServiceStatus


async def eviction(ctx: DrillContext) -> ScenarioRecord:
    record = ScenarioRecord("j", TITLES["j"], True)
    models = find_models(ctx.status)
    record.skipped = eviction_skip(ctx.status, models, ctx.max_loaded)
    if record.skipped or isinstance(models, str) or models.other is None:
        return record
    busy = while_busy(models, ctx.stand_in_enabled, ctx.max_loaded)
    if isinstance(busy, str):
        record.skipped = busy
        return record
    await ctx.client.wait_ready()
    await _unload_library(ctx)
    streams: list[asyncio.Task[Answer]] = []
    try:
        await _evict(ctx, record, models, models.other, busy, streams)
    finally:
        for task in streams:
            task.cancel()  # only the ones still running: the drill could not finish
    return record


async def _evict(
    ctx: DrillContext,
    record: ScenarioRecord,
    models: LadderModels,
    other: ModelStatus,
    busy: tuple[Expectation, str],
    streams: list[asyncio.Task[Answer]],
) -> None:
    a_name, b_name = models.big["name"], other["name"]
    start = time.time()

    # 1. A loaded and idle; a stream on the main model in flight; a request for B: A makes room.
    await ctx.client.model_action(a_name, "load", {"device": "gpu"})
    status = await ctx.client.status()
    a_pid = _gpu_pid(status, model_named(status, a_name))
    main_pid = (status["workers"].get("gpu") or {}).get("pid")
    main_body = _long_stream("default", int(status["caps"]["n_ctx_per_seq"]))
    first = await _ask_during_stream(
        ctx, record, streams, (main_body, "the main model's stream"), b_name, start
    )
    a_worker = _worker(first.status, model_named(first.status, a_name), "gpu")
    a_gone = gone_problems(a_name, a_pid, a_worker, pid_alive(a_pid))
    main = next(model for model in ctx.status["models"] if model["main"])
    main_after = first.status["workers"].get("gpu")
    record.failed_checks += a_gone
    record.failed_checks += kept_problems(main["name"], main_pid, main_after, first.stream_trace, "gpu")
    record.failed_checks += overlap_problem("the main model's stream", first.stream, first.asked)

    # 2. B busy with a stream; a request for A: B is kept, A goes down the ladder.
    second, b_kept = await _ask_while_busy(ctx, record, streams, first.status, (a_name, b_name), start)

    _judge(ctx, record, (a_name, b_name), first, second, busy, evicted=not a_gone, kept=b_kept)
    b = model_named(first.status, b_name)
    record.notes += [
        f"{a_name}'s GPU worker (pid {a_pid}) {'still there' if a_gone else 'gone'} once {b_name} answered",
        f"the main model's stream: {_attempts(first.stream_trace)}, GPU worker pid {main_pid} before, "
        f"{(second.status['workers'].get('gpu') or {}).get('pid')} after; it ended "
        f"{first.stream.ended_at - first.asked.ended_at:.2f}s after {b_name} answered",
        f"{b_name}'s stream: {_attempts(second.stream_trace)}, its GPU worker pid "
        f"{_gpu_pid(first.status, b)} before, {_gpu_pid(second.status, b)} after; it ended "
        f"{second.stream.ended_at - second.asked.ended_at:.2f}s after {a_name} was answered",
    ]
    record.total_seconds = round(time.time() - start, 3)


async def _ask_while_busy(
    ctx: DrillContext,
    record: ScenarioRecord,
    streams: list[asyncio.Task[Answer]],
    status: ServiceStatus,
    names: tuple[str, str],
    start: float,
) -> tuple[Overlap, bool]:
    """B (`names[1]`) busy with a stream, a request for A: B must keep its worker and its stream, and A must
    not land on the GPU. The overlap, and whether B was kept."""
    a_name, b_name = names
    b = model_named(status, b_name)
    b_role = b["workers"].get("gpu", f"gpu@{b_name}")
    b_pid = _gpu_pid(status, b)
    b_body = _long_stream(b_name, model_context(status, b), BUSY_STREAM_CAP)
    second = await _ask_during_stream(ctx, record, streams, (b_body, f"{b_name}'s stream"), a_name, start)
    b_kept = kept_problems(b_name, b_pid, _worker(second.status, b, "gpu"), second.stream_trace, b_role)
    record.failed_checks += b_kept
    record.failed_checks += overlap_problem(f"{b_name}'s stream", second.stream, second.asked)
    if "gpu" in model_named(second.status, a_name)["where"].split("+"):
        record.failed_checks.append(f"{a_name} was loaded on the GPU while {b_name} was busy")
    return second, not b_kept


async def _ask_during_stream(
    ctx: DrillContext,
    record: ScenarioRecord,
    streams: list[asyncio.Task[Answer]],
    stream: tuple[dict[str, Any], str],
    model: str,
    start: float,
) -> Overlap:
    """Start the stream (body, what it is) and, once its text flows, ask `model`; both jobs accounted for
    once they have ended, then the service's status."""
    body, what = stream
    streams.append(await _stream_in_flight(ctx, body, what))
    asked = await ctx.client.chat(ask(model))
    streamed = await streams[-1]
    asked_trace = await _job(ctx, record, asked, start)
    stream_trace = await _job(ctx, record, streamed, start)
    return Overlap(streamed, asked, stream_trace, asked_trace, await ctx.client.status())


def _judge(
    ctx: DrillContext,
    record: ScenarioRecord,
    names: tuple[str, str],
    first: Overlap,
    second: Overlap,
    busy: tuple[Expectation, str],
    *,
    evicted: bool,
    kept: bool,
) -> None:
    """The record's decision, who answered and why: B where A was (its own GPU worker), A while B is busy."""
    a_name, b_name = names
    a_expected, a_by = busy
    b_route, b_reason, b_state = _decision(first.asked_trace)
    a_route, a_reason, a_state = _decision(second.asked_trace)
    record.expected = (
        f"{b_name}: {EVICTED_FOR.describe()}, idle {a_name} unloaded; busy {b_name} kept, "
        f"{a_name}: {a_expected.describe()}"
    )
    record.actual = (
        f"{b_name}: {b_route} ({b_reason or '-'}) -> {b_state}, {a_name} "
        f"{'unloaded' if evicted else 'NOT unloaded'}; {b_name} {'kept' if kept else 'NOT kept'}, "
        f"{a_name}: {a_route} ({a_reason or '-'}) -> {a_state}"
    )
    record.decision_ok = EVICTED_FOR.met_by(b_route, b_reason, b_state) and a_expected.met_by(
        a_route, a_reason, a_state
    )
    record.answered_by = "; ".join(
        answerer(answer.failsoft) or "nobody" for answer in (first.asked, second.asked)
    )
    record.expected_answerer = f"{on_device(b_name, 'gpu')}; {a_by}"
    limit = ctx.max_loaded if ctx.max_loaded is not None else "?"
    record.decision_why = (
        f"library.max_loaded {limit}: loading {b_name} unloaded the idle {a_name} (least recently used "
        f"first, never one with a request in flight); with {b_name} busy nothing could make room for "
        f"{a_name}, so {a_name} could not use the GPU: {ladder_why(a_route, a_reason, a_name)}"
    )
    record.set_output(second.asked.text)
    answers = (first.stream, first.asked, second.stream, second.asked)
    record.connection_survived = all(answer.connection_ok for answer in answers)


async def _unload_library(ctx: DrillContext) -> None:
    """Every library model idle and unloaded, so the GPU holds only what this scenario loads."""
    status = await ctx.client.status()
    for model in status["models"]:
        if not model["main"] and model["where"] != "not loaded":
            await ctx.client.model_action(model["name"], "unload")

    async def all_unloaded() -> bool:
        current = await ctx.client.status()
        return all(model["main"] or model["where"] == "not loaded" for model in current["models"])

    await ctx.client.wait_for(all_unloaded, "the library models to unload", LOAD_WAIT, 0.2)


async def _stream_in_flight(ctx: DrillContext, body: dict[str, Any], what: str) -> asyncio.Task[Answer]:
    """Start a stream and return once its first text has arrived (the job is running on its worker)."""
    flowing = asyncio.Event()

    async def mark(answer: Answer) -> bool:
        if answer.first_content_at:
            flowing.set()
        return False

    task = asyncio.create_task(ctx.client.stream_chat(body, stop_after=mark))
    waiter = asyncio.create_task(flowing.wait())
    await asyncio.wait({task, waiter}, timeout=LOAD_WAIT, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if not flowing.is_set() and not task.done():
        task.cancel()
        raise DrillError(f"{what} sent no text within {LOAD_WAIT:.0f}s")
    return task


def _long_stream(model: str, n_ctx_per_seq: int, cap: int = LONG_STREAM_CAP) -> dict[str, Any]:
    """A stream that runs to its max_tokens (as long as the slot allows, up to `cap`)."""
    tokens = max(min(n_ctx_per_seq - PROMPT_ALLOWANCE, cap), 16)
    return {**BASE, "model": model, "messages": STORY, "max_tokens": tokens, "ignore_eos": True}


async def _job(ctx: DrillContext, record: ScenarioRecord, answer: Answer, start: float) -> JobTrace | None:
    """Account for one of the scenario's requests: lost, doubled, its job and first error."""
    trace = await count_answer(ctx, record, answer)
    if answer.error:
        record.notes.append(f"error to the client: {answer.error.get('code')}: {answer.error.get('message')}")
    if trace is not None:
        record.job_ids.append(answer.job_id)
        record.final_states.append(trace.state)
        read_trace(record, trace, start)
        record.failed_checks += record_problems(answer.failsoft, trace.record)
    return trace


def _decision(trace: JobTrace | None) -> tuple[str, str, str]:
    if trace is None:
        return "none", "", "unknown"
    return (*trace.decision(), trace.state)


def _worker(status: ServiceStatus, model: ModelStatus, device: str) -> WorkerStatus | None:
    if model["main"]:
        return status["workers"].get(device)
    role = model["workers"].get(device) or f"{device}@{model['name']}"
    return status["library_workers"].get(role)


def _gpu_pid(status: ServiceStatus, model: ModelStatus) -> int | None:
    return (_worker(status, model, "gpu") or {}).get("pid")


def _attempts(trace: JobTrace | None) -> str:
    if trace is None:
        return "no job"
    return ", ".join(trace.attempt_words()) or "no attempt"
