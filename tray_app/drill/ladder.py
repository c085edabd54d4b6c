"""Scenarios h to j: the model library's ladder and its eviction rule, against the real service.

The ladder: a request for a model that cannot answer on the GPU goes to its stand-in on the GPU (route gpu,
reason stand_in, never silent: the answer names both models), else to the model's own CPU worker by the
usual policy. h pushes a library model off the GPU with simulated pressure and expects its stand-in; i asks
the same with `X-Failsoft-Stand-In: no` and expects its CPU; j loads one library model while another is
loaded (library.max_loaded 1 in the drill's own service): the idle one is unloaded, a busy one never.

The pure parts (which models, how much VRAM to take, what the policy prescribes, what an eviction must look
like) come first; the scenarios that play them follow.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psutil

from tray_app.budget.sizes import format_size
from tray_app.contract.status import ModelStatus, ServiceStatus, WorkerStatus
from tray_app.drill.client import Answer, DrillError
from tray_app.drill.records import Expectation, JobTrace, ScenarioRecord, answerer
from tray_app.drill.scenarios import (
    BASE,
    PROMPT_ALLOWANCE,
    SEA,
    STORY,
    TITLES,
    DrillContext,
    _finish,
    _read_trace,
    count_answer,
)
from tray_app.jobs import policy
from tray_app.library.eviction import Loaded, make_room

LABEL = "drill-ladder"
ASK_TOKENS = 24  # the ladder's requests: short answers
# A stream that must still run while the drill does something else: as long as its slot allows, up to this
# (while a model loads; while a stand-in answers, which is quicker).
LONG_STREAM_CAP = 1024
BUSY_STREAM_CAP = 512
REFUSE_STAND_IN = {"X-Failsoft-Stand-In": "no"}
LOAD_WAIT = 120.0


# ---------------------------------------------------------------------------------------------- pure
@dataclass(frozen=True)
class LadderModels:
    """The models the scenarios use, from the service's status."""

    big: ModelStatus  # a library model with a stand-in, that may use the GPU
    stand_in: ModelStatus  # its stand-in
    other: ModelStatus | None  # a second library model with a GPU plan (neither of those two), for j


def find_models(status: ServiceStatus) -> LadderModels | str:
    """The first library model with a stand-in (one with a GPU plan before one without), its stand-in and a
    second library model for j; or why there is none (the reason a scenario is skipped)."""
    models = status["models"]
    by_name = {name: model for model in models for name in (model["name"], *model["aliases"])}
    candidates = [
        model
        for model in models
        if not model["main"]
        and model["stand_in"]
        and "gpu" in model["devices"]
        and model["stand_in"] in by_name
    ]
    if not candidates:
        return (
            "the service has no library model with a stand-in that may use the GPU (the drill's own service "
            "adds one; for --url, configure a [[models]] entry with stand_in)"
        )
    big = next((model for model in candidates if model["plan"] is not None), candidates[0])
    stand_in = by_name[str(big["stand_in"])]
    other = next(
        (
            model
            for model in models
            if not model["main"]
            and model["name"] not in (big["name"], stand_in["name"])
            and "gpu" in model["devices"]
            and model["plan"] is not None
        ),
        None,
    )
    return LadderModels(big, stand_in, other)


def model_named(status: ServiceStatus, name: str) -> ModelStatus:
    found = next((model for model in status["models"] if model["name"] == name), None)
    if found is None:
        raise DrillError(f"the service's status has no model {name!r} any more")
    return found


def share_free(status: ServiceStatus) -> int:
    """What the main model's plans leave free on the GPU: the library's share (as the service plans it)."""
    plan = status.get("embeddings_plan") or status["plan"]
    return int(plan.get("free_bytes") or 0)


def gpu_need(model: ModelStatus) -> int | None:
    """What `model` needs of the library's share: 0 for the main model (its own plan); None without a
    GPU plan."""
    if model["main"]:
        return 0
    plan = model["plan"]
    if plan is None:
        return None
    return int(plan["weights_bytes"]) + int(plan["kv_bytes"]) + int(plan["compute_bytes"])


