"""Scenario k: another program takes the GPU in the middle of a run.

A stream runs on the GPU when a hog (`failsoft hog` on a simulated GPU, a torch allocation on an NVIDIA one)
takes all the memory free but half the reserve. The drill measures how long the service took to see and name
it (seconds, and the device watcher's poll intervals), what it decided (the GPU path), then kills the GPU
worker while the hog holds the memory: it must come back with a plan that fits, or stay off the GPU saying
who holds the memory, never fail a load. A request while the hog holds, the hog exits, the GPU must be back
by itself; every job answered once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tray_app.contract.sizes import format_size
from tray_app.contract.status import ServiceStatus
from tray_app.drill.bodies import BASE, SEA, STORY
from tray_app.drill.client import Answer
from tray_app.drill.context import DrillContext, count_answer
from tray_app.drill.expected import TITLES
from tray_app.drill.records import ScenarioRecord, answerer

HOG_NAME = "drill-hog"
TORCH_HOG = (
    "import sys, torch; x = torch.empty({size}, dtype=torch.uint8, device='cuda'); "
    "print('holds', flush=True); sys.stdin.read()"
)
SETTLE_SECONDS = 60.0  # the GPU worker's restart, or the return after the hog (gpu.return_after + a load)


def _hog_command(status: ServiceStatus, size: int) -> tuple[list[str], dict[str, str]] | str:
    """How to run the hog against this service's device, or why it cannot be run here."""
    now = status.get("device_now") or {}
    if now.get("simulated"):
        ledger = now.get("ledger")
        if not ledger:
            return "the service's status does not say where its simulated GPU's ledger is"
        env = {**os.environ, "FAILSOFT_RUNTIME_DIR": str(Path(str(ledger)).parent)}
        return [sys.executable, "-m", "tray_app", "hog", str(size), "--name", HOG_NAME], env
    if now.get("source") == "nvml":
        try:
            import torch  # noqa: F401  (the optional drill extra)
        except ImportError:
            return "an NVIDIA GPU's hog is torch: pip install 'failsoft[drill]'"
        return [sys.executable, "-c", TORCH_HOG.format(size=size)], dict(os.environ)
    return "the service watches no device whose memory a hog can take (no simulated or NVIDIA GPU)"


