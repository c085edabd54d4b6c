"""Where a job goes: the GPU, its model's stand-in, the CPU, the user's approval, or a refusal. The decisions
are the policy's (jobs.policy, pure); this gathers what they need, the models' contexts, the workers' states,
the CPU's speed and RAM, a library model loaded on demand, and applies them through the registry."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Any, Protocol

import psutil

from tray_app.budget.plan import Plan
from tray_app.contract.events import RouteDecided
from tray_app.contract.vocabulary import Reason
from tray_app.jobs import gpu_policy, policy
from tray_app.jobs.context import HostHooks, JobsContext
from tray_app.jobs.engine import Executor
from tray_app.jobs.outcomes import JobError
from tray_app.jobs.registry import Job
from tray_app.jobs.worker_port import Prompts, StandIn
from tray_app.library.catalog import ModelEntry
from tray_app.library.errors import LoadRefused
from tray_app.tokenizer.wire import TokenizerFailed

STARTING_CPU_WAIT = 10.0  # seconds a request a client waits on gives a CPU worker that is starting


class Refused(Exception):
    """The request cannot be served (now): `error` says why, in the words a client gets."""

    def __init__(self, error: JobError) -> None:
        super().__init__(error.message)
        self.error = error


def refused(status: int, code: str, message: str, **kw: Any) -> Refused:
    return Refused(JobError(status, code, message, **kw))


class Models(Protocol):
    """What the intake needs to know of the models and their workers (the host implements it)."""

    @property
    def model_names(self) -> set[str]: ...

    def find(self, name: str | None) -> ModelEntry | None: ...

    def stand_in_for(self, entry: ModelEntry) -> ModelEntry | None: ...

    def roles(self, entry: ModelEntry) -> dict[str, str]: ...

    def n_ctx_per_seq(self, entry: ModelEntry, device: str) -> int: ...

    def cpu_plan(self, role: str | None) -> Plan | None: ...

    def prompts(self, model: str = "") -> Prompts:
        """Model `model`'s tokenizer and template ("" or an unknown name: the main model's)."""
        ...

    def file_prompts(self, model_file: str) -> Prompts:
        """The tokenizer of a model file that no chat worker serves (an embeddings model)."""
        ...

    def tool_call_opener_for(self, model: str) -> str: ...

    def touch(self, name: str, keep_alive: float | None) -> None: ...

    async def load(self, entry: ModelEntry, device: str, wait: float) -> bool: ...


class Routing:
    """Route decisions for the jobs facade (jobs.intake.Jobs), over the same collaborators."""

    def __init__(self, ctx: JobsContext, models: Models, executor: Executor, hooks: HostHooks) -> None:
        self.ctx = ctx
        self.models = models
        self.executor = executor
        self.cpu_speed_ready = hooks.cpu_speed_ready  # the first CPU speed measurement, while it runs
        self.count = hooks.count  # requests by route and outcome (the service's metrics)
        self.gpu_path = hooks.gpu_path  # the device side's path state and why (host.gpu_path owns it)

    def model(self, name: str | None) -> ModelEntry:
        """The model a request names (none: the main model); 404 listing what exists otherwise."""
        entry = self.models.find(name)
        if entry is None:
            raise model_not_found(name, self.models.model_names)
        return entry

    def context_per_slot(self, entry: ModelEntry) -> int:
        """The context one request may use: the GPU plan's per slot (the CPU's for a CPU-only model)."""
        if entry.main:
            return self.models.n_ctx_per_seq(entry, "gpu")
        return self.models.n_ctx_per_seq(entry, "gpu") or self.models.n_ctx_per_seq(entry, "cpu")

    async def route(self, job: Job, deadline: float) -> policy.Decision:
        entry = self.model(job.asked_model)
        n_ctx = self.context_per_slot(entry)
        request = policy.RouteRequest(
            job.prompt_tokens, job.max_tokens, n_ctx, await self._gpu_available(job, entry, n_ctx), deadline
        )
        decision = policy.route_on_gpu(request)
        if decision is None and not request.gpu_available:
            decision = self._peer_route(job)
        if decision is None:
            decision = await self._stand_in_route(job)
        if decision is None:
            cpu = await self.cpu_state(deadline, job.worker_role("cpu"), patient=job.background)
            decision = policy.decide_route(request, cpu, self.executor.settings.policy)
        decision = self._with_gpu_path(decision)
        route = "refused" if decision.refused else decision.action
        self.ctx.bus.publish(
            RouteDecided(job_id=job.id, route=route, reason=decision.reason, detail=decision.detail)
        )
        return decision

    def _peer_route(self, job: Job) -> policy.Decision | None:
        """The ladder's second rung at admission: this machine's GPU cannot take the job now, a peer's can
        (another machine's GPU answers sooner than a stand-in's smaller model or the CPU)."""
        role = self.ctx.peer_for(job.asked_model)
        if role is None:
            return None
        self.ctx.registry.to_peer(job, role, Reason.GPU_UNAVAILABLE)
        return policy.Decision("peer", Reason.GPU_UNAVAILABLE)

    def _with_gpu_path(self, decision: policy.Decision) -> policy.Decision:
        """A job kept off the GPU by the GPU path (squeezed, yielded, lost) says so, naming who."""
        if decision.reason != Reason.GPU_UNAVAILABLE or decision.action == "gpu":
            return decision
        words = gpu_policy.why_not_gpu(*self.gpu_path())
        if not words:
            return decision
        return replace(decision, detail=f"{decision.detail}; {words}" if decision.detail else words)

    async def _gpu_available(self, job: Job, entry: ModelEntry, n_ctx: int) -> bool:
        """Whether the job's model can answer on the GPU: the main model's worker is up; another model's
        is loaded now if the request fits it (making room by unloading idle models, see host.library)."""
        if entry.main:
            return self._gpu_worker_up(job)
        role = job.worker_role("gpu")
        if role is None or self.ctx.workers(role) is None:
            return False
        if job.prompt_tokens + job.max_tokens > n_ctx:
            return False
        wait = min(max(job.time_left(), 0.0), self.ctx.config().supervisor.start_timeout)
        try:
            return await self.models.load(entry, "gpu", wait)
        except LoadRefused as refused:
            self.ctx.registry.name_fallback(job, refused.code)
            return False

    def _gpu_worker_up(self, job: Job) -> bool:
        role = job.worker_role("gpu")
        worker = self.ctx.workers(role) if role else None
        return worker is not None and worker.state not in ("failed", "stopped")

    def start_at_once(self, job: Job, entry: ModelEntry, deadline: float) -> float | None:
        """The GPU slot, taken, when the route is plain and free: the main model, its GPU worker up, the
        request within the GPU's context, a slot free now. None: the full route and admission decide."""
        if not entry.main:
            return None
        gpu = policy.RouteRequest(
            job.prompt_tokens,
            job.max_tokens,
            self.context_per_slot(entry),
            self._gpu_worker_up(job),
            deadline,
        )
        if policy.route_on_gpu(gpu) is None:
            return None
        return self.ctx.slots.try_acquire(job.worker_role("gpu") or "gpu")

    async def _stand_in_route(self, job: Job) -> policy.Decision | None:
        """The ladder's middle rung at admission: the asked model cannot use the GPU, its stand-in can."""
        stand_in = await self.stand_in(job)
        if stand_in is None:
            return None
        fits = stand_in.prompt_tokens + job.max_tokens <= stand_in.n_ctx_per_seq
        if not policy.stand_in_first(policy.StandInCase(allowed=True, available=True, fits=fits)):
            return None
        self.ctx.registry.substitute(
            job, stand_in.model, stand_in.gpu_role, stand_in.prompt_tokens, policy.STAND_IN
        )
        return policy.Decision("gpu", policy.STAND_IN)

    def refusal(self, job: Job, decision: policy.Decision) -> Refused:
        """The job ends, failed with the decision's reason; the refusal a client gets."""
        if decision.reason == policy.CONTEXT_EXCEEDED:
            error = JobError(
                400,
                policy.CONTEXT_EXCEEDED,
                f"This request is too long for this service: {decision.detail}",
                type="invalid_request_error",
                param="messages" if job.kind == "chat" else "prompt",
            )
        else:
            error = JobError(
                503,
                decision.reason,
                f"cannot run this request: {decision.reason} ({decision.detail})",
                retry_after=5,
                details={"job_id": job.id, "reason": decision.reason},
            )
        self.ctx.registry.fail(job, "failed", error.record(), decision.reason)
        self.count("refused", decision.reason)
        return Refused(error)

    async def stand_in(self, job: Job, *, offer: bool = False, chosen: bool = False) -> StandIn | None:
        """The job's stand-in on the GPU, ready to answer now: only for a job still on its own model, when
        the request allows it, the stand-in fits the request and its GPU worker is ready (or, for a library
        model, could be loaded). Which question: may it answer on its own (library.stand_in "auto"), may
        the approval window offer it (`offer`, "ask": checked, not loaded), or the user picked it
        (`chosen`: loaded now)."""
        cfg = self.ctx.config()
        wanted = "ask" if offer or chosen else "auto"
        if job.stand_in_for or not job.may_stand_in or cfg.library.stand_in != wanted:
            return None
        asked = self.models.find(job.asked_model)
        stand = self.models.stand_in_for(asked) if asked is not None else None
        role = self.models.roles(stand).get("gpu") if stand is not None else None
        if stand is None or role is None:
            return None
        n_ctx = self.models.n_ctx_per_seq(stand, "gpu")
        try:
            prompt_tokens = await self.models.prompts(stand.name).count(job.kind, job.body)
        except TokenizerFailed:
            return None  # no stand-in this time: the job goes on as if there were none
        if prompt_tokens + job.max_tokens > n_ctx:
            return None
        wait = min(max(job.time_left(), 0.0), cfg.supervisor.start_timeout)
        if chosen:
            wait = cfg.supervisor.start_timeout  # the user is waiting for exactly this
        if stand.main or offer:
            worker = self.ctx.workers(role)
            if stand.main and (worker is None or worker.state != "ready"):
                return None
        else:
            try:
                if not await self.models.load(stand, "gpu", wait):
                    return None
            except LoadRefused:
                return None
        return StandIn(stand.name, role, prompt_tokens, n_ctx)

    def cpu_tokens_per_second(self) -> float:
        fixed = self.ctx.config().failover.cpu_tokens_per_second
        return fixed if fixed > 0 else self.executor.cpu_speed.tokens_per_second

    async def cpu_state(
        self, time_left: float, role: str | None = "cpu", *, patient: bool = False
    ) -> policy.CpuState:
        """The CPU worker `role` (the main model's, or a library model's "cpu@name") as the policy sees it.
        A worker that is starting is waited for: a few seconds, or (`patient`: a job no client waits on)
        as long as a start may take, since a start that takes longer fails."""
        worker = self.ctx.workers(role) if role else None
        plan = self.models.cpu_plan(role)
        if worker is None or plan is None:
            return policy.CpuState(False, False, False, 0.0, plan.n_ctx_per_seq if plan else 0)
        speed = self.cpu_speed_ready()
        if self.cpu_tokens_per_second() <= 0 and speed is not None and not speed.done():
            # The first measurement is still running (just after start): its answer beats no answer.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(speed), min(max(time_left, 0.0), 15.0))
        # Read after that wait, not before: the worker it waited for may be ready now.
        ready = worker.state == "ready"
        if not ready and worker.state in ("starting", "restarting", "unhealthy"):
            start = self.ctx.config().supervisor.start_timeout if patient else STARTING_CPU_WAIT
            ready = await worker.ensure_ready(min(max(time_left, 0.0), start))
        ram_ok = (
            ready
            or psutil.virtual_memory().available >= plan.weights_bytes + plan.kv_bytes + plan.compute_bytes
        )
        if not ready and ram_ok and worker.state == "stopped":
            start = self.ctx.config().supervisor.start_timeout
            ready = await worker.ensure_ready(min(max(time_left, 0.0), start))
        return policy.CpuState(True, ready, ram_ok, self.cpu_tokens_per_second(), plan.n_ctx_per_seq)


def model_not_found(name: str | None, known: set[str]) -> Refused:
    public = sorted(model for model in known if "/" not in model and "\\" not in model)
    return refused(
        404,
        "model_not_found",
        f"The model '{name}' does not exist; this service serves {', '.join(public)}",
        type="invalid_request_error",
        param="model",
    )


def tokenizer_refusal(error: TokenizerFailed) -> Refused:
    """A request whose prompt the tokenizer helper could not read: the client's fault only when the
    helper refused the input itself; otherwise the service's, for a moment (the helper was restarted)."""
    if error.kind == "input":
        return refused(
            400, "invalid_prompt", f"the prompt could not be read: {error}", type="invalid_request_error"
        )
    return refused(503, "tokenizer_unavailable", f"the prompt could not be counted: {error}", retry_after=1)


def journal_unavailable(failure: str | None) -> Refused:
    reason = failure or "the journal did not confirm the write in time"
    return refused(503, "journal_unavailable", f"background jobs are not taken: {reason}", retry_after=60)