def share_target(models: LadderModels) -> int | str:
    """The library share to leave: less than the big model's weights, not less than what its stand-in needs
    there (nothing for the main model). 0: the big model has no GPU plan even now. A string: why no share
    does it."""
    big, stand_in = models.big, models.stand_in
    if big["plan"] is None:
        return 0
    need = gpu_need(stand_in)
    if need is None:
        return f"the stand-in {stand_in['name']} has no GPU plan either"
    weights = int(big["plan"]["weights_bytes"])
    if need >= weights:
        return (
            f"the stand-in {stand_in['name']} needs {format_size(need)} on the GPU, not less than "
            f"{big['name']}'s weights ({format_size(weights)}): no pressure leaves room for one only"
        )
    return (need + weights) // 2


def pressure_bytes(status: ServiceStatus, models: LadderModels) -> int | str:
    """Simulated VRAM to take so that the big model's weights no longer fit in the library's share while its
    stand-in still does (the main model's plan keeps its size: the share shrinks by what is taken). 0: the big
    model has no GPU plan even now. A string: why no amount does it."""
    target = share_target(models)
    if isinstance(target, str) or not target:
        return target
    return max(share_free(status) - target, 1)


def cpu_context(status: ServiceStatus, model: ModelStatus) -> int:
    """Tokens per request on `model`'s CPU worker (its profile's context over its slots); 0 without one."""
    if model["main"]:
        return int(status["caps"]["cpu_n_ctx"])
    role = model["workers"].get("cpu")
    worker: WorkerStatus = status["library_workers"].get(role, {}) if role else {}
    profile = worker.get("profile") or {}
    return int(profile.get("n_ctx") or 0) // max(int(profile.get("n_parallel") or 1), 1)


def model_context(status: ServiceStatus, model: ModelStatus) -> int:
    """The context one request for `model` may use, as the service counts it: its GPU plan's per slot, else
    its CPU's."""
    if model["main"]:
        return int(status["caps"]["n_ctx_per_seq"])
    plan = model["plan"]
    return int(plan["n_ctx_per_seq"]) if plan is not None else cpu_context(status, model)


def stand_in_available(
    status: ServiceStatus, stand_in: ModelStatus, max_loaded: int | None, busy: tuple[str, ...] = ()
) -> bool:
    """Whether the stand-in can answer on the GPU now: the main model's GPU worker is ready; a library
    model is loaded there, or the eviction rule makes room for it (`busy`: models with a request running)."""
    if stand_in["main"]:
        return (status["workers"].get("gpu") or {}).get("state") == "ready"
    need = gpu_need(stand_in)
    if need is None:
        return False
    if "gpu" in stand_in["where"].split("+"):
        return True
    loaded = [
        Loaded(model["name"], model["vram_bytes"], model["name"] in busy or model["in_flight"] > 0, 0.0)
        for model in status["models"]
        if not model["main"] and model["vram_bytes"] > 0 and model["name"] != stand_in["name"]
    ]
    return make_room(share_free(status), max_loaded or 0, loaded, need).fits


def on_device(model: str, device: str, stand_in_for: str = "") -> str:
    """Who should answer, in the words `records.answerer` uses for who did."""
    return answerer({"model": model, "device": device, "stand_in_for": stand_in_for})


def ladder_expectation(
    ctx: DrillContext,
    status: ServiceStatus,
    asked: ModelStatus,
    stand_in: ModelStatus | None,
    *,
    allowed: bool,
    available: bool,
    max_tokens: int,
) -> tuple[Expectation, str]:
    """What the policy prescribes for a request for `asked` that cannot use the GPU: its stand-in there when
    `policy.stand_in_first` says so, else `asked`'s CPU worker by the CPU policy. (expectation, answerer)."""
    fits = stand_in is not None and PROMPT_ALLOWANCE + max_tokens <= model_context(status, stand_in)
    case = policy.StandInCase(allowed=allowed and stand_in is not None, available=available, fits=fits)
    if stand_in is not None and policy.stand_in_first(case):
        expectation = Expectation("gpu", (policy.STAND_IN,), "completed")
        return expectation, on_device(stand_in["name"], "gpu", asked["name"])
    expectation = ctx.expect_cpu_route(
        PROMPT_ALLOWANCE // 2, max_tokens, model_context(status, asked), cpu_context(status, asked)
    )
    return expectation, on_device(asked["name"], "cpu") if expectation.route == "cpu" else ""


