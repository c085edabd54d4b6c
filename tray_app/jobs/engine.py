"""Running a job: its attempts one after another, the replay decision after a failure, and its effects.

`Executor.run(job)` is an async generator. For a live streamed request it yields the outcomes the client
should get; otherwise it yields nothing and leaves the answer in `job.result` (or the error in `job.error`).
One try on one worker is a `jobs.attempt.Attempt`, watched by its listeners (the CPU mirror, the CPU speed
meter, the effects-delivered note); the executor decides what follows it. Attempts are strictly sequential,
so an attempt that failed has been closed before a replay starts: nothing from a dead attempt can reach the
client, and `JobRegistry.complete` refuses a second completion.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, replace

from tray_app.contract.events import (
    FallbackCompleted,
    FallbackRefused,
    FallbackStarted,
    RouteDecided,
)
from tray_app.contract.vocabulary import Reason
from tray_app.jobs import policy
from tray_app.jobs.approvals import ApprovalDesk
from tray_app.jobs.assemble import Assembler
from tray_app.jobs.attempt import (
    Attempt,
    AttemptListener,
    AttemptTools,
    AttemptWay,
    DispatchedRequests,
    EffectsDeliveredNote,
    first_request,
    request_headers,
)
from tray_app.jobs.context import EngineHooks, JobsContext
from tray_app.jobs.cpu_speed_meter import CpuAttemptMeter, CpuSpeedMeter
from tray_app.jobs.mirror import Mirror, MirrorListener
from tray_app.jobs.outcomes import Ended, Finished, JobError, Outcome, Piece, cannot_serve
from tray_app.jobs.progress import Progress, constrained_output, delivered_tokens, shape_survives_resume
from tray_app.jobs.registry import Job
from tray_app.jobs.relay import UpstreamError
from tray_app.jobs.worker_port import (
    CpuSpeed,
    ExecutorSettings,
    Worker,
)

log = logging.getLogger(__name__)

NOT_WORKER_FAULTS = policy.NOT_WORKER_FAULTS  # no unhealthy mark for these
# A job tries a busy or starting GPU again at most this often, so a worker that says "ready" but cannot
# take the request cannot keep the job (and the event loop) going round.
MAX_GPU_RETRIES = 3
# Prompt tokens per second a CPU worker reads at least (a 7-8B model on a home server's cores), for the
# first token's deadline when its speed is not measured yet.
SLOWEST_CPU_PROMPT_RATE = 5.0

CAUSE_WAIT_SECONDS = 1.0  # how long a failed attempt waits for its worker's supervisor to name the cause


@dataclass(frozen=True)
class _Dropped:
    """An attempt whose worker went away mid-answer: which process, and what the router saw."""

    role: str
    pid: int
    attempt: int
    message: str


@dataclass
class _Run:
    """One job's way through its attempts (Executor.run): where the next one goes, what happened so far."""

    progress: Progress
    role: str  # the device of the next attempt: "gpu" or "cpu"
    slot: float | None  # a slot the job already holds for it (the first attempt's, from admission)
    resume: bool = False  # the next attempt continues what the client already has
    fallback_started_at: float | None = None
    dropped: _Dropped | None = None  # a GPU attempt that ended with the connection: named at the end
    handed_over: bool = False  # put in the user's hands: from then on the job is theirs, not the client's


async def _each(outcomes: list[Outcome]) -> AsyncGenerator[Outcome, None]:
    for outcome in outcomes:
        yield outcome


