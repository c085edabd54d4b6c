"""One home for a request's life before and around its run: making the job, routing it (GPU, stand-in, CPU,
approval, refusal), admission to a worker slot, the task that runs it, idempotent replay, background jobs,
cancel, and resuming what an earlier run accepted.

`Jobs` is the facade the HTTP layer talks to (llama-swap's split: the scheduler decides, its effects are a
narrow table). It speaks plain data: a `JobRequest` in, a `Job` and an `Admission` out, `Refused` (a
`JobError`) when a request cannot be served. What it needs of the rest of the service, the models and their
workers, is the `Models` protocol (jobs.routing); the host implements it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Coroutine
from dataclasses import dataclass
from typing import Any

from tray_app.contract.events import RouteDecided
from tray_app.contract.status import JobSummary, PathTiming
from tray_app.contract.vocabulary import JobKind, Reason
from tray_app.engine.tools import worker_tool_choice
from tray_app.jobs import policy, resume
from tray_app.jobs.admission import QueueFull, QueueTimeout, requested_tokens
from tray_app.jobs.context import NO_HOOKS, HostHooks, JobsContext
from tray_app.jobs.embeddings import EmbeddingRunner, InputTokens
from tray_app.jobs.engine import Executor
from tray_app.jobs.ids import new_request_id, random_seed
from tray_app.jobs.journal import StoredJob
from tray_app.jobs.keys import Accepted, Keys, Replay
from tray_app.jobs.outcomes import JobError, Outcome
from tray_app.jobs.path_timing import FirstTokenPath, PathTimings
from tray_app.jobs.registry import Job, new_id, stored_summary
from tray_app.jobs.resume import BACKGROUND_DEADLINE
from tray_app.jobs.routing import Models, Refused, Routing, journal_unavailable, refused, tokenizer_refusal
from tray_app.library.catalog import ModelEntry
from tray_app.tokenizer.wire import TokenizerFailed

log = logging.getLogger(__name__)

# A job read by its id: live (held in memory a while after it ends), or else as the journal keeps it.
LiveOrStored = Job | StoredJob

__all__ = [
    "BACKGROUND_DEADLINE",
    "Accepted",
    "Admission",
    "JobRequest",
    "Jobs",
    "LiveOrStored",
    "Refused",
    "Replay",
]


@dataclass(frozen=True)
class JobRequest:
    """A checked request, as the HTTP layer hands it over (its own checks of shape and types done)."""

    kind: JobKind
    body: dict[str, Any]  # without the router's own options (keep_alive, stand_in)
    stream: bool
    max_tokens: int | None  # as the client asked (None: not said)
    body_hash: str  # of the raw body, compared under an Idempotency-Key only
    idempotency_key: str | None
    request_id: str | None
    deadline: float  # seconds the client waits
    keep_alive: float | None = None
    may_stand_in: bool = True
    received_at: float | None = None  # when the request reached the application (a stream's first token)
    fit_budget: bool = False  # max_tokens is an upper bound (Anthropic's clients send their output limit)
    holds_tool_calls: bool = False  # its API writes tool calls only whole (Ollama's): see Job

    @property
    def model(self) -> str | None:
        value = self.body.get("model")
        return value if isinstance(value, str) else None


@dataclass(frozen=True)
class Admission:
    """How an accepted job goes on: with a worker slot taken (`held`), or waiting for the user's approval."""

    held: float | None = None
    approval: str = ""  # the reason the user is asked, when the job waits for approval


