"""The drill's scenarios a to g: failover between the GPU and CPU workers. Each plays one situation against
the real service and returns its record, read from what the client received, the job's journal record
(/v1/jobs/{id}) and the service's events, and judged against what `expected` writes down for it."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from typing import Any

from tray_app.drill.bodies import (
    ADD_TOOL,
    BASE,
    FAULT_REQUEST,
    FORCE_ADD,
    MID_GENERATION_TOKENS,
    PROMPT_ALLOWANCE,
    SKY,
    STORY,
)
from tray_app.drill.client import Answer, ServiceClient
from tray_app.drill.context import DrillContext, count_answer, finish, read_trace
from tray_app.drill.expected import ABORT_KINDS, CONCURRENT, EXPECTED, TITLES
from tray_app.drill.records import JobTrace, ScenarioRecord


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
    start = time.time()
    answer = await (ctx.client.stream_chat(body) if streamed else ctx.client.chat(body))
    await finish(ctx, record, answer, EXPECTED[key], start)
    record.notes.append(
        f"prompt + max_tokens {max_tokens} > GPU profile {per_seq} per sequence; CPU profile {cpu_ctx}"
    )
    return record


# ------------------------------------------------------------------------------------------ c
async def cancel_during_fallback(ctx: DrillContext) -> ScenarioRecord:
    record = ScenarioRecord("c", TITLES["c"], True)
    await ctx.client.arm("abort", 0)  # the GPU fails before any text: everything streamed is the CPU's
    body = {**BASE, "messages": STORY, "max_tokens": 300}

    async def on_cpu(answer: Answer) -> bool:
        falling_back = any(
            event.type == "fallback_started" and event.data.get("job_id") == answer.job_id
            for event in ctx.events.events
        )
        return falling_back and answer.chunks >= 4

    start = time.time()
    answer = await ctx.client.stream_chat(body, stop_after=on_cpu)
    closed_at = time.time()
    trace = await finish(ctx, record, answer, EXPECTED["c"], start, client_closed=True)
    record.total_seconds = round(time.time() - start, 3)
    if trace is None:
        return record
    record.notes.append(
        f"client closed the stream after {answer.chunks} chunks; job {trace.state} "
        f"{_ended_after(trace, closed_at)}; attempts: " + ", ".join(trace.attempt_words())
    )
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
        read_trace(record, trace, start)
        routes.append((*trace.decision(), trace.state))
    replayed = [(route, reason) for route, reason, _ in routes if route == "cpu" and reason in ABORT_KINDS]
    record.expected = CONCURRENT.format(count=count)
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
    trace = await finish(ctx, record, first, EXPECTED["e"], start)
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
    resumes = ctx.status["policy"].get("stream_after_content", "resume")
    if streamed and resumes != "resume":
        record.skipped = (
            f"the service's failover.stream_after_content is {resumes!r}: {key} plays a stream resumed on "
            "the CPU after text reached the client (the drill's own service resumes)"
        )
        return record
    reference = await ctx.reference_text()
    await ctx.client.arm(kind, MID_GENERATION_TOKENS)
    start = time.time()
    answer = await (ctx.client.stream_chat(FAULT_REQUEST) if streamed else ctx.client.chat(FAULT_REQUEST))
    await finish(ctx, record, answer, EXPECTED[key], start)
    if answer.answered:
        record.same_as_unfaulted = answer.text == reference
    return record
