"""Scenario l: a conversation of several turns, over 1,500 prompt tokens, whose GPU worker is killed (SIGKILL)
in the middle of the last turn's stream.

The earlier turns run on the GPU while the CPU mirror reads them; between turns the drill waits as a user
reading the answer would, until the mirror has caught up. The last turn must then be resumed on the CPU once,
and the CPU must find the conversation in its prompt cache (`cpu_cached_tokens` in the answer's failsoft
object): the pause from the kill to the next token is a decoding step, not a reading of the whole prompt.
"""

from __future__ import annotations

import time
from typing import Any

from tray_app.drill.bodies import BASE
from tray_app.drill.client import Answer
from tray_app.drill.context import DrillContext, finish
from tray_app.drill.conversation import conversation, filler, next_turn
from tray_app.drill.expected import EXPECTED, TITLES
from tray_app.drill.records import ScenarioRecord

FIRST_TURN = 1000  # prompt tokens of the first turn
SECOND_QUESTION = 500  # tokens the user adds with the second turn
NEEDED_PER_SLOT = 1900  # the last turn's prompt and its answer, in one GPU slot
ANSWER_TOKENS = 24
KILL_AFTER = 5  # streamed tokens of the last turn before the GPU worker is killed
MIRROR_WAIT = 120.0  # seconds a reader might take; the mirror on one CPU thread reads about 100 tokens/s


def _mirror_idle(status: dict[str, Any]) -> bool:
    mirror = status.get("mirror") or {}
    return bool(mirror.get("enabled")) and mirror.get("tokens_behind") == 0 and mirror.get("reading") == 0


async def _turn(ctx: DrillContext, messages: list[dict[str, str]]) -> Answer:
    body = {
        **BASE,
        "messages": messages,
        "max_tokens": ANSWER_TOKENS,
        "ignore_eos": True,  # every answer its whole length: the kill lands mid-stream
        "stream_options": {"include_usage": True},
    }
    return await ctx.client.stream_chat(body)


async def conversation_failover(ctx: DrillContext) -> ScenarioRecord:
    record = ScenarioRecord("l", TITLES["l"], True)
    per_slot = int(ctx.caps.get("n_ctx_per_seq") or 0)
    mirror = ctx.status.get("mirror") or {}
    if per_slot < NEEDED_PER_SLOT:
        record.skipped = (
            f"the GPU's slots hold {per_slot} tokens, the conversation needs {NEEDED_PER_SLOT} "
            "(the drill's own service plays l on a service of its own with longer slots)"
        )
        return record
    if not mirror.get("enabled"):
        record.skipped = "the service's CPU mirror is off (cpu.mirror = false)"
        return record
    seed = int(time.time()) % 1000  # nothing an earlier run cached helps
    messages = conversation(FIRST_TURN, seed)
    earlier_tokens = 0
    for question in (f"Now these notes too: {filler(SECOND_QUESTION, seed + 1)}", None):
        answer = await _turn(ctx, messages)
        if not answer.answered or (answer.failsoft or {}).get("device") != "gpu":
            record.actual = f"an earlier turn did not answer on the GPU: {answer.error or answer.failsoft}"
            record.failed_checks.append(record.actual)
            return record
        earlier_tokens = answer.prompt_tokens
        await ctx.client.wait_for(
            lambda: _status_if(ctx, _mirror_idle), "the mirror to read the turn", MIRROR_WAIT, 0.2
        )
        messages = next_turn(messages, answer.text)
        if question is not None:
            messages[-1] = {"role": "user", "content": question}
    armed = await ctx.client.arm("kill", KILL_AFTER)
    start = time.time()
    answer = await _turn(ctx, messages)
    trace = await finish(ctx, record, answer, EXPECTED["l"], start)
    failsoft = answer.failsoft or {}
    cached = int(failsoft.get("cpu_cached_tokens") or 0)
    prompt = answer.prompt_tokens
    error = trace.first_error() if trace is not None else None
    pause = _pause_after(answer, error[0] if error else None)
    record.notes.append(
        f"last turn {prompt} prompt tokens; GPU worker (pid {armed.get('pid')}) killed after {KILL_AFTER} "
        f"tokens; the CPU found {cached} cached; pause to the next token "
        f"{'-' if pause is None else f'{pause * 1000:.0f} ms'}"
    )
    if prompt and prompt < 1500:
        record.failed_checks.append(f"the conversation was {prompt} tokens, not over 1,500")
    if cached < earlier_tokens:
        record.failed_checks.append(
            f"the CPU found {cached} tokens cached, fewer than the {earlier_tokens} of the earlier turns"
        )
    return record


async def _status_if(ctx: DrillContext, check: Any) -> dict[str, Any] | None:
    status: dict[str, Any] = dict(await ctx.client.status())
    return status if check(status) else None


def _pause_after(answer: Answer, failed_at: float | None) -> float | None:
    """From the GPU attempt's failure (the service's clock, this machine's) to the next text the client
    received."""
    if failed_at is None:
        return None
    return next((at - failed_at for at in answer.content_at if at >= failed_at), None)