def eviction_skip(status: ServiceStatus, models: LadderModels | str, max_loaded: int | None) -> str:
    """Why scenario j cannot force an eviction against this service; empty when it can."""
    if isinstance(models, str):
        return models
    if models.big["plan"] is None:
        return f"{models.big['name']} has no GPU plan on this device: nothing to load or unload there"
    if models.other is None:
        return (
            "the service has no second library model with a GPU plan (besides "
            f"{models.big['name']} and its stand-in): nothing to evict for"
        )
    need = (gpu_need(models.big) or 0) + (gpu_need(models.other) or 0)
    if max_loaded == 1 or need > share_free(status):
        return ""
    limit = "unknown" if max_loaded is None else str(max_loaded)
    return (
        f"{models.big['name']} and {models.other['name']} fit on the GPU together ({format_size(need)} of a "
        f"{format_size(share_free(status))} share) and library.max_loaded is {limit}: loading one never "
        "unloads the other (the drill's own service sets max_loaded 1)"
    )


def gone_problems(name: str, pid: int | None, worker: WorkerStatus | None, alive: bool) -> list[str]:
    """What is wrong when `name`'s GPU worker (pid `pid` before) should have been unloaded."""
    if pid is None:
        return [f"{name}'s GPU worker had no pid after loading"]
    problems = []
    if worker and worker.get("state") not in ("stopped", "absent", None):
        problems.append(
            f"{name}'s GPU worker is {worker.get('state')} (pid {worker.get('pid')}), not unloaded"
        )
    if alive:
        problems.append(f"{name}'s GPU worker process {pid} is still running")
    return problems


def kept_problems(
    name: str, pid_before: int | None, worker: WorkerStatus | None, trace: JobTrace | None, role: str
) -> list[str]:
    """What is wrong when `name`'s worker `role` should have kept its stream: its job completed in one
    attempt on that worker, and the worker is the same process, still ready."""
    problems = []
    if trace is None:
        problems.append(f"{name}'s stream has no job record")
    elif trace.state != "completed" or [a.get("worker") for a in trace.attempts] != [role]:
        attempts = ", ".join(f"{a.get('worker')} {a.get('outcome')}" for a in trace.attempts) or "none"
        problems.append(f"{name}'s stream: {trace.state}, attempts {attempts} (expected one, on {role})")
    pid_after = (worker or {}).get("pid")
    state = (worker or {}).get("state")
    if pid_before is None or pid_after != pid_before or state != "ready":
        problems.append(f"{name}'s {role} worker: pid {pid_before} before, {pid_after} ({state}) after")
    return problems


def record_problems(failsoft: dict[str, Any] | None, job: dict[str, Any]) -> list[str]:
    """The job record (/v1/jobs/{id}) must name the same model, and the same asked model, as the answer."""
    if not failsoft:
        return []
    problems = []
    for key in ("model", "stand_in_for"):
        if job.get(key) != failsoft.get(key):
            recorded, answered = job.get(key), failsoft.get(key)
            problems.append(
                f"job {job.get('id')}: {key} {recorded!r} in its record, {answered!r} in the answer"
            )
    return problems


def overlap_problem(what: str, stream: Answer, other: Answer) -> list[str]:
    """The stream must still have been running when the other request was answered."""
    if stream.ended_at > other.ended_at and stream.started_at < other.started_at:
        return []
    return [
        f"{what} ended {other.ended_at - stream.ended_at:.2f}s before the request it had to outlive was "
        "answered: this run did not test it (a faster machine needs a longer stream)"
    ]


