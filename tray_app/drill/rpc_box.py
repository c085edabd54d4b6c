"""Scenario o: one model across two boxes through llama.cpp's RPC backend, the box killed mid-stream.

The drill starts an RPC box (`failsoft rpc serve` on loopback: rpc-server on its CPU backend, another
machine's device as the GPU worker meets it) and a service on a simulated GPU too small for the model, the
box its `[[peers]] rpc`: the plan puts layers on the box and the GPU worker runs with `--rpc`. After the
first chunk of a long stream the box is killed (SIGKILL: a machine that lost power). llama-server aborts on
the lost connection, the CPU worker finishes the answer, once; the GPU worker's next start probes the box,
finds it gone and is planned without it; the GPU answers again.
"""

from __future__ import annotations

import time
from typing import Any

from tray_app.contract.sizes import format_size
from tray_app.drill.bodies import BASE, FAULT_REQUEST, STORY
from tray_app.drill.client import Answer, DrillError
from tray_app.drill.context import DrillContext, finish
from tray_app.drill.expected import EXPECTED, TITLES
from tray_app.drill.kill import Kill
from tray_app.drill.records import ScenarioRecord
from tray_app.drill.rpc_launch import BOX_MEMORY, SIMULATED_VRAM, RpcBox
from tray_app.engine.llama_log import as_printed

STORY_TOKENS = 200  # long enough that the GPU worker is still answering when the box goes
REPLAN_WAIT = 120.0  # the GPU worker's restart: the box probed, the plan made, the model loaded again
NO_BOX = (
    "scenario o needs an RPC box the drill can kill: the drill plays it on a box and a service it starts "
    "itself (run `failsoft drill` without --url, with an engine that has rpc-server: `failsoft engine build`)"
)
LONG_STORY: dict[str, Any] = {**BASE, "messages": STORY, "max_tokens": STORY_TOKENS, "ignore_eos": True}


def _box_entry(status: dict[str, Any], key: str, endpoint: str) -> dict[str, Any] | None:
    """The box's entry in `/failsoft/status` `rpc` `boxes` or `remote`."""
    entries = (status.get("rpc") or {}).get(key) or []
    return next((entry for entry in entries if entry.get("endpoint") == endpoint), None)


def _gpu_rpc(status: dict[str, Any]) -> list[str]:
    profile = ((status.get("workers") or {}).get("gpu") or {}).get("profile") or {}
    return list(profile.get("rpc") or [])


def _spans_box(record: ScenarioRecord, status: dict[str, Any], box: RpcBox) -> bool:
    """Check that the plan gives the box layers and the GPU worker carries `--rpc`; False (why in the
    record: skipped when the model is too large for the scenario's sizes, failed otherwise) when not."""
    probed = _box_entry(status, "boxes", box.endpoint) or {}
    share = _box_entry(status, "remote", box.endpoint)
    if share is None:
        if probed and not probed.get("problem"):
            record.skipped = (
                f"the plan put none of the model's layers on a {BOX_MEMORY} box beside a {SIMULATED_VRAM} "
                "simulated GPU (scenario o is sized for the bundled model)"
            )
        else:
            record.failed_checks.append(
                f"the plan has no share on the box {box.endpoint}: {probed.get('problem') or 'not probed'}"
            )
        return False
    record.notes.append(
        f"the plan puts {share.get('n_layers')} layers on {share.get('peer')}'s device {share.get('device')} "
        f"at {box.endpoint} ({format_size(int(share.get('weights_bytes') or 0))} of weights)"
    )
    if _gpu_rpc(status) != [box.endpoint]:
        record.failed_checks.append(
            f"the GPU worker's profile has rpc {_gpu_rpc(status)}, not [{box.endpoint}]"
        )
        return False
    record.notes.append(f"the GPU worker runs with --rpc {box.endpoint}")
    _buffers_as_planned(record, status, share)
    return True


PLANNED = {"model": "weights_bytes", "kv": "kv_bytes", "compute": "compute_bytes"}  # buffer -> share key


def _buffers_as_planned(record: ScenarioRecord, status: dict[str, Any], share: dict[str, Any]) -> None:
    """llama.cpp's own buffers on the box (its load log, as the worker's status has it) against the plan's
    share, at the log's precision: the weights and KV cache equal; the compute buffer at most the plan's."""
    printed = (((status.get("workers") or {}).get("gpu") or {}).get("health") or {}).get("buffers") or {}
    name = str(share.get("buffer_name"))
    got = {
        kind: int((printed.get(f"{kind}_buffers") or {}).get(name) or 0)
        for kind in ("model", "kv", "compute")
    }
    planned = {kind: int(share.get(key) or 0) for kind, key in PLANNED.items()}
    words = ", ".join(f"{kind} {as_printed(got[kind])}/{as_printed(planned[kind])} MiB" for kind in PLANNED)
    equal = all(as_printed(got[kind]) == as_printed(planned[kind]) for kind in ("model", "kv"))
    if equal and 0 < got["compute"] <= planned["compute"]:
        record.notes.append(f"llama.cpp's buffers on {name}, printed/planned: {words}")
    else:
        record.failed_checks.append(
            f"llama.cpp's buffers on {name} are not the plan's (printed/planned): {words}"
        )


