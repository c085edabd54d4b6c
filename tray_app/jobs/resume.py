"""Jobs an earlier run of the service accepted and did not finish (the journal holds them as unfinished):
which of them go on after a restart, and as what (`Jobs.resume_unfinished` applies it).

A background job goes on, under its id: its client collects it later. So does a job in the user's hands
(awaiting approval, or approved): the user decided about it, not its client. An interactive request has no
client any more (its connection ended with the old process): it ends, saying so, rather than run for nobody.

A job goes on from its request (the journal keeps no partial answer). An attempt the old process left open
was cut off with it: it is closed as such, so the job's attempts show one run to completion, the one that
stores its answer (the registry stores an answer once).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from tray_app.config import Config
from tray_app.contract.vocabulary import JobState, Reason, job_kind
from tray_app.jobs import policy
from tray_app.jobs.journal import Journal, StoredJob
from tray_app.jobs.registry import Job, JobRegistry
from tray_app.jobs.routing import Models, Refused, tokenizer_refusal
from tray_app.jobs.worker_port import Worker
from tray_app.library.catalog import ModelEntry
from tray_app.tokenizer.wire import TokenizerFailed


class JobsFacade(Protocol):
    """What resuming asks of the jobs facade (jobs.intake.Jobs)."""

    journal: Journal
    registry: JobRegistry
    models: Models
    workers: Callable[[str], Worker | None]
    config: Callable[[], Config]

    def run_task(self, job: Job, work: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]: ...

    async def route(self, job: Job, deadline: float) -> policy.Decision: ...

    def refusal(self, job: Job, decision: policy.Decision) -> Refused: ...

    async def ask_approval(self, job: Job, decision: policy.Decision) -> None: ...

    async def drain(self, job: Job) -> None: ...


BACKGROUND_DEADLINE = 24 * 3600.0  # a background job's client collects it later: a day to finish

RESUMED_MAX_TOKENS = 256  # a resumed job whose body names no budget (it was counted at its first start)
ATTEMPT_CUT_OFF = "service_restarted: the service stopped during this attempt"
CLIENT_LOST = "the service restarted; the client's connection was lost"


@dataclass(frozen=True)
class Ending:
    """How an unfinished job ends at a restart, its client being gone."""

    state: str  # cancelled, or failed when part of its answer may have reached the client
    error: dict[str, Any]
    reason: str = Reason.SERVICE_RESTARTED


def in_users_hands(stored: StoredJob) -> bool:
    """Awaiting the user's approval, or approved (a job put in their hands is the only one journaled with a
    CPU estimate; an unknown estimate is journaled as none, so such an approved job is not told apart)."""
    return stored.state == JobState.AWAITING_APPROVAL or stored.estimated_seconds is not None


def client_gone(stored: StoredJob) -> Ending | None:
    """The end of an interactive job whose client waited on the old process; None for a job that goes on."""
    if stored.background or in_users_hands(stored):
        return None
    error = {"message": CLIENT_LOST, "code": Reason.SERVICE_RESTARTED}
    if stored.stream and stored.state == JobState.RUNNING:
        # Its stream broke off with the old process: part of the answer may have been delivered.
        return Ending("failed", {**error, "message": f"{CLIENT_LOST} during its stream"})
    return Ending("cancelled", error)


def open_attempts(attempts: list[dict[str, Any]]) -> list[int]:
    """The numbers of the attempts the old process left open (started, never ended)."""
    return [int(attempt["number"]) for attempt in attempts if attempt.get("ended_at") is None]


def resumed_job(
    stored: StoredJob,
    entry: ModelEntry | None,
    roles: dict[str, str],
    *,
    attempts: list[dict[str, Any]],
    background: bool,
    deadline_seconds: float,
) -> Job:
    """The live job for a journaled one: the same id, request, read token and seed (the body keeps it), on
    the model its body names; its attempts numbered on from the journal's. Its prompt is counted again
    before it is routed (`JobRegistry.set_prompt_tokens`): the journal keeps no count."""
    numbered = max((int(attempt["number"]) for attempt in attempts), default=0)
    return Job(
        id=stored.id,
        request_id=stored.request_id,
        kind=job_kind(stored.kind),
        body=stored.body,
        stream=stored.stream,
        background=background,
        body_hash=stored.body_hash,
        idempotency_key=stored.idempotency_key,
        prompt_tokens=0,
        max_tokens=int(
            stored.body.get("max_tokens") or stored.body.get("max_completion_tokens") or RESUMED_MAX_TOKENS
        ),
        deadline=time.monotonic() + deadline_seconds,
        created_at=stored.created_at,
        state=JobState(stored.state),
        worker=stored.worker,
        attempts=max(stored.attempts, numbered),
        estimated_seconds=stored.estimated_seconds,
        fallback_reason=stored.fallback_reason,
        effects_delivered=stored.effects_delivered,
        asked_model=entry.name if entry is not None else "",
        models=dict.fromkeys(roles, entry.name) if entry is not None else {},
        roles=roles,
        read_token=stored.read_token,
    )


async def gpu_started(worker: Worker | None, wait: float) -> None:
    """Wait (up to `wait` seconds) until the main model's GPU worker has started: ready, or its start failed.
    The service resumes its jobs as it starts its workers, before any of them has even been told to start:
    routed then, a job finds the GPU worker stopped, and is sent the CPU's way (refused there while the CPU
    worker loads too) for a GPU about to be up. That worker always starts with the service, so asking for it
    starts nothing that would not start anyway; another model's GPU worker loads when the route asks."""
    if worker is not None and worker.state != "ready":
        await worker.ensure_ready(wait)