class Jobs:
    """The request lifecycle's facade; the only writer of `job.task` (every job's task starts here)."""

    def __init__(
        self, ctx: JobsContext, models: Models, executor: Executor, hooks: HostHooks = NO_HOOKS
    ) -> None:
        self.models = models
        self.registry = ctx.registry
        self.executor = executor
        self.slots = ctx.slots
        self.journal = ctx.journal
        self.bus = ctx.bus
        self.workers = ctx.workers
        self.config = ctx.config
        self.count = hooks.count  # requests by route and outcome (the service's metrics)
        self.routing = Routing(ctx, models, executor, hooks)
        self.keys = Keys(ctx.registry, ctx.journal)
        self.embeddings = EmbeddingRunner(ctx, executor.settings)
        self.input_tokens = InputTokens(lambda: models.prompts(), lambda path: models.file_prompts(path))
        self.path_timings = PathTimings()  # the router's own time on each stream's way to its first token
        # Where a job goes, asked of the routing by the facade and by the host.
        self.model = self.routing.model
        self.context_per_slot = self.routing.context_per_slot
        self.route = self.routing.route
        self.refusal = self.routing.refusal
        self.stand_in = self.routing.stand_in
        self.cpu_state = self.routing.cpu_state
        self.cpu_tokens_per_second = self.routing.cpu_tokens_per_second
        self.replay = self.keys.replay  # a request sent again under its Idempotency-Key

    # ------------------------------------------------------------------------------ making the job
    def as_workers_take(self, kind: str, body: dict[str, Any], entry: ModelEntry) -> dict[str, Any]:
        """A chat's messages and tool choice as the workers' template and llama-server take them."""
        if kind != "chat":
            return body
        body = {**body, "messages": [_worker_compatible(message) for message in body["messages"]]}
        return worker_tool_choice(body, self.models.tool_call_opener_for(entry.name))

    async def count_prompt(self, kind: str, body: dict[str, Any], model: str | None) -> int:
        """A request's prompt tokens on the model it names, counted as admission counts them (by the
        tokenizer helper: the event loop never waits on it). Refused when it cannot be counted."""
        entry = self.model(model)
        prompts = self.models.prompts(entry.name)
        try:
            return await prompts.count(kind, self.as_workers_take(kind, body, entry))
        except TokenizerFailed as error:
            raise tokenizer_refusal(error) from None

    async def count_request(self, request: JobRequest) -> int:
        """The request's prompt tokens, for make() to take, after its grammar passed llama.cpp's own parser
        (both in the tokenizer helper, never in this process). Refused (400) for a grammar the parser
        refuses; ApiError or Refused as make() for an unknown model."""
        grammar = request.body.get("grammar")
        if grammar:
            entry = self.model(request.model)
            try:
                problem = await self.models.prompts(entry.name).grammar_error(grammar)
            except TokenizerFailed as error:
                raise tokenizer_refusal(error) from None
            if problem is not None:
                # Refused with the parser's own words before any worker sees it.
                raise refused(
                    400,
                    "invalid_grammar",
                    f"'grammar' is not valid GBNF: {problem}",
                    type="invalid_request_error",
                    param="grammar",
                )
        return await self.count_prompt(request.kind, request.body, request.model)

    def make(self, request: JobRequest, *, prompt_tokens: int, background: bool = False) -> Job:
        """The job for this request, whose grammar was checked and prompt counted by count_request, not
        registered yet."""
        entry = self.model(request.model)
        body = self.as_workers_take(request.kind, dict(request.body), entry)
        body["model"] = entry.name  # otherwise llama.cpp names the model by its file path in every chunk
        if body.get("seed") is None:
            # Pinned before the first attempt, so a replay on the same weights samples the same way.
            body["seed"] = random_seed()
        if body.get("logprobs") is True and body.get("top_logprobs") == 0:
            # llama-server gives no log probabilities at all for 0 alternatives; one is the nearest it does.
            body["top_logprobs"] = 1
        if prompt_tokens == 0:
            # Nothing to continue from: this model adds no start token to an empty prompt.
            raise refused(
                400, "empty_prompt", "the prompt is empty", type="invalid_request_error", param="prompt"
            )
        roles = self.models.roles(entry)
        if not roles:
            devices = ", ".join(entry.devices)
            raise refused(
                503,
                "no_worker_for_model",
                f"{entry.name} has no worker here (devices: {devices})",
                retry_after=30,
            )
        n_ctx = self.context_per_slot(entry)
        max_tokens = requested_tokens(prompt_tokens, request.max_tokens, n_ctx)
        if request.fit_budget:
            max_tokens = self._fitted_budget(entry, prompt_tokens, max_tokens)
        body["max_tokens"] = max_tokens  # the budget admission counted is the one the worker gets
        stream = request.stream and not background
        key = request.idempotency_key
        job = Job(
            id=new_id("job"),
            request_id=request.request_id or new_request_id(),
            kind=request.kind,
            body=body,
            stream=stream,
            background=background,
            body_hash=request.body_hash if key else "",  # compared under an Idempotency-Key only
            idempotency_key=key,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            deadline=time.monotonic() + request.deadline,
            path=FirstTokenPath(request.received_at) if stream and request.received_at is not None else None,
            asked_model=entry.name,
            models=dict.fromkeys(roles, entry.name),
            roles=roles,
            may_stand_in=request.may_stand_in,
            holds_tool_calls=request.holds_tool_calls,
        )
        self.models.touch(entry.name, request.keep_alive)
        return job

    def embed(
        self, body: dict[str, Any], input_tokens: int, deadline: float, request_id: str | None = None
    ) -> Job:
        """An embeddings request's job, registered (the embeddings runner then runs it): no Idempotency-Key
        (an embedding has no effects to protect), its time allowance grown with its input's tokens."""
        job = Job(
            id=new_id("job"),
            request_id=request_id or new_request_id(),
            kind="embedding",
            body=body,
            stream=False,
            background=False,
            body_hash="",
            idempotency_key=None,
            prompt_tokens=input_tokens,
            max_tokens=0,
            deadline=time.monotonic() + deadline,
        )
        self.registry.add(job)
        return job

    async def count_inputs(self, model_file: str, inputs: list[Any]) -> list[int]:
        """The tokens of each input of an embeddings request, on model file `model_file` ("": the main
        model's)."""
        return await self.input_tokens.count(model_file, inputs)

    async def run_embedding(self, job: Job) -> dict[str, Any]:
        """Run an embeddings job made by `embed`: the answer, or JobFailed (the job failed)."""
        return await self.embeddings.run(job)

    def _fitted_budget(self, entry: ModelEntry, prompt_tokens: int, max_tokens: int) -> int:
        """`max_tokens` as an upper bound: at most what the slot that can read the prompt leaves, a GPU
        slot's if the prompt fits one, else the CPU's (where admission then sends it)."""
        for n_ctx in (self.context_per_slot(entry), self.models.n_ctx_per_seq(entry, "cpu")):
            if prompt_tokens < n_ctx:
                return min(max_tokens, n_ctx - prompt_tokens)
        return max_tokens  # no slot reads this prompt: admission refuses it, naming the prompt

    # ------------------------------------------------------------------------------ admission
    async def admit(self, job: Job, deadline: float) -> Admission:
        """Route and admit a made job, registering it: a slot held, or the job waiting for approval.
        Refused (the job failed with the reason) when it cannot be served."""
        entry = self.model(job.asked_model)
        held = self.routing.start_at_once(job, entry, deadline)
        if held is not None:
            # The worker starts on it first; the job's journal entry and events follow in this same turn
            # of the event loop (nothing can look the job up in between), off the token's path.
            self.executor.dispatch(job)
            self.registry.add(job)
            self.bus.publish(RouteDecided(job_id=job.id, route="gpu", reason=""))
            return Admission(held=held)
        self.registry.add(job)  # registers its Idempotency-Key too
        decision = await self.route(job, deadline)
        if decision.action == "refuse":
            raise self.refusal(job, decision)
        if decision.action == "approval":
            self.registry.name_fallback(job, decision.reason)
            await self.ask_approval(job, decision)
            return Admission(approval=decision.reason)
        self.registry.set_route(job, decision.action, decision.reason or None)
        held = await self._slot(job, job.worker_role(job.route) or job.route)
        self.executor.dispatch(job)  # the worker starts on it while the job's task is being set up
        return Admission(held=held)

    async def ask_approval(self, job: Job, decision: policy.Decision) -> None:
        offer = await self.stand_in(job, offer=True)
        backlog_full = self.executor.desk.request_approval(job, decision, offer.model if offer else None)
        if backlog_full is not None:
            raise self.refusal(job, backlog_full)

    async def _slot(self, job: Job, role: str) -> float:
        wait = min(self.config().server.queue_timeout, max(job.time_left(), 0.0))
        try:
            return await self.slots.acquire(role, job.id, wait)
        except QueueFull as full:
            error = JobError(
                429,
                "queue_full",
                f"too many requests waiting ({full.depth}); try again later",
                type="rate_limit_error",
                retry_after=full.retry_after,
            )
        except QueueTimeout as timeout:
            error = JobError(
                429,
                "queue_timeout",
                f"no free worker slot in time: {timeout}",
                type="rate_limit_error",
                retry_after=timeout.retry_after,
            )
        self.registry.fail(job, "failed", error.record(), error.code)
        self.count(role, error.code)
        raise Refused(error)

    # ------------------------------------------------------------------------------ stand-in and CPU
    # ------------------------------------------------------------------------------ running
    def run_task(self, job: Job, work: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Start the task that runs `job` (the only place `job.task` is written)."""
        job.task = asyncio.create_task(work, name=name)
        return job.task

    async def drain(self, job: Job) -> None:
        """Run a job nobody streams to its end, in this task."""
        await self.executor.drain(job)

    def start(self, job: Job, held_slot: float | None = None) -> asyncio.Task[Any]:
        """Run a job that no client streams, as its own task."""
        return self.run_task(job, self.executor.drain(job, held_slot), f"job-{job.id}")

    def wait_for_approval(self, job: Job, reason: str) -> asyncio.Task[Any]:
        """A plain (non-streamed) client waits for a job in the user's hands."""

        async def wait() -> None:
            async for _ in self.executor.desk.wait_for_final(job, False, reason):
                pass

        return self.run_task(job, wait(), f"approval-wait-{job.id}")

    def stop(self, job: Job) -> bool:
        """Stop the task running `job` (its client went away); True if one was running."""
        if job.task is not None and not job.task.done():
            job.task.cancel()
            return True
        return False

    def outcomes(self, job: Job, admission: Admission) -> AsyncGenerator[Outcome, None]:
        """A streamed job's outcomes as its client reads them: its run on the slot admission held, or, put
        in the user's hands, what follows their decision. Close it however the stream ends: the job then
        ends too and frees its slot."""
        if admission.approval:
            return self.executor.desk.wait_for_final(job, True, admission.approval)
        return self.executor.run(job, deliver=True, held_slot=admission.held)

    @property
    def stall_seconds(self) -> float:
        """How long a stream's client may read nothing before it is dropped (drop_stalled)."""
        return self.executor.settings.stall_seconds

    def drop_stalled(self, job: Job) -> None:
        """The client read nothing of its stream for `stall_seconds`: the job ends (its slot is free)."""
        stall = self.stall_seconds
        log.warning("job %s: the client read nothing for %.0f s; dropped", job.id, stall)
        self.registry.fail(
            job,
            "cancelled",
            {"message": f"the client stopped reading for {stall:.0f} s", "code": "client_stalled"},
            Reason.CLIENT_DISCONNECTED,  # dropped by the router: the slot is free again
        )
        self.stop(job)

    def note_delivered(self, job: Job) -> None:
        """A tool call of the job was written to its client whole (an API that holds them, Ollama's): its
        action may run from now on, so the job is never run again (jobs.idempotency)."""
        self.registry.note_effects_delivered(job)

    def first_output_written(self, job: Job) -> None:
        """The stream's first output reached its client: the router's own time on its way is recorded, if
        the first attempt brought it (jobs.path_timing)."""
        path = job.path
        if path is not None and path.from_worker:
            self.path_timings.record(path, time.perf_counter())

    def cancel(self, job_id: str) -> Job | None:
        """`DELETE /v1/jobs/{id}`: end a live job as cancelled; None when no live job has this id."""
        job = self.registry.get(job_id)
        if job is None:
            return None
        if not job.final:
            self.registry.fail(
                job,
                "cancelled",
                {"message": "cancelled by request", "code": "cancelled"},
                Reason.CANCELLED_BY_REQUEST,
            )
            self.stop(job)
        return job

    # ------------------------------------------------------------------------------ the user's decisions
    def approve(self, job: Job) -> bool:
        """The user accepts the slow CPU run of a job awaiting approval (False: it no longer waits)."""
        return self.executor.desk.approve(job)

    def reject(self, job: Job) -> bool:
        return self.registry.fail(
            job,
            "rejected",
            {"message": "the CPU run was rejected by the user", "code": "rejected"},
            Reason.REJECTED,
        )

    async def pick_stand_in(self, job: Job) -> bool:
        """The user picked the smaller model on the GPU now over the big one on the CPU later."""
        stand_in = await self.stand_in(job, chosen=True) if job.stand_in_offer else None
        return stand_in is not None and self.executor.desk.run_stand_in(job, stand_in)

    # ------------------------------------------------------------------------------ background jobs
    async def submit_background(self, request: JobRequest) -> Accepted:
        """`POST /v1/jobs`: a job made, routed and started, or the one made earlier under the request's
        Idempotency-Key (its summary and 202/200). Refused when it cannot be accepted."""
        if self.journal.failure is not None:
            raise journal_unavailable(self.journal.failure)
        prompt_tokens = await self.count_request(request)  # before the key check: see below
        key = request.idempotency_key
        if key:
            existing = self.keys.existing_background(key, request.body_hash)
            if existing is not None:
                return existing
        limit = self.config().server.jobs_max
        if self.registry.background_pending() >= limit:
            raise refused(
                429,
                "too_many_jobs",
                f"{limit} background jobs are already waiting or running (server.jobs_max); try again later",
                type="rate_limit_error",
                retry_after=30,
            )
        # No await between the key check and registration: a second request with the same key finds this job.
        job = self.make(request, background=True, prompt_tokens=prompt_tokens)
        self.registry.add(job)
        decision = await self.route(job, BACKGROUND_DEADLINE)
        if decision.action == "refuse":
            raise self.refusal(job, decision)
        if decision.action == "approval":
            await self.ask_approval(job, decision)
        else:
            self.registry.set_route(job, decision.action)
            self.start(job)
        # Accepted work is durable before the client hears it was accepted; if it cannot be, it is not.
        if not await asyncio.to_thread(self.journal.flush):
            self.registry.fail(
                job,
                "failed",
                {"message": "the journal could not store it", "code": "journal_failed"},
                Reason.JOURNAL_FAILED,
            )
            self.stop(job)
            raise journal_unavailable(self.journal.failure)
        return Accepted(job.summary(), 202, job.id, job.request_id, job, job.read_token)

    # ------------------------------------------------------------------------------ reads
    def get(self, job_id: str) -> Job | None:
        """A live job (running, waiting, or ended a moment ago and still held)."""
        return self.registry.get(job_id)

    def by_state(self, state: str | None = None) -> list[Job]:
        """The live jobs in `state` (all of them: None), oldest first."""
        return self.registry.by_state(state)

    def stored(self, job_id: str) -> LiveOrStored | None:
        """A job live, or else as the journal keeps it (its answer, for a stored response)."""
        return self.registry.get(job_id) or self.journal.job(job_id)

    def path_timing(self) -> PathTiming:
        """The router's own time on the recent streams' way to their first token."""
        return self.path_timings.snapshot()

    def in_flight(self, role: str) -> int:
        """Requests on worker `role`'s slots now."""
        return self.slots.in_flight(role)

    def read_token(self, job_id: str) -> str | None:
        """The token that reads job `job_id` back (None: no such job; "": made before tokens, admin only)."""
        job = self.registry.get(job_id)
        if job is not None:
            return job.read_token
        stored = self.journal.job(job_id)
        return stored.read_token if stored is not None else None

    async def summary(self, job_id: str) -> JobSummary | None:
        """A job as `GET /v1/jobs/{id}` shows it, live or from the journal, with its attempts."""
        job = self.registry.get(job_id)
        await asyncio.to_thread(self.journal.flush)
        attempts = self.journal.attempts(job_id)
        if job is not None:
            summary = job.summary()
            summary["attempt_log"] = attempts
            return summary
        stored = self.journal.job(job_id)
        return stored_summary(stored, attempts) if stored is not None else None

    def resume_unfinished(self) -> None:
        """Jobs an earlier run accepted and did not finish go on, or end saying why (jobs.resume)."""
        resume.resume_unfinished(self)


def _worker_compatible(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the model's chat template takes it: content is a string
    (OpenAI clients send null next to tool calls, and arrays of text parts), and `developer` (OpenAI's newer
    name for the system role) is `system`, the role chat templates know."""
    content = message.get("content")
    if content is None and message.get("role") == "assistant":
        message = {**message, "content": ""}
    elif isinstance(content, list):
        message = {**message, "content": "\n".join(part.get("text", "") for part in content)}
    if message.get("role") == "developer":
        message = {**message, "role": "system"}
    return message
