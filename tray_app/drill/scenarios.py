"""The drill's scenarios, a to j (h to j, the model library's ladder and eviction: tray_app.drill.ladder).
Each plays one situation against the real service and returns its record,
read from what the client received, the job's journal record (/v1/jobs/{id}) and the service's events."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tray_app.contract.status import ServiceStatus
from tray_app.drill.client import Answer, EventLog, ServiceClient
from tray_app.drill.records import (
    Expectation,
    JobTrace,
    ScenarioRecord,
    account,
    answerer,
    explain,
)
from tray_app.jobs import policy

SEED = 7
BASE: dict[str, Any] = {"model": "default", "temperature": 0, "seed": SEED}
SEA = [{"role": "user", "content": "Write one short sentence about the sea."}]
# Asked so that the answer is one line: the request claims a large max_tokens, the answer stays short.
SKY = [{"role": "user", "content": "In one short sentence: why is the sky blue?"}]
STORY = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]
FAULT_REQUEST: dict[str, Any] = {**BASE, "messages": SEA, "max_tokens": 24}
PROMPT_ALLOWANCE = 64  # tokens the drill's short prompts take, chat template included (upper bound)
MID_GENERATION_TOKENS = 6  # a fault fires after this many generated tokens: text has reached the client
ABORT_KINDS = ("crash_abort", "exited", "killed")
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
FORCE_ADD = {"type": "function", "function": {"name": "add"}}
TITLES = {
    "a": "request beyond the GPU profile, within RAM (non-streamed)",
    "b": "request beyond the GPU profile, within RAM (streamed)",
    "c": "client cancels during the CPU fallback (streamed)",
    "d": "concurrent traffic while the GPU worker crashes",
    "e": "agent turn with a simulated tool under a GPU fault",
    "f": "GPU worker crash mid-generation (abort)",
    "g": "GPU worker hangs mid-generation (SIGSTOP, streamed)",
    "h": "GPU pressure: a big model's request answered by its stand-in",
    "i": "GPU pressure, stand-in refused: the big model on its CPU",
    "j": "eviction: an idle model makes room, a busy one never",
}


@dataclass
class DrillContext:
    client: ServiceClient
    events: EventLog
    status: ServiceStatus
    # The library settings the service runs with (not in its status): the drill's own service sets them;
    # against --url they are this machine's config, as for the API key. None: not known.
    stand_in_enabled: bool = True
    max_loaded: int | None = None
    _reference: dict[str, str] = field(default_factory=dict)

    @property
    def caps(self) -> dict[str, Any]:
        caps: dict[str, Any] = self.status["caps"]
        return caps

    @property
    def policy_settings(self) -> policy.Settings:
        configured = self.status["policy"]
        return policy.Settings(
            fallback=configured["fallback"],
            stream_after_content=configured["stream_after_content"],
            auto_approve_seconds=float(configured["auto_approve_seconds"]),
        )

    def cpu_state(self) -> policy.CpuState:
        speed = float(self.status["policy"].get("cpu_tokens_per_second") or 0.0)
        return policy.CpuState(True, True, True, speed, int(self.caps["cpu_n_ctx"]))

    async def refresh(self) -> None:
        self.status = await self.client.status()

    async def trace(self, job_id: str) -> JobTrace:
        """The job once it has ended, with its events (waiting for the final one to come through)."""
        record = await self.client.wait_job_final(job_id)
        await self.events.wait(
            lambda event: (
                event.type == "job_state"
                and event.data.get("job_id") == job_id
                and event.data.get("state") == record["state"]
            ),
            10.0,
            f"the final event of job {job_id}",
        )
        return JobTrace(record, tuple(self.events.for_job(job_id)))

    async def reference_text(self) -> str:
        """The answer to FAULT_REQUEST with no fault: what a replay at temperature 0 should reproduce."""
        if "fault" not in self._reference:
            await self.client.wait_ready()
            answer = await self.client.chat(FAULT_REQUEST)
            self._reference["fault"] = answer.text
        return self._reference["fault"]

    # ------------------------------------------------------------------------ expectations
    def expect_route(self, prompt_tokens: int, max_tokens: int) -> Expectation:
        request = policy.RouteRequest(
            prompt_tokens, max_tokens, int(self.caps["n_ctx_per_seq"]), True, self._deadline()
        )
        return _expectation(policy.decide_route(request, self.cpu_state(), self.policy_settings), ())

    def expect_cpu_route(
        self, prompt_tokens: int, max_tokens: int, n_ctx_per_seq: int, cpu_n_ctx: int
    ) -> Expectation:
        """A new request for a model that cannot use the GPU now: its CPU worker (`cpu_n_ctx` per slot) by the
        policy, as the service decides with gpu_available False. `n_ctx_per_seq`: the model's context per
        request as the service counts it (its GPU plan's, or its CPU plan's without one)."""
        request = policy.RouteRequest(prompt_tokens, max_tokens, n_ctx_per_seq, False, self._deadline())
        speed = float(self.status["policy"].get("cpu_tokens_per_second") or 0.0)
        cpu = policy.CpuState(True, True, True, speed, cpu_n_ctx)
        return _expectation(policy.decide_route(request, cpu, self.policy_settings), ())

    def expect_replay(
        self, *, streamed: bool, content_delivered: bool, remaining: int, kinds: tuple[str, ...]
    ) -> Expectation:
        failure = policy.FailureContext(
            streaming=streamed,
            content_delivered=content_delivered,
            tool_call_delivered=False,
            prompt_tokens=PROMPT_ALLOWANCE,
            remaining_tokens=remaining,
            time_left=self._deadline(),
        )
        return _expectation(policy.decide_replay(failure, self.cpu_state(), self.policy_settings), kinds)

    def _deadline(self) -> float:
        return self.client.deadline


def _expectation(decision: policy.Decision, replay_kinds: tuple[str, ...]) -> Expectation:
    if decision.action == "cpu":
        # A replay's route event carries the failure kind; a capacity route carries its own reason.
        return Expectation("cpu", replay_kinds or (decision.reason,))
    if decision.action == "approval":
        return Expectation("approval", (decision.reason,), "awaiting_approval")
    if decision.action == "refuse":
        return Expectation("refused", (decision.reason,), "failed")
    return Expectation("gpu", (), "completed")


async def _finish(
    ctx: DrillContext,
    record: ScenarioRecord,
    answer: Answer,
    expectation: Expectation,
    start: float,
    *,
    client_closed: bool = False,
) -> JobTrace | None:
    """Fill a single-job record from the answer, the job's record and its events."""
    trace = await ctx.trace(answer.job_id) if answer.job_id else None
    lost, doubled, note = account(answer, trace, client_closed=client_closed)
    record.lost += lost
    record.doubled += doubled
    if note:
        record.notes.append(note)
    record.expected = expectation.describe()
    record.set_output(answer.text or json.dumps(answer.tool_calls))
    record.connection_survived = None if client_closed else answer.connection_ok
    record.total_seconds = round(answer.ended_at - start, 3)
    record.answered_by = answerer(answer.failsoft)
    if answer.error:
        record.notes.append(f"error to the client: {answer.error.get('code')}: {answer.error.get('message')}")
    if trace is None:
        record.actual = f"no job ({answer.error})"
        return None
    record.job_ids.append(answer.job_id)
    record.final_states.append(trace.state)
    _read_trace(record, trace, start)
    route, reason = trace.decision()
    record.actual = f"{route} ({reason or '-'}) -> {trace.state}"
    record.decision_ok = expectation.met_by(route, reason, trace.state)
    error = trace.first_error()
    resumed = bool(
        record.streamed and error and answer.first_content_at and answer.first_content_at < error[0]
    )
    record.decision_why = explain(
        route, reason, streamed=record.streamed, resumed=resumed, detail=trace.refusal_detail(), caps=ctx.caps
    )
    record.notes += worker_notes(ctx.events, start, max(answer.ended_at, time.time()))
    return trace


