"""Scenarios m and n: the peer rung of the ladder, played on a pair of services the drill starts (peer_pair):
this service A, and B, its `[[peers]]` entry, on a simulated GPU of its own.

- m: A's GPU worker stopped (the control API), one request: B's GPU answers it, once, under the request's id.
- n: A's GPU worker stopped, a stream goes to B, and B's service is killed (SIGKILL) after a few tokens: A's
  CPU resumes the stream after the text the client already has, the answer is whole and given once, and A
  marks the peer down.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from tray_app.drill.bodies import BASE, FAULT_REQUEST, STORY
from tray_app.drill.client import DrillError, ServiceClient
from tray_app.drill.context import DrillContext, finish
from tray_app.drill.expected import EXPECTED, TITLES
from tray_app.drill.kill import Kill
from tray_app.drill.peer_pair import PeerSide
from tray_app.drill.records import ScenarioRecord

NO_PAIR = (
    "the peer scenarios need a peer the drill can stop and kill: the drill plays them on a pair of services "
    "it starts itself (run `failsoft drill` without --url)"
)
PEER_WAIT = 60.0  # A probes its peers at start; a ready one every 30 s
DOWN_WAIT = 10.0  # a failed request marks the peer down at once
KILL_AFTER = 3  # text chunks B streams before its service is killed
# Long enough that B is still answering when it is killed, every token of it (no end of text).
LONG_STORY: dict[str, Any] = {**BASE, "messages": STORY, "max_tokens": 96, "ignore_eos": True}


def _peer_state(status: dict[str, Any], name: str) -> str | None:
    peer = next((p for p in status.get("peers") or [] if p.get("name") == name), None)
    return str(peer.get("state")) if peer else None


async def _peer_in(ctx: DrillContext, peer: PeerSide, state: str, timeout: float) -> None:
    async def reached() -> bool:
        return _peer_state(dict(await ctx.client.status()), peer.name) == state

    await ctx.client.wait_for(reached, f"this service to report peer {peer.name} {state}", timeout, 0.2)


@contextlib.asynccontextmanager
async def _gpu_stopped(ctx: DrillContext) -> AsyncIterator[None]:
    """This service's GPU worker stopped through the control API, and started again afterwards (the drill
    leaves the service as it found it)."""
    await ctx.client.wait_ready()
    await ctx.client.worker_action("gpu", "stop")
    try:
        yield
    finally:
        await ctx.client.worker_action("gpu", "start")


def _skipped(record: ScenarioRecord, ctx: DrillContext) -> PeerSide | None:
    if ctx.peer is None:
        record.skipped = NO_PAIR
    return ctx.peer


# ------------------------------------------------------------------------------------------ m
async def gpu_taken(ctx: DrillContext) -> ScenarioRecord:
    record = ScenarioRecord("m", TITLES["m"], False)
    peer = _skipped(record, ctx)
    if peer is None:
        return record
    await _peer_in(ctx, peer, "ready", PEER_WAIT)
    on_peer = ServiceClient(peer.base_url, peer.api_key, admin=peer.admin)
    try:
        before = {job["id"] for job in await on_peer.jobs()}
        request_id = f"drill-m-{secrets.token_hex(4)}"
        async with _gpu_stopped(ctx):
            start = time.time()
            answer = await ctx.client.chat(FAULT_REQUEST, headers={"X-Request-Id": request_id})
        trace = await finish(ctx, record, answer, EXPECTED["m"], start)
        ran = [job for job in await on_peer.jobs() if job["id"] not in before]
    finally:
        await on_peer.aclose()
    jobs = ", ".join(f"{job['id']} ({job['request_id']}, {job['worker']} {job['state']})" for job in ran)
    record.notes.append(f"peer {peer.name} at {peer.base_url} ran {len(ran)} job(s): {jobs or '-'}")
    if [job.get("request_id") for job in ran] != [request_id]:
        record.failed_checks.append(f"the peer ran {len(ran)} job(s), expected one under {request_id}")
    elif ran[0].get("worker") != "gpu":
        record.failed_checks.append(f"the peer answered on its {ran[0].get('worker')}, not its GPU")
    if trace is not None and trace.record.get("request_id") != request_id:
        record.failed_checks.append(f"this service's job has request id {trace.record.get('request_id')}")
    if (answer.failsoft or {}).get("peer") != peer.name:
        record.failed_checks.append(f"the answer names no peer {peer.name}: {answer.failsoft}")
    return record


# ------------------------------------------------------------------------------------------ n
async def peer_killed(ctx: DrillContext) -> ScenarioRecord:
    record = ScenarioRecord("n", TITLES["n"], True)
    peer = _skipped(record, ctx)
    if peer is None:
        return record
    resumes = ctx.status["policy"].get("stream_after_content", "resume")
    if resumes != "resume":
        record.skipped = (
            f"the service's failover.stream_after_content is {resumes!r}: n plays a stream resumed on this "
            "CPU after the peer's text reached the client"
        )
        return record
    await _peer_in(ctx, peer, "ready", PEER_WAIT)
    # B's service, mid-answer: its connection to A drops.
    kill = Kill(peer.pid, lambda answer: len(answer.content_at) >= KILL_AFTER)
    async with _gpu_stopped(ctx):
        start = time.time()
        answer = await ctx.client.stream_chat(LONG_STORY, stop_after=kill.on_chunk())
    await finish(ctx, record, answer, EXPECTED["n"], start)
    record.decision_why = (
        "the peer's attempt failed after text reached the client; stream_after_content = resume: this "
        "machine's CPU, the next rung, continued from the text already sent"
    )
    if not kill.delivered:
        record.failed_checks.append("the stream ended before the peer could be killed")
        return record
    record.notes.append(
        f"peer {peer.name} (pid {peer.pid}) killed after {len(kill.delivered)} characters; the answer has "
        f"{len(answer.text)}"
    )
    if len(answer.text) <= len(kill.delivered):
        record.failed_checks.append("the answer does not continue after the text streamed before the kill")
    if answer.finish_reasons != 1:
        record.failed_checks.append(f"{answer.finish_reasons} finish reasons on the wire, expected 1")
    try:
        await _peer_in(ctx, peer, "down", DOWN_WAIT)
        record.notes.append(f"this service reports peer {peer.name} down")
    except DrillError as error:
        record.failed_checks.append(f"the peer is not reported down: {error}")
    return record