class Executor:
    def __init__(
        self, ctx: JobsContext, settings: ExecutorSettings, hooks: EngineHooks, mirror: Mirror | None = None
    ) -> None:
        self.ctx = ctx
        self.settings = settings
        self._cpu_state = hooks.cpu_state
        self._stand_in = hooks.stand_in
        self._prompts = hooks.prompts
        self._on_fallback = hooks.on_fallback
        self.mirror = mirror  # the CPU mirror: reads a GPU job's prompt on the CPU ahead of a failover
        self.cpu_speed = mirror.speed if mirror is not None else CpuSpeed()
        self.cpu_meter = CpuSpeedMeter(self.cpu_speed)  # CPU attempts measure the speed through it
        self.desk = ApprovalDesk(self.ctx.registry, lambda: self.settings, self.drain)  # the user's decisions
        self.shutting_down = False
        self._dispatched = DispatchedRequests()  # first requests not yet taken up by an attempt
        self._tools = AttemptTools(
            lambda: self.settings,
            self.ctx.workers,
            self.ctx.slots,
            self.ctx.relay,
            self.ctx.registry,
            self._prompts,
            self._prompt_rate,
            self._dispatched,
        )

    # ------------------------------------------------------------------------------------------- run
    def dispatch(self, job: Job) -> None:
        """Write an admitted job's first request to its worker now, before the job's task starts: the
        task's first attempt takes the answer up (`DispatchedRequests.take`), so the client's first token
        does not wait for that task to be scheduled. Nothing is sent when the worker is not ready: the
        attempt then does what it always does."""
        worker_role = job.worker_role(job.route)
        worker = self.ctx.workers(worker_role) if worker_role else None
        if worker_role is None or worker is None or worker.state != "ready" or not worker.base_url:
            return
        url, body = first_request(job, worker, worker_role)
        worker.note_tokens(0)  # as in an attempt: a drill's fault armed for "before any token" fires first
        sent = self.ctx.relay.dispatch(url, body, request_headers(job, worker, worker_role, body))
        self._dispatched.put(job, worker_role, url, sent)

    async def run(
        self, job: Job, *, deliver: bool, held_slot: float | None = None
    ) -> AsyncGenerator[Outcome, None]:
        """Drive `job` to a final state (or to awaiting approval). `deliver`: a client reads the stream."""
        run = _Run(Progress(Assembler(job.kind)), job.route, held_slot)
        try:
            while True:
                try:
                    async with aclosing(self._attempt(job, run, deliver)) as pieces:
                        async for piece in pieces:
                            yield piece
                except UpstreamError as failure:
                    ending = await self._after_failure(job, failure, run, deliver)
                    if ending is None:
                        continue  # the next attempt: the GPU again, its stand-in, or the CPU
                    async with aclosing(ending) as outcomes:
                        async for outcome in outcomes:
                            yield outcome
                    return
                run.slot = None
                self._name_the_crash(job, run.dropped)
                for outcome in self._complete(job, run, deliver):
                    yield outcome
                return
        except (asyncio.CancelledError, GeneratorExit):
            # The client went away (or stopped reading). A job handed to the user stays in their hands
            # (waiting, or approved and running: its answer is kept for GET /v1/jobs/{id}); at shutdown,
            # unfinished jobs stay unfinished in the journal and resume at the next start.
            if not run.handed_over and job.state != "awaiting_approval" and not self.shutting_down:
                self._client_gone(job, run)
            raise
        except Exception as error:
            # A fault in the router itself must not leave the job running forever: it ends, with a reason.
            log.exception("job %s: internal error", job.id)
            internal = JobError(
                500,
                Reason.INTERNAL_ERROR,
                f"internal error in the router ({type(error).__name__}); the job was stopped",
                type="server_error",
            )
            self.ctx.registry.fail(job, "failed", internal.record(), Reason.INTERNAL_ERROR)
            if deliver:
                yield Ended(internal)
        finally:
            self._dispatched.drop(job)

    def _client_gone(self, job: Job, run: _Run) -> None:
        """The job ends with its client (cancelled); a GPU crash it met is named, now that its supervisor may
        know how the process ended."""
        self._name_the_crash(job, run.dropped)
        gone = {"message": "the client went away", "code": "cancelled"}
        self.ctx.registry.fail(job, "cancelled", gone, Reason.CLIENT_DISCONNECTED)

    async def drain(self, job: Job, held_slot: float | None = None) -> None:
        """Run a job nobody streams (non-streamed requests, background jobs, approved CPU runs)."""
        async for _ in self.run(job, deliver=False, held_slot=held_slot):
            pass

    def _complete(self, job: Job, run: _Run, deliver: bool) -> list[Outcome]:
        """The last attempt answered: the job's result, and a fallback's end told (FallbackCompleted)."""
        progress = run.progress
        result = progress.assembler.result(job.prompt_tokens, {})
        result["failsoft"] = job.failsoft()
        if job.model or self.settings.model_id:
            result["model"] = job.model or self.settings.model_id
        if not self.ctx.registry.complete(job, result):
            return []
        if run.fallback_started_at is not None:
            self._on_fallback("completed")
            seconds = time.monotonic() - run.fallback_started_at
            self.ctx.bus.publish(
                FallbackCompleted(job_id=job.id, reason=job.fallback_reason or "", seconds=seconds)
            )
        return [Finished(result, progress.chunk_id, progress.created, progress.model)] if deliver else []

    # --------------------------------------------------------------------------------------- attempts
    def _attempt(self, job: Job, run: _Run, deliver: bool) -> AsyncGenerator[Piece, None]:
        """The next attempt (jobs.attempt), with its listeners: the CPU speed meter, the effects-delivered
        note and the CPU mirror, in the order each is told."""
        listeners: list[AttemptListener] = [
            CpuAttemptMeter(self.cpu_meter, self.ctx.registry),
            EffectsDeliveredNote(self.ctx.registry),
        ]
        if self.mirror is not None:
            listeners.append(MirrorListener(self.mirror, self._prompts, deliver))
        way = AttemptWay(run.role, resume=run.resume, deliver=deliver, listeners=tuple(listeners))
        return Attempt(self._tools, job, run.progress, way).run(run.slot)

    def _prompt_rate(self, worker_role: str) -> float:
        """Prompt tokens per second the first token's deadline allows for: a GPU's are many; a CPU reads as
        fast as it was measured to (else a few times its generation speed, jobs.policy.PROMPT_SPEEDUP), or
        slower than any when unknown, so a long prompt read on a slow CPU is not taken for a hung worker."""
        if not worker_role.startswith("cpu"):
            return 100.0
        speed = self.cpu_speed
        measured = policy.cpu_prompt_speed(speed.prompt_tokens_per_second, speed.tokens_per_second)
        return max(measured / 2, SLOWEST_CPU_PROMPT_RATE)  # half the measured: a margin for a busy machine

    # --------------------------------------------------------------------------------------- failures
    async def _after_failure(
        self, job: Job, failure: UpstreamError, run: _Run, deliver: bool
    ) -> AsyncGenerator[Outcome, None] | None:
        """What follows a failed attempt: None for the next attempt (the GPU again, its stand-in, the CPU),
        else the outcomes the job ends with (an error, or the wait for the user's decision)."""
        run.slot = None
        progress = run.progress
        if failure.kind == "exited" and progress.worker_pid is not None and run.dropped is None:
            role = job.worker_role(run.role) or run.role
            run.dropped = _Dropped(role, progress.worker_pid, job.attempts, failure.message)
        if run.role == "peer":
            self._report_peer_failure(job, failure)
        if failure.client_error or run.role == "cpu":
            self._name_the_crash(job, run.dropped)
            return _each(self._fail_upstream(job, failure, deliver, progress.worker_pid))
        decision = await self._decide_after_failure(job, failure, run, deliver)
        if decision.action == "gpu":
            return None  # the GPU worker came back, or the stand-in answers there
        if decision.action in ("peer", "cpu"):
            self._fall_back(job, failure, decision, run, deliver)
            return None
        self.ctx.registry.name_fallback(job, failure.kind)
        if decision.action == "approval":
            return await self._hand_over(job, decision, run, deliver)
        return _each(self._refuse(job, decision, deliver))

    def _fall_back(
        self, job: Job, failure: UpstreamError, decision: policy.Decision, run: _Run, deliver: bool
    ) -> None:
        """The next attempt is a peer's (routed there by the decision) or this machine's CPU: told, and the
        time it takes measured."""
        if decision.action == "cpu":
            run.role = "cpu"
            self.ctx.registry.set_route(job, "cpu", failure.kind)
        else:
            run.role = "peer"
        run.resume = decision.resume
        if run.fallback_started_at is None:
            run.fallback_started_at = time.monotonic()
        self._on_fallback("started")
        to = job.worker_role(run.role) or run.role
        self.ctx.bus.publish(FallbackStarted(job_id=job.id, reason=failure.kind, to=to))
        if not deliver:
            run.progress.reset_undelivered(job.kind)

    def _report_peer_failure(self, job: Job, failure: UpstreamError) -> None:
        """A peer's attempt failed: the peer is down until its probe finds it back (jobs that follow go to the
        next rung). What it refused (401, 404, 429, ...) is the peer's trouble, not the client's: only a 400
        or 422, a request its server found wrong, stays the client's error."""
        if failure.client_error and failure.status not in (400, 422):
            failure.kind = Reason.PEER_FAILED
        peer = self.ctx.workers(job.worker_role("peer") or "")
        if peer is not None:
            peer.mark_unhealthy(failure.message, failure.kind)

    async def _hand_over(
        self, job: Job, decision: policy.Decision, run: _Run, deliver: bool
    ) -> AsyncGenerator[Outcome, None]:
        """The user decides (approval), with a stand-in they may pick instead; a refusal when their backlog
        is full. Handed over, the job is theirs: the client only waits for its end."""
        offer = await self._stand_in(job, offer=True)
        refused = self.desk.request_approval(job, decision, offer.model if offer else None)
        if refused is not None:
            return _each(self._refuse(job, refused, deliver))
        run.handed_over = True
        return self.desk.wait_for_final(job, deliver, decision.reason)

    async def _decide_after_failure(
        self, job: Job, failure: UpstreamError, run: _Run, deliver: bool
    ) -> policy.Decision:
        progress = run.progress
        gpu = await self._report_gpu_failure(job, failure, progress) if run.role == "gpu" else None
        remaining = max(job.max_tokens - await delivered_tokens(progress, self._prompts(job.model)), 1)
        context = policy.FailureContext(
            streaming=deliver,
            content_delivered=progress.output_delivered,
            tool_call_delivered=progress.tool_call_delivered,
            prompt_tokens=job.prompt_tokens,
            remaining_tokens=remaining,
            time_left=job.time_left(),
            constrained=constrained_output(job.body) and not shape_survives_resume(job, progress),
            stand_in_answering=job.stand_in_for is not None,
            cached_tokens=self.mirror.held(job) if self.mirror is not None else 0,
        )
        peer = self._peer_next(job, failure, context) if run.role == "gpu" else None
        if peer is not None:
            return peer
        if await self._stand_in_first(job, failure, progress, context, deliver):
            return policy.Decision("gpu", policy.STAND_IN)
        cpu = await self._cpu_state(job.time_left(), job.worker_role("cpu"))
        decision = policy.decide_replay(context, cpu, self.settings.policy)
        if await self._gpu_again(job, failure, progress, decision, gpu):
            progress.gpu_retries += 1
            return policy.Decision("gpu", "")
        route = {"cpu": "cpu", "approval": "approval"}.get(decision.action, "refused")
        self.ctx.bus.publish(RouteDecided(job_id=job.id, route=route, reason=decision.reason or failure.kind))
        return decision

    async def _report_gpu_failure(
        self, job: Job, failure: UpstreamError, progress: Progress
    ) -> Worker | None:
        """Tell the GPU worker's supervisor what the attempt saw, and learn from it how the process ended;
        the job's GPU worker, if it has one."""
        gpu_role = job.worker_role("gpu")
        gpu = self.ctx.workers(gpu_role) if gpu_role else None
        if gpu is not None and failure.kind not in NOT_WORKER_FAULTS:
            self._report(gpu, progress.worker_pid, failure)
            if failure.kind == "exited" and progress.worker_pid is not None:
                # A dropped connection only says the worker went away; its supervisor names how the
                # process ended (an abort, a kill) a moment later, and that names the fallback.
                ended = await gpu.failure_of(progress.worker_pid, CAUSE_WAIT_SECONDS)
                if ended and ended.get("kind") not in (None, "exited"):
                    failure.kind = str(ended["kind"])
        return gpu

    def _peer_next(
        self, job: Job, failure: UpstreamError, context: policy.FailureContext
    ) -> policy.Decision | None:
        """A peer's GPU takes the job over now (routed there: the next attempt is the peer's), if one serves
        its model and a replay is safe; None: the next rung decides."""
        decision = policy.peer_takes_over(context, self.settings.policy)
        role = self.ctx.peer_for(job.asked_model) if decision is not None else None
        if decision is None or role is None or job.stand_in_for is not None:
            return None
        self.ctx.registry.to_peer(job, role, failure.kind)
        self.ctx.bus.publish(RouteDecided(job_id=job.id, route="peer", reason=failure.kind))
        return replace(decision, reason=failure.kind)

    async def _stand_in_first(
        self,
        job: Job,
        failure: UpstreamError,
        progress: Progress,
        context: policy.FailureContext,
        deliver: bool,
    ) -> bool:
        """Whether the job's stand-in answers it on the GPU now (substituted: the next attempt is its)."""
        worker_fault = failure.kind not in NOT_WORKER_FAULTS
        stand_in = await self._stand_in(job) if worker_fault else None
        if stand_in is None:
            return False
        case = policy.StandInCase(
            allowed=True,
            available=True,
            fits=stand_in.prompt_tokens + context.remaining_tokens <= stand_in.n_ctx_per_seq,
            content_delivered=progress.output_delivered,
            tool_call_delivered=progress.tool_call_delivered,
        )
        if not policy.stand_in_first(case):
            return False
        self.ctx.registry.substitute(
            job, stand_in.model, stand_in.gpu_role, stand_in.prompt_tokens, policy.STAND_IN
        )
        self.ctx.bus.publish(RouteDecided(job_id=job.id, route="gpu", reason=policy.STAND_IN))
        if not deliver:
            progress.reset_undelivered(job.kind)
        return True

    async def _gpu_again(
        self,
        job: Job,
        failure: UpstreamError,
        progress: Progress,
        decision: policy.Decision,
        gpu: Worker | None,
    ) -> bool:
        """Whether the next attempt is the GPU's again: it was only busy or starting and is ready now."""
        return bool(
            policy.try_gpu_again(failure.kind, progress.output_delivered, decision)
            and gpu is not None
            and progress.gpu_retries < MAX_GPU_RETRIES
            and await gpu.ensure_ready(min(self.settings.worker_ready_wait, max(job.time_left(), 0.0)))
            and gpu.base_url  # "ready" with no address yet would send the next attempt straight back here
        )

    def _refuse(self, job: Job, decision: policy.Decision, deliver: bool) -> list[Outcome]:
        self._on_fallback("refused")
        self.ctx.bus.publish(FallbackRefused(job_id=job.id, reason=decision.reason, detail=decision.detail))
        error = cannot_serve(
            f"the GPU attempt failed and the job cannot continue on the CPU: {decision.reason}"
            + (f" ({decision.detail})" if decision.detail else ""),
            decision.reason,
            retry_after=5,
            job_id=job.id,
            reason=decision.reason,
        )
        self.ctx.registry.fail(job, "failed", error.record(), decision.reason)
        return [Ended(error)] if deliver else []

    def _name_the_crash(self, job: Job, dropped: _Dropped | None) -> None:
        """A dropped connection only says the worker went away; its supervisor knows how the process ended
        (an abort on a CUDA error, a kill). Once it does, that names the job's fallback and the attempt."""
        if dropped is None:
            return
        worker = self.ctx.workers(dropped.role)
        last = worker.last_failure if worker is not None else None
        if not last or last.get("pid") != dropped.pid or last.get("kind") in (None, "exited"):
            return
        kind = str(last["kind"])
        self.ctx.registry.refine_fallback(job, "exited", kind)
        error = f"{kind}: {last.get('message')} (the router saw: {dropped.message})"
        self.ctx.registry.set_attempt_error(job, dropped.attempt, error)

    @staticmethod
    def _report(worker: Worker, attempt_pid: int | None, failure: UpstreamError) -> None:
        """Tell the supervisor what the attempt saw, unless it already acted: a worker it killed (hung) or
        replaced since must not be failed again on old news."""
        if worker.state != "ready" or (attempt_pid is not None and worker.pid != attempt_pid):
            return
        worker.mark_unhealthy(failure.message, failure.kind, pid=attempt_pid)

    def _fail_upstream(
        self, job: Job, failure: UpstreamError, deliver: bool, worker_pid: int | None
    ) -> list[Outcome]:
        if failure.client_error:
            code = (
                (failure.body or {}).get("error", {}).get("code") if isinstance(failure.body, dict) else None
            )
            code = code if isinstance(code, str) else "invalid_request"
            error = JobError(400, code, failure.message, type="invalid_request_error")
        else:
            cpu_role = job.worker_role("cpu")
            cpu = self.ctx.workers(cpu_role) if cpu_role else None
            if cpu is not None and failure.kind not in NOT_WORKER_FAULTS:
                self._report(cpu, worker_pid, failure)
            reason = {"unavailable": policy.NO_CPU_WORKER, "queue_timeout": "queue_timeout"}.get(
                failure.kind, Reason.CPU_ATTEMPT_FAILED
            )
            error = cannot_serve(
                f"the CPU attempt failed: {failure.message}", reason, 5, job_id=job.id, reason=reason
            )
        self.ctx.registry.fail(job, "failed", error.record(), error.code)
        return [Ended(error)] if deliver else []