def pid_alive(pid: int | None) -> bool:
    """A process with this pid runs (a zombie, waiting to be reaped, does not)."""
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# ------------------------------------------------------------------------------------------ helpers
async def _take_the_gpu_away(
    ctx: DrillContext, record: ScenarioRecord, models: LadderModels, size: int
) -> None:
    """Take `size` of simulated VRAM (labelled LABEL) and check the big model lost its GPU plan while the
    main model kept its own. The service re-plans on each take (its figures may have moved since the status
    the size came from: measured buffers replace estimates), so the take is corrected until the share left
    is below the big model's weights."""
    before = share_free(ctx.status)
    weights = int((models.big["plan"] or {}).get("weights_bytes") or 0)
    target = share_target(models)
    for _ in range(3):
        await ctx.client.pressure({"take": str(size), "label": LABEL})  # replaces what LABEL held
        await ctx.refresh()
        left = share_free(ctx.status)
        if left < weights or isinstance(target, str):
            break
        size += left - target
    big = model_named(ctx.status, models.big["name"])
    record.notes.append(
        f"took {format_size(size)} of simulated VRAM: the library's share went from {format_size(before)} to "
        f"{format_size(share_free(ctx.status))}, below {big['name']}'s weights ({format_size(weights)})"
    )
    if share_free(ctx.status) >= weights:
        record.failed_checks.append(
            f"the library's share ({format_size(share_free(ctx.status))}) is not below {big['name']}'s "
            f"weights ({format_size(weights)}) under the pressure"
        )
    if "gpu" in big["workers"]:
        record.failed_checks.append(f"{big['name']} still has a GPU worker after the pressure")
    if not ctx.status["plan"].get("fits"):
        record.failed_checks.append("the main model's plan no longer fits under the pressure")


async def _give_back(ctx: DrillContext, record: ScenarioRecord) -> None:
    released = await ctx.client.pressure({"release": LABEL})
    await ctx.refresh()
    record.notes.append(f"released {format_size(int(released.get('released') or 0))} of simulated VRAM")


def _ladder_setup(ctx: DrillContext, record: ScenarioRecord) -> tuple[LadderModels, int] | None:
    """The models and the pressure for h and i; None (the record says why it is skipped) when they cannot
    run against this service."""
    models = find_models(ctx.status)
    if isinstance(models, str):
        record.skipped = models
        return None
    size = pressure_bytes(ctx.status, models)
    if isinstance(size, str):
        record.skipped = size
        return None
    if size and not (ctx.status.get("device") or {}).get("simulated"):
        record.skipped = (
            f"{models.big['name']} fits on this GPU; pushing it off needs simulated VRAM pressure "
            "(POST /failsoft/debug/pressure), which a real GPU does not take: run with --simulate-vram SIZE"
        )
        return None
    return models, size


def _ask(model: str, max_tokens: int = ASK_TOKENS) -> dict[str, Any]:
    return {**BASE, "model": model, "messages": SEA, "max_tokens": max_tokens}


def _why(route: str, reason: str, asked: str) -> str:
    if reason == policy.STAND_IN:
        return (
            f"{asked} could not answer on the GPU and the request allowed a stand-in: its stand-in answered "
            "there (failsoft.model, stand_in_for and X-Failsoft-Model say so)"
        )
    if route == "cpu":
        return (
            f"{asked} could not answer on the GPU and no stand-in might ({reason}): its own CPU worker, "
            "loaded on demand, by the CPU policy (fast enough for the deadline)"
        )
    if route == "gpu":
        return f"{asked} answered on its own GPU worker"
    return f"{route} ({reason})"


async def _ladder_request(
    ctx: DrillContext, record: ScenarioRecord, models: LadderModels, *, refuse_stand_in: bool
) -> None:
    big = model_named(ctx.status, models.big["name"])
    stand_in = model_named(ctx.status, models.stand_in["name"])
    allowed = ctx.stand_in_enabled and not refuse_stand_in
    available = stand_in_available(ctx.status, stand_in, ctx.max_loaded)
    expectation, expected_by = ladder_expectation(
        ctx, ctx.status, big, stand_in, allowed=allowed, available=available, max_tokens=ASK_TOKENS
    )
    record.expected_answerer = expected_by
    start = time.time()
    headers = REFUSE_STAND_IN if refuse_stand_in else None
    answer = await ctx.client.chat(_ask(big["name"]), headers=headers)
    trace = await _finish(ctx, record, answer, expectation, start)
    if trace is not None:
        route, reason = trace.decision()
        record.decision_why = _why(route, reason, big["name"])
        record.failed_checks += record_problems(answer.failsoft, trace.record)