async def count_answer(ctx: DrillContext, record: ScenarioRecord, answer: Answer) -> JobTrace | None:
    """One answer into the record's tallies (lost, answered twice, why); its job once it has ended."""
    trace = await ctx.trace(answer.job_id) if answer.job_id else None
    lost, doubled, note = account(answer, trace)
    record.lost += lost
    record.doubled += doubled
    if note:
        record.notes.append(note)
    return trace


def worker_notes(events: EventLog, start: float, end: float) -> list[str]:
    """What the supervisor said about the GPU worker meanwhile: its own failure kind and the restart."""
    notes = []
    for event in events.between(start, end, ("worker_unhealthy", "worker_restarted")):
        if event.data.get("role") != "gpu":
            continue
        if event.type == "worker_unhealthy":
            notes.append(f"GPU worker unhealthy @{event.at - start:.2f}s: {event.data.get('kind')}")
        else:
            notes.append(f"GPU worker restarted @{event.at - start:.2f}s (pid {event.data.get('pid')})")
    return notes


def _read_trace(record: ScenarioRecord, trace: JobTrace, start: float) -> None:
    """First error and CPU start (the earliest over the scenario's jobs), relative to the scenario start."""
    error = trace.first_error()
    if error is not None and (record.first_error_at is None or error[0] - start < record.first_error_at):
        record.first_error_at = round(error[0] - start, 3)
        record.first_error_kind, record.first_error_message = error[1], error[2]
    cpu = trace.cpu_started()
    if cpu is not None and (record.cpu_started_at is None or cpu - start < record.cpu_started_at):
        record.cpu_started_at = round(cpu - start, 3)


