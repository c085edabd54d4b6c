"""The user's side of a slow CPU run: jobs put in their hands (a bounded backlog), the ones they approved run
on the CPU one after another, the stand-in they may pick instead, and a client waiting for the outcome."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any

from tray_app.contract.vocabulary import Reason
from tray_app.jobs import policy
from tray_app.jobs.outcomes import Ended, Finished, JobError, Outcome, cannot_serve
from tray_app.jobs.registry import Job, JobRegistry
from tray_app.jobs.worker_port import ExecutorSettings, StandIn, retry_after_seconds

log = logging.getLogger(__name__)


class ApprovalDesk:
    def __init__(
        self,
        registry: JobRegistry,
        settings: Callable[[], ExecutorSettings],
        drain: Callable[[Job], Coroutine[Any, Any, None]],
    ) -> None:
        self.registry = registry
        self.settings = settings  # read at each request: a config reload replaces them
        self.drain = drain  # runs a job nobody streams to its end (the executor's)
        self.queue: asyncio.Queue[Job] = asyncio.Queue()  # approved, in the order approved
        self._stand_in_runs: set[asyncio.Task[None]] = set()

    def approval_backlog(self) -> int:
        """Jobs in the user's hands, plus approved ones still in line for the CPU."""
        return self.registry.count("awaiting_approval") + self.queue.qsize()

    def request_approval(
        self, job: Job, decision: policy.Decision, stand_in_offer: str | None = None
    ) -> policy.Decision | None:
        """Put `job` in the user's hands (with a stand-in they may pick instead); a refusal instead when the
        backlog is full (checked and taken in one step, with no await between, so two requests cannot both
        take the last place)."""
        limit = self.settings().max_pending_approvals
        if self.approval_backlog() >= limit:
            detail = f"{limit} jobs already wait for approval or for the CPU (failover.max_pending_approvals)"
            return policy.Decision("refuse", policy.APPROVAL_BACKLOG_FULL, decision.estimated_seconds, detail)
        self.registry.set_route(job, "cpu")
        self.registry.await_approval(job, decision.estimated_seconds, decision.reason, stand_in_offer)
        return None

    def approve(self, job: Job) -> bool:
        if job.state != "awaiting_approval":
            return False
        self.registry.set_state(job, "queued", "approved")
        self.queue.put_nowait(job)
        return True

    def run_stand_in(self, job: Job, stand_in: StandIn) -> bool:
        """The user picked the stand-in for a job awaiting approval: it runs on the GPU now (the client still
        waiting gets its answer; a background job keeps it)."""
        if job.state != "awaiting_approval":
            return False
        self.registry.substitute(
            job, stand_in.model, stand_in.gpu_role, stand_in.prompt_tokens, policy.STAND_IN
        )
        self.registry.set_state(job, "queued", "stand-in chosen")
        task = asyncio.get_running_loop().create_task(self.drain(job), name=f"stand-in-{job.id}")
        self._stand_in_runs.add(task)
        task.add_done_callback(self._stand_in_runs.discard)
        return True

    async def run_approved(self) -> None:
        """Runs approved jobs on the CPU one after another, storing their answers (the approval runner)."""
        while True:
            job = await self.queue.get()
            if job.final:
                continue
            self.registry.set_route(job, "cpu")
            self.registry.extend_deadline(job, 24 * 3600)  # approved: the user accepted the wait
            try:
                await self.drain(job)
            except asyncio.CancelledError:
                raise
            except Exception:  # one broken job must not stop the runner; it is failed with the reason
                log.exception("approved job %s failed", job.id)
                self.registry.fail(
                    job,
                    "failed",
                    {"message": "internal error", "code": "internal_error"},
                    Reason.INTERNAL_ERROR,
                )

    async def wait_for_final(self, job: Job, deliver: bool, reason: str) -> AsyncGenerator[Outcome, None]:
        """A client waits (up to its deadline) for a job that someone else now runs (approval)."""
        try:
            await asyncio.wait_for(job.finished.wait(), max(job.time_left(), 0.0))
        except TimeoutError:
            error = cannot_serve(
                f"job {job.id} is waiting for approval to run on the CPU; "
                f"collect it later from /v1/jobs/{job.id}",
                reason,
                retry_after=retry_after_seconds(job.estimated_seconds),
                job_id=job.id,
                reason=reason,
            )
            self.registry.client_stopped_waiting(job, error.record())
            if deliver:
                yield Ended(error)
            return
        if deliver:
            if job.result is not None:
                yield Finished(job.result, replayed=True)
            else:
                yield Ended(JobError.from_record(job.error))