# ------------------------------------------------------------------------------------------ h, i
async def stand_in_under_pressure(ctx: DrillContext) -> ScenarioRecord:
    record = ScenarioRecord("h", TITLES["h"], False)
    return await _under_pressure(ctx, record, refuse_stand_in=False)


async def cpu_under_pressure(ctx: DrillContext) -> ScenarioRecord:
    record = ScenarioRecord("i", TITLES["i"], False)
    return await _under_pressure(ctx, record, refuse_stand_in=True)


async def _under_pressure(
    ctx: DrillContext, record: ScenarioRecord, *, refuse_stand_in: bool
) -> ScenarioRecord:
    setup = _ladder_setup(ctx, record)
    if setup is None:
        return record
    models, size = setup
    if refuse_stand_in and "cpu" not in models.big["devices"]:
        record.skipped = f"{models.big['name']} may not use the CPU: no rung below its stand-in"
        return record
    await ctx.client.wait_ready()
    if not size:
        record.notes.append(f"{models.big['name']} has no GPU plan on this device even without pressure")
    try:
        if size:
            await _take_the_gpu_away(ctx, record, models, size)
        await _ladder_request(ctx, record, models, refuse_stand_in=refuse_stand_in)
    finally:
        if size:
            await _give_back(ctx, record)
    if refuse_stand_in:
        header = ", ".join(f"{name}: {value}" for name, value in REFUSE_STAND_IN.items())
        record.notes.append(f"the request refused a stand-in ({header})")
    return record


# ------------------------------------------------------------------------------------------ j
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
        _read_trace(record, trace, start)
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


async def eviction(ctx: DrillContext) -> ScenarioRecord:
    record = ScenarioRecord("j", TITLES["j"], True)
    models = find_models(ctx.status)
    record.skipped = eviction_skip(ctx.status, models, ctx.max_loaded)
    if record.skipped or isinstance(models, str) or models.other is None:
        return record
    await ctx.client.wait_ready()
    await _unload_library(ctx)
    streams: list[asyncio.Task[Answer]] = []
    try:
        await _evict(ctx, record, models, models.other, streams)
    finally:
        for task in streams:
            task.cancel()  # only the ones still running: the drill could not finish
    return record