@contextlib.asynccontextmanager
async def _hog(command: list[str], env: dict[str, str]) -> AsyncIterator[asyncio.subprocess.Process]:
    process = await asyncio.create_subprocess_exec(
        *command, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        if "holds" not in line:
            raise RuntimeError(f"the hog did not take the memory: {line.strip() or 'it exited'}")
        yield process
    finally:
        if process.returncode is None:
            process.terminate()  # SIGTERM: it gives the memory back
            await asyncio.wait_for(process.wait(), 30)


def _named(status: ServiceStatus, pid: int) -> dict[str, Any] | None:
    return next(
        (p for p in (status.get("device_now") or {}).get("processes") or [] if p.get("pid") == pid), None
    )


async def _until(ctx: DrillContext, check: Any, what: str, timeout: float = SETTLE_SECONDS) -> ServiceStatus:
    async def probe() -> ServiceStatus | None:
        status = await ctx.client.status()
        return status if check(status) else None

    found: ServiceStatus = await ctx.client.wait_for(probe, what, timeout)
    return found


async def takeover(ctx: DrillContext) -> ScenarioRecord:
    record = ScenarioRecord("k", TITLES["k"], True)
    status = await ctx.client.wait_ready()
    now = status.get("device_now") or {}
    if not now.get("watching") or now.get("state") != "normal":
        record.skipped = f"the service watches no GPU ({now.get('source_note') or 'an older service'})"
        return record
    reserve = int(status["plan"]["reserve_bytes"])
    size = int(now["free_bytes"]) - reserve // 2
    hog = _hog_command(status, size)
    if isinstance(hog, str):
        record.skipped = hog
        return record
    poll = float(now.get("poll_seconds") or 1.0)
    start = time.time()
    answers = []
    stream = asyncio.create_task(ctx.client.stream_chat({**BASE, "messages": STORY, "max_tokens": 48}))
    async with _hog(*hog) as process:
        await _see_hog(ctx, record, process.pid, size, poll)
        answers.append(await stream)
        await _kill_under_hog(ctx, record, status)
        answers.append(await ctx.client.chat({**BASE, "messages": SEA, "max_tokens": 16}))
        left = time.monotonic()
    await _gpu_back(ctx, record, left)
    answers.append(await ctx.client.chat({**BASE, "messages": SEA, "max_tokens": 16}))
    await _judge(ctx, record, answers)
    record.total_seconds = round(time.time() - start, 3)
    return record


async def _see_hog(ctx: DrillContext, record: ScenarioRecord, pid: int, size: int, poll: float) -> None:
    """How long the service took to see the hog and name it, and what it made of the GPU path; more than two
    of the device watcher's poll intervals fails the record."""
    taken, polls = time.monotonic(), (await ctx.client.status())["device_now"]["polls"]
    seen = await _until(ctx, lambda s: _named(s, pid) is not None, "the hog in the status", 30)
    delay = time.monotonic() - taken
    named = _named(seen, pid) or {}
    polled = seen["device_now"]["polls"] - polls
    path = seen.get("gpu_path") or {}
    record.notes.append(
        f"hog {named.get('describe')} took {format_size(size)}: seen and named after {delay:.2f} s "
        f"({delay / poll:.1f} poll intervals of {poll:g} s; {polled} readings); "
        f"GPU path {path.get('state')}: {path.get('reason') or '-'}"
    )
    if delay > 2 * poll + 0.5:
        record.failed_checks.append(f"the hog was seen after {delay:.2f} s, more than two poll intervals")


async def _kill_under_hog(ctx: DrillContext, record: ScenarioRecord, before: ServiceStatus) -> None:
    """Kill the GPU worker while the hog holds the memory: it must come back with a plan that fits (`before`:
    the status before the hog, for its old context) or stay off the GPU, never fail its load."""
    killed = (await ctx.client.arm("kill", 0))["pid"]
    settled = await _until(
        ctx,
        lambda s: (
            s["workers"]["gpu"]["pid"] != killed and s["workers"]["gpu"]["state"] in ("ready", "stopped")
        ),
        "the GPU worker to come back or stay off",
    )
    gpu = settled["workers"]["gpu"]
    failure = gpu.get("last_failure") or {}
    if gpu["state"] == "ready":
        record.notes.append(
            f"GPU worker killed under the hog: back with n_ctx {gpu['profile']['n_ctx']} (was "
            f"{before['workers']['gpu']['profile']['n_ctx']}); last failure {failure.get('kind')}"
        )
    else:
        record.notes.append(f"GPU worker killed under the hog: stays off the GPU: {gpu.get('reason')}")
    if failure.get("kind") == "oom_load":
        record.failed_checks.append("the GPU worker's restart failed its load out of memory")


async def _gpu_back(ctx: DrillContext, record: ScenarioRecord, left: float) -> None:
    """The hog has exited (at `left`): the GPU path must come back to normal and the GPU worker be ready."""
    back = await _until(
        ctx,
        lambda s: (
            s["workers"]["gpu"]["state"] == "ready" and (s.get("gpu_path") or {}).get("state") == "normal"
        ),
        "the GPU back after the hog exited",
    )
    record.notes.append(
        f"hog exited: GPU path normal and the GPU worker ready {time.monotonic() - left:.2f} s later "
        f"(pid {back['workers']['gpu']['pid']})"
    )


async def _judge(ctx: DrillContext, record: ScenarioRecord, answers: list[Answer]) -> None:
    """Every job of the scenario completed once, and no check failed on the way."""
    for answer in answers:
        trace = await count_answer(ctx, record, answer)
        if trace is not None:
            record.job_ids.append(answer.job_id)
            record.final_states.append(trace.state)
    record.answered_by = "; ".join(answerer(a.failsoft) for a in answers)
    record.set_output(answers[0].text)  # the stream that ran while the hog took the memory
    record.connection_survived = all(a.connection_ok for a in answers)
    record.expected = "every job completed once; the hog seen within two polls; the GPU back after it"
    record.actual = f"{len(answers)} jobs: {', '.join(record.final_states)}"
    record.decision_ok = record.final_states == ["completed"] * len(answers) and not record.failed_checks