# ------------------------------------------------------------------------------------------ a, b
async def capacity_fallback(ctx: DrillContext, streamed: bool) -> ScenarioRecord:
    key = "b" if streamed else "a"
    record = ScenarioRecord(key, TITLES[key], streamed)
    per_seq, cpu_ctx = int(ctx.caps["n_ctx_per_seq"]), int(ctx.caps["cpu_n_ctx"])
    max_tokens = max(per_seq, 16)  # with any prompt at all, this exceeds the GPU profile
    if max_tokens + PROMPT_ALLOWANCE > cpu_ctx:
        record.skipped = (
            f"the CPU profile ({cpu_ctx} tokens) is not larger than the GPU's ({per_seq} per sequence), "
            "so no request fits the CPU but not the GPU; give the GPU a smaller budget.max_ctx than "
            "cpu.max_ctx (the drill's own service does)"
        )
        return record
    await ctx.client.wait_ready()
    body = {**BASE, "messages": SKY, "max_tokens": max_tokens, "stop": ["\n"]}
    expectation = ctx.expect_route(PROMPT_ALLOWANCE // 2, max_tokens)
    start = time.time()
    answer = await (ctx.client.stream_chat(body) if streamed else ctx.client.chat(body))
    await _finish(ctx, record, answer, expectation, start)
    record.notes.append(
        f"prompt + max_tokens {max_tokens} > GPU profile {per_seq} per sequence; CPU profile {cpu_ctx}"
    )
    return record


# ------------------------------------------------------------------------------------------ c
async def cancel_during_fallback(ctx: DrillContext) -> ScenarioRecord:
    record = ScenarioRecord("c", TITLES["c"], True)
    await ctx.client.arm("abort", 0)  # the GPU fails before any text: everything streamed is the CPU's
    body = {**BASE, "messages": STORY, "max_tokens": 300}
    expectation = ctx.expect_replay(streamed=True, content_delivered=False, remaining=300, kinds=ABORT_KINDS)
    expectation = Expectation(expectation.route, expectation.reasons, "cancelled")

    async def on_cpu(answer: Answer) -> bool:
        falling_back = any(
            event.type == "fallback_started" and event.data.get("job_id") == answer.job_id
            for event in ctx.events.events
        )
        return falling_back and answer.chunks >= 4

    start = time.time()
    answer = await ctx.client.stream_chat(body, stop_after=on_cpu)
    closed_at = time.time()
    trace = await _finish(ctx, record, answer, expectation, start, client_closed=True)
    record.total_seconds = round(time.time() - start, 3)
    if trace is None:
        return record
    attempts = trace.attempts
    record.notes.append(
        f"client closed the stream after {answer.chunks} chunks; job {trace.state} "
        f"{_ended_after(trace, closed_at)}; attempts: "
        + ", ".join(f"{a['worker']} {a['outcome']}" for a in attempts)
    )
    if len(attempts) != 2:
        record.decision_ok = False
        record.notes.append(f"expected exactly 2 attempts (GPU failed, CPU cancelled), found {len(attempts)}")
    freed = await _seconds_until_cpu_idle(ctx.client, closed_at)
    record.notes.append(f"CPU worker slot free {freed:.3f}s after the client closed")
    return record


def _ended_after(trace: JobTrace, closed_at: float) -> str:
    last = trace.attempts[-1] if trace.attempts else {}
    ended = last.get("ended_at")
    return f"{max(float(ended) - closed_at, 0.0):.3f}s after the client closed" if ended else ""


async def _seconds_until_cpu_idle(client: ServiceClient, since: float) -> float:
    async def idle() -> bool:
        status = await client.status()
        return int(status["workers"]["cpu"].get("in_flight") or 0) == 0

    await client.wait_for(idle, "the CPU worker's slot to be free", 30.0)
    return time.time() - since


# ------------------------------------------------------------------------------------------ d
async def concurrent_failover(ctx: DrillContext, count: int = 4) -> ScenarioRecord:
    record = ScenarioRecord("d", TITLES["d"], True)
    await ctx.client.arm("abort", MID_GENERATION_TOKENS)
    topics = ("the sea", "a mountain", "a forest", "the moon", "a river", "the desert")
    bodies = [
        {
            **BASE,
            "messages": [{"role": "user", "content": f"Write one short sentence about {topics[i % 6]}."}],
        }
        | {"max_tokens": 24}
        for i in range(count)
    ]
    start = time.time()
    answers = await asyncio.gather(
        *(
            ctx.client.stream_chat(body) if index % 2 else ctx.client.chat(body)
            for index, body in enumerate(bodies)
        )
    )
    record.total_seconds = round(max(answer.ended_at for answer in answers) - start, 3)
    routes: list[tuple[str, str, str]] = []
    for answer in answers:
        trace = await count_answer(ctx, record, answer)
        if trace is None:
            routes.append(("none", "", "unknown"))
            continue
        record.job_ids.append(answer.job_id)
        record.final_states.append(trace.state)
        _read_trace(record, trace, start)
        routes.append((*trace.decision(), trace.state))
    replayed = [(route, reason) for route, reason, _ in routes if route == "cpu" and reason in ABORT_KINDS]
    record.expected = f"all {count} completed once; the job on the GPU at the crash replayed on the cpu"
    tally = Counter(f"{route} ({reason or '-'})" for route, reason, _ in routes)
    completed = sum(state == "completed" for *_, state in routes)
    record.actual = f"{completed}/{count} completed; " + ", ".join(
        f"{times}x {decision}" for decision, times in sorted(tally.items())
    )
    record.decision_ok = all(state == "completed" for *_, state in routes) and bool(replayed)
    record.decision_why = (
        "the job in flight on the GPU was replayed on the CPU after the crash; jobs waiting for the GPU slot "
        "found the GPU worker restarting and went to the CPU (or to the GPU once it was back)"
    )
    failed_over = next(
        (a for a, (route, reason, _) in zip(answers, routes, strict=True) if reason in ABORT_KINDS),
        answers[0],
    )
    record.set_output(failed_over.text)
    record.connection_survived = all(answer.connection_ok for answer in answers)
    return record


# ------------------------------------------------------------------------------------------ e
class CountingTool:
    """A simulated tool with a side effect that can be counted: `add(a, b)`."""

    def __init__(self) -> None:
        self.executions = 0

    def __call__(self, arguments: str) -> str:
        self.executions += 1
        try:
            values = json.loads(arguments or "{}")
            return str(int(values.get("a", 0)) + int(values.get("b", 0)))
        except (ValueError, TypeError, AttributeError):
            return "error: arguments were not two integers"


async def agent_turn(ctx: DrillContext) -> ScenarioRecord:
    record = ScenarioRecord("e", TITLES["e"], False)
    tool = CountingTool()
    await ctx.client.arm("abort", 2)  # the GPU dies while the tool call is generated, before delivery
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 plus 3? Use the add tool."}]
    ask = {**BASE, "messages": messages, "tools": [ADD_TOOL], "tool_choice": FORCE_ADD, "max_tokens": 60}
    expectation = ctx.expect_replay(streamed=False, content_delivered=False, remaining=60, kinds=ABORT_KINDS)
    start = time.time()
    first = await ctx.client.chat(ask)
    record.tool_calls_intended = 1  # one forced call: the agent means to run the tool once
    for call in first.tool_calls:  # every delivered call runs, as a real agent would
        result = tool(call["function"]["arguments"])
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": result},
        ]
    record.tool_executions = tool.executions
    trace = await _finish(ctx, record, first, expectation, start)
    if not first.tool_calls:
        record.decision_ok = False
        record.notes.append("no tool call was delivered")
        return record
    final = await ctx.client.chat({**BASE, "messages": messages, "max_tokens": 16})
    final_trace = await count_answer(ctx, record, final)
    if final_trace is not None:
        record.job_ids.append(final.job_id)
        record.final_states.append(final_trace.state)
    record.set_output(final.text)
    record.total_seconds = round(final.ended_at - start, 3)
    record.connection_survived = first.connection_ok and final.connection_ok
    call = first.tool_calls[0]["function"]
    record.notes.append(f"tool call {call['name']}({call['arguments']}) ran {tool.executions} time(s)")
    if trace is not None and final_trace is not None and final_trace.state != "completed":
        record.decision_ok = False
    return record