async def _evict(
    ctx: DrillContext,
    record: ScenarioRecord,
    models: LadderModels,
    other: ModelStatus,
    streams: list[asyncio.Task[Answer]],
) -> None:
    a_name, b_name = models.big["name"], other["name"]
    main = next(model for model in ctx.status["models"] if model["main"])
    start = time.time()

    # 1. A loaded and idle; a stream on the main model in flight; a request for B: A makes room.
    await ctx.client.model_action(a_name, "load", {"device": "gpu"})
    status = await ctx.client.status()
    a_pid = (_worker(status, model_named(status, a_name), "gpu") or {}).get("pid")
    main_pid = (status["workers"].get("gpu") or {}).get("pid")
    main_body = _long_stream("default", int(status["caps"]["n_ctx_per_seq"]))
    streams.append(await _stream_in_flight(ctx, main_body, "the main model's stream"))
    b_expected = Expectation("gpu", (), "completed")
    b_answer = await ctx.client.chat(_ask(b_name))
    main_answer = await streams[-1]
    b_trace, main_trace = (
        await _job(ctx, record, b_answer, start),
        await _job(ctx, record, main_answer, start),
    )
    status = await ctx.client.status()
    a_gone = gone_problems(
        a_name, a_pid, _worker(status, model_named(status, a_name), "gpu"), pid_alive(a_pid)
    )
    record.failed_checks += a_gone
    record.failed_checks += kept_problems(
        main["name"], main_pid, status["workers"].get("gpu"), main_trace, "gpu"
    )
    record.failed_checks += overlap_problem("the main model's stream", main_answer, b_answer)

    # 2. B busy with a stream; a request for A: B is kept, A goes down the ladder.
    b = model_named(status, b_name)
    b_role = b["workers"].get("gpu", f"gpu@{b_name}")
    b_pid = (_worker(status, b, "gpu") or {}).get("pid")
    b_body = _long_stream(b_name, model_context(status, b), BUSY_STREAM_CAP)
    streams.append(await _stream_in_flight(ctx, b_body, f"{b_name}'s stream"))
    busy = await ctx.client.status()
    stand_in = model_named(busy, models.stand_in["name"])
    available = stand_in_available(busy, stand_in, ctx.max_loaded, busy=(b_name,))
    a_expected, a_by = ladder_expectation(
        ctx,
        busy,
        model_named(busy, a_name),
        stand_in,
        allowed=ctx.stand_in_enabled,
        available=available,
        max_tokens=ASK_TOKENS,
    )
    a_answer = await ctx.client.chat(_ask(a_name))
    b_stream = await streams[-1]
    a_trace, b_trace_stream = (
        await _job(ctx, record, a_answer, start),
        await _job(ctx, record, b_stream, start),
    )
    status = await ctx.client.status()
    b_kept = kept_problems(b_name, b_pid, _worker(status, b, "gpu"), b_trace_stream, b_role)
    record.failed_checks += b_kept
    record.failed_checks += overlap_problem(f"{b_name}'s stream", b_stream, a_answer)
    if "gpu" in model_named(status, a_name)["where"].split("+"):
        record.failed_checks.append(f"{a_name} was loaded on the GPU while {b_name} was busy")

    b_route, b_reason, b_state = _decision(b_trace)
    a_route, a_reason, a_state = _decision(a_trace)
    record.expected = (
        f"{b_name}: {b_expected.describe()}, idle {a_name} unloaded; busy {b_name} kept, "
        f"{a_name}: {a_expected.describe()}"
    )
    record.actual = (
        f"{b_name}: {b_route} ({b_reason or '-'}) -> {b_state}, {a_name} "
        f"{'NOT unloaded' if a_gone else 'unloaded'}; {b_name} "
        f"{'NOT kept' if b_kept else 'kept'}, "
        f"{a_name}: {a_route} ({a_reason or '-'}) -> {a_state}"
    )
    record.decision_ok = b_expected.met_by(b_route, b_reason, b_state) and a_expected.met_by(
        a_route, a_reason, a_state
    )
    record.answered_by = "; ".join(answerer(answer.failsoft) or "nobody" for answer in (b_answer, a_answer))
    record.expected_answerer = f"{on_device(b_name, 'gpu')}; {a_by}"
    limit = ctx.max_loaded if ctx.max_loaded is not None else "?"
    record.decision_why = (
        f"library.max_loaded {limit}: loading {b_name} unloaded the idle {a_name} (least recently used "
        f"first, never one with a request in flight); with {b_name} busy nothing could make room for "
        f"{a_name}, so {a_name} could not use the GPU: {_why(a_route, a_reason, a_name)}"
    )
    record.notes += [
        f"{a_name}'s GPU worker (pid {a_pid}) {'still there' if a_gone else 'gone'} once {b_name} answered",
        f"the main model's stream: {_attempts(main_trace)}, GPU worker pid {main_pid} before, "
        f"{(status['workers'].get('gpu') or {}).get('pid')} after; it ended "
        f"{main_answer.ended_at - b_answer.ended_at:.2f}s after {b_name} answered",
        f"{b_name}'s stream: {_attempts(b_trace_stream)}, its GPU worker pid {b_pid} before, "
        f"{(_worker(status, b, 'gpu') or {}).get('pid')} after; it ended "
        f"{b_stream.ended_at - a_answer.ended_at:.2f}s after {a_name} was answered",
    ]
    record.set_output(a_answer.text)
    record.connection_survived = all(
        answer.connection_ok for answer in (main_answer, b_answer, b_stream, a_answer)
    )
    record.total_seconds = round(time.time() - start, 3)


def _attempts(trace: JobTrace | None) -> str:
    if trace is None:
        return "no job"
    return ", ".join(f"{a.get('worker')} {a.get('outcome')}" for a in trace.attempts) or "no attempt"


SCENARIOS: dict[str, Callable[[DrillContext], Awaitable[ScenarioRecord]]] = {
    "h": stand_in_under_pressure,
    "i": cpu_under_pressure,
    "j": eviction,
}