def _check_answer(record: ScenarioRecord, answer: Answer, job: dict[str, Any]) -> None:
    """Whole (every token asked for), once (one finish, one completed attempt: the CPU's) and the route
    named in the answer."""
    result = job.get("result") or {}
    tokens = (result.get("usage") or {}).get("completion_tokens")
    finish_reason = ((result.get("choices") or [{}])[0]).get("finish_reason")
    if tokens == STORY_TOKENS and finish_reason == "length":
        record.notes.append(
            f"the answer is whole: {tokens} tokens of {STORY_TOKENS}, {len(answer.text)} characters"
        )
    else:
        record.failed_checks.append(
            f"the answer has {tokens} tokens (finish {finish_reason}), expected {STORY_TOKENS} (length)"
        )
    completed = [a for a in job.get("attempt_log") or [] if a.get("outcome") == "completed"]
    once = (
        [a.get("worker") for a in completed] == ["cpu"]
        and answer.finish_reasons == 1
        and answer.failsoft_chunks == 1
        and job.get("fallback_reason") == "crash_abort"
    )
    if once:
        record.notes.append("answered once: one completed attempt, on the cpu, fallback_reason crash_abort")
    else:
        record.failed_checks.append(
            f"completed attempts on {[a.get('worker') for a in completed]}, {answer.finish_reasons} finish "
            f"reason(s), {answer.failsoft_chunks} failsoft object(s), fallback_reason "
            f"{job.get('fallback_reason')}: expected once, on the cpu, crash_abort"
        )
    said = answer.failsoft or {}
    named = (said.get("route"), said.get("worker"), said.get("fallback_reason"))
    if named == ("cpu", "cpu", "crash_abort"):
        record.notes.append(
            f"the answer names its route: cpu after crash_abort, {said.get('attempts')} attempts"
        )
    else:
        record.failed_checks.append(
            f"the answer names route, worker, reason {named}, expected cpu, cpu, crash_abort"
        )


async def _planned_without(ctx: DrillContext, record: ScenarioRecord, box: RpcBox, killed_at: float) -> None:
    """The GPU worker ready again with no `--rpc`, the box out of the plan and named as not answering; a new
    request answered on the GPU."""

    async def restarted() -> dict[str, Any] | None:
        status: dict[str, Any] = dict(await ctx.client.status())
        gpu = (status.get("workers") or {}).get("gpu") or {}
        return status if gpu.get("state") == "ready" and not _gpu_rpc(status) else None

    try:
        status = await ctx.client.wait_for(
            restarted, "the GPU worker ready without the box", REPLAN_WAIT, 0.2
        )
    except DrillError as error:
        record.failed_checks.append(str(error))
        return
    record.notes.append(
        f"the GPU worker ready again with no --rpc {time.time() - killed_at:.1f}s after the kill"
    )
    problem = str((_box_entry(status, "boxes", box.endpoint) or {}).get("problem") or "")
    remote = (status.get("rpc") or {}).get("remote")
    if remote or "does not answer" not in problem:
        record.failed_checks.append(
            f"rpc.remote is {remote}, the box's problem {problem!r}: expected no share and a box that does "
            "not answer"
        )
    else:
        record.notes.append(f"rpc.remote is empty; the box: {problem}")
    after = await ctx.client.chat(FAULT_REQUEST)
    worker = (after.failsoft or {}).get("worker")
    if worker == "gpu" and not after.error:
        record.notes.append("a new request answered on the gpu")
    else:
        record.failed_checks.append(f"a new request answered on {worker} ({after.error}), not the gpu")


async def box_killed(ctx: DrillContext) -> ScenarioRecord:
    record = ScenarioRecord("o", TITLES["o"], True, expected=EXPECTED["o"].describe())
    box = ctx.box
    if box is None:
        record.skipped = NO_BOX
        return record
    if not _spans_box(record, dict(await ctx.client.wait_ready()), box):
        record.actual = "not played: the GPU worker does not span the box"
        return record
    kill = Kill(box.pid, lambda answer: bool(answer.text))  # rpc-server: the GPU worker loses its device
    start = time.time()
    answer = await ctx.client.stream_chat(LONG_STORY, stop_after=kill.on_chunk())
    trace = await finish(ctx, record, answer, EXPECTED["o"], start)
    record.decision_why = (
        "the box was lost mid-stream: llama-server aborts on a lost RPC connection (crash_abort); "
        "stream_after_content = resume: this machine's CPU continued from the text already sent"
    )
    if not kill.delivered:
        record.failed_checks.append("the stream ended before the box could be killed")
        return record
    record.notes.append(f"box {box.endpoint} (pid {box.pid}) killed after {len(kill.delivered)} characters")
    if trace is not None:
        _check_answer(record, answer, trace.record)
    await _planned_without(ctx, record, box, kill.at)
    return record