# ------------------------------------------------------------------------------------------ f, g
async def mid_generation_fault(ctx: DrillContext, kind: str, streamed: bool) -> ScenarioRecord:
    key = "g" if kind == "hang" else "f"
    record = ScenarioRecord(key, TITLES[key], streamed)
    reference = await ctx.reference_text()
    await ctx.client.arm(kind, MID_GENERATION_TOKENS)
    kinds = ("hung",) if kind == "hang" else ABORT_KINDS
    expectation = ctx.expect_replay(
        streamed=streamed,
        content_delivered=streamed,
        remaining=int(FAULT_REQUEST["max_tokens"]) - MID_GENERATION_TOKENS,
        kinds=kinds,
    )
    start = time.time()
    answer = await (ctx.client.stream_chat(FAULT_REQUEST) if streamed else ctx.client.chat(FAULT_REQUEST))
    await _finish(ctx, record, answer, expectation, start)
    if answer.answered:
        record.same_as_unfaulted = answer.text == reference
    return record


Scenario = Callable[[DrillContext], Awaitable[ScenarioRecord]]
SCENARIOS: dict[str, Scenario] = {
    "a": lambda ctx: capacity_fallback(ctx, streamed=False),
    "b": lambda ctx: capacity_fallback(ctx, streamed=True),
    "c": cancel_during_fallback,
    "d": concurrent_failover,
    "e": agent_turn,
    "f": lambda ctx: mid_generation_fault(ctx, "abort", streamed=False),
    "g": lambda ctx: mid_generation_fault(ctx, "hang", streamed=True),
    "h": lambda ctx: _ladder("h", ctx),
    "i": lambda ctx: _ladder("i", ctx),
    "j": lambda ctx: _ladder("j", ctx),
}


async def _ladder(key: str, ctx: DrillContext) -> ScenarioRecord:
    from tray_app.drill import ladder  # it builds on this module's helpers

    return await ladder.SCENARIOS[key](ctx)