def resume_unfinished(jobs: JobsFacade) -> None:
    """Jobs the journal holds as unfinished were accepted by an earlier run: a background job (or one in
    the user's hands) goes on, on the model it asked for (its body names it) and routed again as a new
    request would be, once its GPU worker has started; an interactive one, whose client is gone, ends
    (below)."""
    for stored in jobs.journal.unfinished():
        entry = jobs.models.find(stored.body.get("model"))
        roles = jobs.models.roles(entry) if entry is not None else {}
        ending = client_gone(stored)
        attempts = jobs.journal.attempts(stored.id)
        job = resumed_job(
            stored,
            entry,
            roles,
            attempts=attempts,
            background=ending is None or stored.background,
            deadline_seconds=BACKGROUND_DEADLINE,
        )
        jobs.registry.add(job, journaled=True)
        for number in open_attempts(attempts):
            jobs.registry.end_attempt(job, number, "cancelled", ATTEMPT_CUT_OFF)
        if ending is not None:
            jobs.registry.fail(job, ending.state, ending.error, ending.reason)
            continue
        if entry is None or not roles:
            error = {"message": f"its model {stored.body.get('model')!r} is no longer served here"}
            jobs.registry.fail(job, "failed", error, Reason.NO_WORKER_FOR_MODEL)
            continue
        if job.state == "awaiting_approval":
            # Still the user's call; counted for the run they may approve.
            jobs.run_task(job, _count_resumed(jobs, job), f"count-{job.id}")
            continue
        jobs.run_task(job, _route_and_run(jobs, job), f"job-{job.id}")


async def _route_and_run(jobs: JobsFacade, job: Job) -> None:
    """A resumed job's prompt counted again (the journal keeps no count) and its route decided again (a
    long prompt goes to the CPU, as it did the first time) once its GPU worker has started."""
    if not await _count_resumed(jobs, job):
        return
    try:
        await _gpu_started(jobs, job)
        decision = await jobs.route(job, BACKGROUND_DEADLINE)
        if decision.action == "refuse":
            jobs.refusal(job, decision)
            return
        if decision.action == "approval":
            jobs.registry.name_fallback(job, decision.reason)
            await jobs.ask_approval(job, decision)
            return
    except Refused:
        return  # the job ended with the reason
    jobs.registry.set_route(job, decision.action, decision.reason or None)
    await jobs.drain(job)


async def _count_resumed(jobs: JobsFacade, job: Job) -> bool:
    """Count a resumed job's prompt tokens (the journal keeps no count); False, the job failed, when the
    tokenizer cannot count them."""
    try:
        tokens = await jobs.models.prompts(job.asked_model).count(job.kind, job.body)
    except TokenizerFailed as error:
        refused_error = tokenizer_refusal(error).error
        jobs.registry.fail(job, "failed", refused_error.record(), refused_error.code)
        return False
    jobs.registry.set_prompt_tokens(job, tokens)
    return True


async def _gpu_started(jobs: JobsFacade, job: Job) -> None:
    """Wait until the main model's GPU worker has started (gpu_started, above)."""
    entry = jobs.models.find(job.asked_model)
    role = job.worker_role("gpu")
    if entry is not None and entry.main and role is not None:
        wait = min(max(job.time_left(), 0.0), jobs.config().supervisor.start_timeout)
        await gpu_started(jobs.workers(role), wait)
