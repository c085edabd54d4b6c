"""Running a job: attempts on the workers, failure detection, the replay decision and its effects.

`Executor.run(job)` is an async generator. For a live streamed request it yields the outcomes the client
should get; otherwise it yields nothing and leaves the answer in `job.result` (or the error in `job.error`).
Attempts are strictly sequential, so an attempt that failed has been closed before a replay starts: nothing
from a dead attempt can reach the client, and `JobRegistry.complete` refuses a second completion.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from tray_app.contract.events import (
    EventBus,
    FallbackCompleted,
    FallbackRefused,
    FallbackStarted,
    RouteDecided,
)
from tray_app.contract.vocabulary import Reason
from tray_app.jobs import policy
from tray_app.jobs.admission import QueueTimeout, SlotPool
from tray_app.jobs.approvals import ApprovalDesk
from tray_app.jobs.assemble import Assembler, chat_chunk
from tray_app.jobs.continuation import EchoedPrefix
from tray_app.jobs.mirror import Following, Mirror
from tray_app.jobs.outcomes import Ended, Finished, JobError, Outcome, Piece, cannot_serve
from tray_app.jobs.progress import Progress, constrained_output, continues_chat, shape_survives_resume
from tray_app.jobs.registry import Job, JobRegistry, upstream_stream
from tray_app.jobs.relay import Relay, Sent, UpstreamError
from tray_app.jobs.replay import first_path, resume_request
from tray_app.jobs.worker_port import (
    CpuSpeed,
    ExecutorSettings,
    Prompts,
    StandIn,
    Worker,
)
from tray_app.tokenizer.wire import TokenizerFailed

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


@dataclass(frozen=True)
class _Dispatched:
    """A job's first request, written to its worker by the handler that admitted it (Executor.dispatch)."""

    worker_role: str
    url: str
    sent: Sent


class Executor:
    def __init__(
        self,
        settings: ExecutorSettings,
        workers: Callable[[str], Worker | None],
        slots: SlotPool,
        relay: Relay,
        registry: JobRegistry,
        bus: EventBus,
        cpu_state: Callable[[float, str | None], Any],
        prompts: Callable[[str], Prompts],  # by model name: the models may change
        on_fallback: Callable[[str], None] = lambda outcome: None,
        stand_in: Callable[..., Awaitable[StandIn | None]] | None = None,
        mirror: Mirror | None = None,
    ) -> None:
        self.settings = settings
        self.workers = workers
        self.slots = slots
        self.relay = relay
        self.registry = registry
        self.bus = bus
        self._cpu_state = cpu_state  # async: (time_left, CPU worker role) -> policy.CpuState
        # async (job, offer=False): the job's stand-in on the GPU now, if the config lets it answer on its
        # own; with offer=True, one the approval window may offer instead ("ask").
        self._stand_in = stand_in
        self._prompts = prompts
        self._on_fallback = on_fallback
        self.mirror = mirror  # the CPU mirror: reads a GPU job's prompt on the CPU ahead of a failover
        self.cpu_speed = mirror.speed if mirror is not None else CpuSpeed()
        self.desk = ApprovalDesk(registry, lambda: self.settings, self.drain)  # the user's decisions
        self.shutting_down = False
        self._dispatched: dict[str, _Dispatched] = {}  # job id -> its first request, not yet taken up

    # ------------------------------------------------------------------------------------------- run
    def dispatch(self, job: Job) -> None:
        """Write an admitted job's first request to its worker now, before the job's task starts: the
        task's first attempt takes the answer up (`_take_dispatched`), so the client's first token does not
        wait for that task to be scheduled. Nothing is sent when the worker is not ready: the attempt then
        does what it always does."""
        worker_role = job.worker_role(job.route)
        worker = self.workers(worker_role) if worker_role else None
        if worker_role is None or worker is None or worker.state != "ready" or not worker.base_url:
            return
        url, body = self._first_request(job, worker)
        worker.note_tokens(0)  # as in _attempt: a drill's fault armed for "before any token" fires first
        sent = self.relay.dispatch(url, body, worker.request_headers)
        self._dispatched[job.id] = _Dispatched(worker_role, url, sent)

    def _take_dispatched(self, job: Job, worker_role: str, url: str, resume: bool) -> Sent | None:
        """The job's dispatched request, if this attempt is the one it was written for."""
        dispatched = self._dispatched.pop(job.id, None)
        if dispatched is None:
            return None
        if resume or (dispatched.worker_role, dispatched.url) != (worker_role, url):
            dispatched.sent.abort()
            return None
        return dispatched.sent

    def _drop_dispatched(self, job: Job) -> None:
        dispatched = self._dispatched.pop(job.id, None)
        if dispatched is not None:
            dispatched.sent.abort()  # the job ended before an attempt took it up

    async def run(
        self, job: Job, *, deliver: bool, held_slot: float | None = None
    ) -> AsyncGenerator[Outcome, None]:
        """Drive `job` to a final state (or to awaiting approval). `deliver`: a client reads the stream."""
        progress = Progress(Assembler(job.kind))
        role = job.route
        resume = False
        slot = held_slot
        fallback_started_at: float | None = None
        dropped: _Dropped | None = None  # a GPU attempt that ended with the connection: named at the end
        handed_over = False  # put in the user's hands: from then on the job is theirs, not the client's
        try:
            while True:
                try:
                    async with aclosing(self._attempt(job, role, progress, resume, slot, deliver)) as pieces:
                        async for piece in pieces:
                            yield piece
                except UpstreamError as failure:
                    slot = None
                    if failure.kind == "exited" and progress.worker_pid is not None and dropped is None:
                        dropped = _Dropped(
                            job.worker_role(role) or role, progress.worker_pid, job.attempts, failure.message
                        )
                    if failure.client_error or role == "cpu":
                        self._name_the_crash(job, dropped)
                        for piece in self._fail_upstream(job, failure, deliver, progress.worker_pid):
                            yield piece
                        return
                    decision = await self._decide_after_failure(job, failure, progress, deliver)
                    if decision.action == "gpu":
                        continue  # the GPU worker came back, or the stand-in answers there
                    if decision.action == "cpu":
                        role, resume = "cpu", decision.resume
                        self.registry.set_route(job, "cpu", failure.kind)
                        fallback_started_at = time.monotonic()
                        self._on_fallback("started")
                        self.bus.publish(FallbackStarted(job_id=job.id, reason=failure.kind))
                        if not deliver:
                            progress.reset_undelivered(job.kind)
                        continue
                    self.registry.name_fallback(job, failure.kind)
                    if decision.action == "approval":
                        offer = await self._stand_in(job, offer=True) if self._stand_in else None
                        refused = self.desk.request_approval(job, decision, offer.model if offer else None)
                        if refused is not None:
                            for piece in self._refuse(job, refused, deliver):
                                yield piece
                            return
                        handed_over = True
                        async with aclosing(
                            self.desk.wait_for_final(job, deliver, decision.reason)
                        ) as waiting:
                            async for piece in waiting:
                                yield piece
                        return
                    for piece in self._refuse(job, decision, deliver):
                        yield piece
                    return
                slot = None
                self._name_the_crash(job, dropped)
                result = progress.assembler.result(job.prompt_tokens, {})
                result["failsoft"] = job.failsoft()
                if job.model or self.settings.model_id:
                    result["model"] = job.model or self.settings.model_id
                if self.registry.complete(job, result):
                    if fallback_started_at is not None:
                        self._on_fallback("completed")
                        seconds = time.monotonic() - fallback_started_at
                        self.bus.publish(
                            FallbackCompleted(
                                job_id=job.id, reason=job.fallback_reason or "", seconds=seconds
                            )
                        )
                    if deliver:
                        yield Finished(result, progress.chunk_id, progress.created, progress.model)
                return
        except (asyncio.CancelledError, GeneratorExit):
            # The client went away (or stopped reading). A job handed to the user stays in their hands
            # (waiting, or approved and running: its answer is kept for GET /v1/jobs/{id}); at shutdown,
            # unfinished jobs stay unfinished in the journal and resume at the next start.
            if not handed_over and job.state != "awaiting_approval" and not self.shutting_down:
                self.registry.fail(
                    job,
                    "cancelled",
                    {"message": "the client went away", "code": "cancelled"},
                    Reason.CLIENT_DISCONNECTED,
                )
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
            self.registry.fail(job, "failed", internal.record(), Reason.INTERNAL_ERROR)
            if deliver:
                yield Ended(internal)
        finally:
            self._drop_dispatched(job)

    async def drain(self, job: Job, held_slot: float | None = None) -> None:
        """Run a job nobody streams (non-streamed requests, background jobs, approved CPU runs)."""
        async for _ in self.run(job, deliver=False, held_slot=held_slot):
            pass

    # --------------------------------------------------------------------------------------- attempts
    async def _attempt(
        self, job: Job, role: str, progress: Progress, resume: bool, slot: float | None, deliver: bool
    ) -> AsyncGenerator[Outcome, None]:
        worker_role = job.worker_role(role)
        if worker_role is None:
            raise UpstreamError("unavailable", f"{job.model} may not run on the {role.upper()}")
        if slot is None and self.mirror is not None and worker_role == job.worker_role("cpu"):
            await self.mirror.settle(job)  # before the slot: asking for one stops the mirror's reads at once
        if slot is None:
            wait = min(self.settings.queue_timeout, max(job.time_left(), 1.0))
            try:
                slot = await self.slots.acquire(worker_role, job.id, wait, accepted=True)
            except QueueTimeout as timeout:
                raise UpstreamError("queue_timeout", f"no free {worker_role} slot: {timeout}") from None
        number = 0
        # The CPU speed sample: this attempt's own chunks over its own generation time, not a cold start,
        # the prompt read before the first token, or a resumed answer's part that the GPU wrote.
        first_chunk_at: float | None = None
        chunks_seen = 0
        # Pieces with no output before the first that has some (the role announcement): they travel with
        # that first token, one trip to the client instead of two.
        held: list[Piece] = []
        following: Following | None = None
        on_cpu = worker_role == job.worker_role("cpu")
        try:
            worker = await self._ready_worker(job, role, worker_role)
            progress.worker_pid = worker.pid
            number = self.registry.start_attempt(job, worker_role)
            if not number:
                return  # the job ended (cancelled) while it waited for a slot or a worker: no late start
            if self.mirror is not None:
                if on_cpu:
                    self.mirror.taken(job)
                else:
                    following = self.mirror.follow(job, self._prompts(job.model), deliver)
            url, body = await self._upstream(job, worker, progress, resume)
            first_timeout = self.settings.stall_seconds + job.prompt_tokens / self._prompt_rate(worker_role)
            # A resumed chat's chunks come back as completion chunks, or (a thinking model's, continued
            # by llama-server) as chat chunks that repeat the answer so far: either way they leave as the
            # chunks of the stream the client already reads.
            convert = resume and job.kind == "chat"
            echoed = (
                EchoedPrefix(progress.delivered_reasoning, progress.delivered_text)
                if convert and continues_chat(job, progress)
                else None
            )
            progress.assembler.begin_attempt(resumed=resume)
            sent = self._take_dispatched(job, worker_role, url, resume)
            if sent is None:
                worker.note_tokens(0)  # a drill's fault armed for "before any token" fires here
            stream = self.relay.stream(
                url, body, worker.request_headers, first_timeout, self.settings.stall_seconds, sent
            )
            prepared = False
            async with aclosing(stream) as chunks:
                async for chunk in chunks:
                    if job.final:
                        return  # cancelled meanwhile: whatever this attempt still says is dropped
                    obj = self._resumed_chat_chunk(progress, chunk.obj, echoed) if convert else chunk.obj
                    progress.assembler.feed(obj)
                    worker.note_tokens(1)
                    if on_cpu and "timings" in chunk.obj:
                        self._note_cpu_read(job, chunk.obj["timings"])
                    chunks_seen += 1
                    if first_chunk_at is None:
                        first_chunk_at = time.monotonic()
                    if deliver:
                        out = self._deliverable(progress, obj, chunk.raw if not convert else None)
                        if out is not None:
                            if progress.tool_call_delivered and not job.holds_tool_calls:
                                self.registry.note_effects_delivered(job)  # before the piece leaves
                            if not prepared and not out.output:
                                held.append(out)
                                continue
                            if held:
                                out = Piece(out.obj, out.raw, out.output, tuple(held))
                                held.clear()
                            if out.output and not prepared and number == 1 and job.path is not None:
                                job.path.to_worker = chunk.sent_at
                                job.path.from_worker = chunk.received_at
                            yield out
                            if out.output and not prepared:
                                self.relay.prepare_next(url)  # the client has its first token
                                prepared = True
                            if following is not None and out.output:
                                following.grew(progress)
            for piece in held:  # an answer with no output at all
                yield piece
            self.registry.end_attempt(job, number, "completed")
            if worker_role == "cpu" and first_chunk_at is not None:
                # The main model's CPU worker: the speed the policy estimates with.
                self.cpu_speed.record(chunks_seen - 1, time.monotonic() - first_chunk_at)
            if following is not None:
                following.finished(progress.assembler)  # a conversation's next turn starts with it
        except UpstreamError as failure:
            if number:
                self.registry.end_attempt(job, number, "failed", f"{failure.kind}: {failure.message}")
            for piece in held:  # announced as delivered (progress): it goes out ahead of what follows
                yield piece
            raise
        except (asyncio.CancelledError, GeneratorExit):
            if number:
                self.registry.end_attempt(job, number, "cancelled")
            raise
        finally:
            self.slots.release(worker_role, slot)

    def _prompt_rate(self, worker_role: str) -> float:
        """Prompt tokens per second the first token's deadline allows for: a GPU's are many; a CPU reads as
        fast as it was measured to (else a few times its generation speed, jobs.policy.PROMPT_SPEEDUP), or
        slower than any when unknown, so a long prompt read on a slow CPU is not taken for a hung worker."""
        if not worker_role.startswith("cpu"):
            return 100.0
        speed = self.cpu_speed
        measured = policy.cpu_prompt_speed(speed.prompt_tokens_per_second, speed.tokens_per_second)
        return max(measured / 2, SLOWEST_CPU_PROMPT_RATE)  # half the measured: a margin for a busy machine

    def _note_cpu_read(self, job: Job, timings: Any) -> None:
        """llama-server's account of a CPU attempt's prompt: how much its cache held (the failsoft object
        says so) and how fast it read the rest."""
        cached, read, seconds = (timings.get(k) for k in ("cache_n", "prompt_n", "prompt_ms"))
        if isinstance(cached, int):
            self.registry.note_cpu_cache(job, cached)
        if isinstance(read, int) and isinstance(seconds, int | float):
            self.cpu_speed.record_prompt(read, seconds / 1000.0)

    async def _ready_worker(self, job: Job, role: str, worker_role: str) -> Worker:
        worker = self.workers(worker_role)
        if worker is None:
            raise UpstreamError("unavailable", f"there is no {worker_role} worker")
        if worker.state == "ready" and worker.base_url:
            return worker
        first_start = worker.state == "starting" and worker.last_failure is None
        if role == "gpu" and not first_start:
            # Not waiting here: a GPU that is restarting is a failure the policy answers (often: the CPU).
            raise UpstreamError("unavailable", f"the GPU worker is {worker.state}")
        # A worker loading for the first time (the service just started) is waited for, as a model loaded
        # on demand is: the GPU answers in a second or two, where the CPU would answer slower.
        wait = min(self.settings.worker_ready_wait, max(job.time_left(), 1.0))
        if await worker.ensure_ready(wait) and worker.base_url:
            return worker
        raise UpstreamError("unavailable", f"the {role} worker is {worker.state}")

    @staticmethod
    def _first_request(job: Job, worker: Worker) -> tuple[str, bytes]:
        return (worker.base_url or "") + first_path(job), job.upstream_body()

    async def _upstream(
        self, job: Job, worker: Worker, progress: Progress, resume: bool
    ) -> tuple[str, bytes]:
        if not resume:
            return self._first_request(job, worker)
        delivered = await self._delivered_tokens(job, progress)
        try:
            path, body = await resume_request(
                job,
                self._prompts(job.model),
                progress.delivered_reasoning,
                progress.delivered_text,
                max(job.max_tokens - delivered, 1),
                continues_chat(job, progress),
            )
        except TokenizerFailed as error:  # not the worker's fault: no unhealthy mark
            raise UpstreamError("unavailable", f"the resumed prompt could not be rendered: {error}") from None
        body.update(upstream_stream(job.prompt_tokens + delivered))
        return (worker.base_url or "") + path, json.dumps(body).encode()

    async def _delivered_tokens(self, job: Job, progress: Progress) -> int:
        """The tokens of what the client already has: its reasoning's and text's own count, or the chunks
        they came in where those are more. A chunk may carry more than one token, so counting chunks alone
        would leave a resumed answer a budget beyond the request's `max_tokens`."""
        tokens = self._prompts(job.model)
        counted = 0
        for text in (progress.delivered_reasoning, progress.delivered_text):
            if not text:
                continue
            try:
                counted += await tokens.count_text(text, special=False, add_bos=False)
            except TokenizerFailed:
                return progress.delivered_tokens  # the chunks' count: at worst a budget a little too long
        return max(progress.delivered_tokens, counted)

    @staticmethod
    def _resumed_chat_chunk(
        progress: Progress, obj: dict[str, Any], echoed: EchoedPrefix | None
    ) -> dict[str, Any]:
        """A chunk of a resumed chat (a completion chunk, or a continued chat's with `echoed`), shaped as
        the chat chunk the client's stream expects."""
        choice = (obj.get("choices") or [{}])[0]
        if echoed is not None:
            delta = echoed.cut({k: v for k, v in (choice.get("delta") or {}).items() if k != "role"})
        else:
            text = choice.get("text") or ""
            delta = {"content": text} if text else {}
        return chat_chunk(
            progress.chunk_id, progress.created, progress.model, delta, choice.get("finish_reason")
        )

    @staticmethod
    def _deliverable(progress: Progress, obj: dict[str, Any], raw: str | None) -> Piece | None:
        """The piece to send for this chunk, recording what the client now has; None to skip it (a second
        role announcement after a replay)."""
        if not progress.chunk_id:
            progress.chunk_id = str(obj.get("id", ""))
            progress.created = int(obj.get("created") or time.time())
            progress.model = str(obj.get("model", ""))
        has_effect = output = False
        for choice in obj.get("choices") or []:
            delta = choice.get("delta")
            text = choice.get("text") if delta is None else delta.get("content")
            if text:
                progress.delivered_text += text
                progress.delivered_tokens += 1
                has_effect = output = True
            reasoning = delta.get("reasoning_content") if delta else None
            if reasoning:
                progress.delivered_reasoning += reasoning
                progress.delivered_tokens += 1
                has_effect = output = True
            if delta and delta.get("tool_calls"):
                progress.tool_call_delivered = True
                has_effect = output = True
            if choice.get("finish_reason"):
                has_effect = True
            if delta and delta.get("role") and not progress.role_sent:
                progress.role_sent = True
                has_effect = True
        if not has_effect:
            return None
        return Piece(obj, raw, output)

    # --------------------------------------------------------------------------------------- failures
    async def _decide_after_failure(
        self, job: Job, failure: UpstreamError, progress: Progress, deliver: bool
    ) -> policy.Decision:
        gpu_role = job.worker_role("gpu")
        gpu = self.workers(gpu_role) if gpu_role else None
        if gpu is not None and failure.kind not in NOT_WORKER_FAULTS:
            self._report(gpu, progress.worker_pid, failure)
            if failure.kind == "exited" and progress.worker_pid is not None:
                # A dropped connection only says the worker went away; its supervisor names how the
                # process ended (an abort, a kill) a moment later, and that names the fallback.
                ended = await gpu.failure_of(progress.worker_pid, CAUSE_WAIT_SECONDS)
                if ended and ended.get("kind") not in (None, "exited"):
                    failure.kind = str(ended["kind"])
        context = policy.FailureContext(
            streaming=deliver,
            content_delivered=progress.output_delivered,
            tool_call_delivered=progress.tool_call_delivered,
            prompt_tokens=job.prompt_tokens,
            remaining_tokens=max(job.max_tokens - await self._delivered_tokens(job, progress), 1),
            time_left=job.time_left(),
            constrained=constrained_output(job.body) and not shape_survives_resume(job, progress),
            stand_in_answering=job.stand_in_for is not None,
            cached_tokens=self.mirror.held(job) if self.mirror is not None else 0,
        )
        worker_fault = failure.kind not in NOT_WORKER_FAULTS
        stand_in = await self._stand_in(job) if self._stand_in is not None and worker_fault else None
        case = policy.StandInCase(
            allowed=stand_in is not None,
            available=stand_in is not None,
            fits=stand_in is not None
            and stand_in.prompt_tokens + context.remaining_tokens <= stand_in.n_ctx_per_seq,
            content_delivered=progress.output_delivered,
            tool_call_delivered=progress.tool_call_delivered,
        )
        if stand_in is not None and policy.stand_in_first(case):
            self.registry.substitute(
                job, stand_in.model, stand_in.gpu_role, stand_in.prompt_tokens, policy.STAND_IN
            )
            self.bus.publish(RouteDecided(job_id=job.id, route="gpu", reason=policy.STAND_IN))
            if not deliver:
                progress.reset_undelivered(job.kind)
            return policy.Decision("gpu", policy.STAND_IN)
        cpu = await self._cpu_state(job.time_left(), job.worker_role("cpu"))
        decision = policy.decide_replay(context, cpu, self.settings.policy)
        if (
            policy.try_gpu_again(failure.kind, progress.output_delivered, decision)
            and gpu is not None
            and progress.gpu_retries < MAX_GPU_RETRIES
            and await gpu.ensure_ready(min(self.settings.worker_ready_wait, max(job.time_left(), 0.0)))
            and gpu.base_url  # "ready" with no address yet would send the next attempt straight back here
        ):
            progress.gpu_retries += 1
            return policy.Decision("gpu", "")
        route = {"cpu": "cpu", "approval": "approval"}.get(decision.action, "refused")
        self.bus.publish(RouteDecided(job_id=job.id, route=route, reason=decision.reason or failure.kind))
        return decision

    def _refuse(self, job: Job, decision: policy.Decision, deliver: bool) -> list[Outcome]:
        self._on_fallback("refused")
        self.bus.publish(FallbackRefused(job_id=job.id, reason=decision.reason, detail=decision.detail))
        error = cannot_serve(
            f"the GPU attempt failed and the job cannot continue on the CPU: {decision.reason}"
            + (f" ({decision.detail})" if decision.detail else ""),
            decision.reason,
            retry_after=5,
            job_id=job.id,
            reason=decision.reason,
        )
        self.registry.fail(job, "failed", error.record(), decision.reason)
        return [Ended(error)] if deliver else []

    def _name_the_crash(self, job: Job, dropped: _Dropped | None) -> None:
        """A dropped connection only says the worker went away; its supervisor knows how the process ended
        (an abort on a CUDA error, a kill). Once it does, that names the job's fallback and the attempt."""
        if dropped is None:
            return
        worker = self.workers(dropped.role)
        last = worker.last_failure if worker is not None else None
        if not last or last.get("pid") != dropped.pid or last.get("kind") in (None, "exited"):
            return
        kind = str(last["kind"])
        self.registry.refine_fallback(job, "exited", kind)
        error = f"{kind}: {last.get('message')} (the router saw: {dropped.message})"
        self.registry.set_attempt_error(job, dropped.attempt, error)

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
            cpu = self.workers(cpu_role) if cpu_role else None
            if cpu is not None and failure.kind not in NOT_WORKER_FAULTS:
                self._report(cpu, worker_pid, failure)
            reason = {"unavailable": policy.NO_CPU_WORKER, "queue_timeout": "queue_timeout"}.get(
                failure.kind, Reason.CPU_ATTEMPT_FAILED
            )
            error = cannot_serve(
                f"the CPU attempt failed: {failure.message}", reason, 5, job_id=job.id, reason=reason
            )
        self.registry.fail(job, "failed", error.record(), error.code)
        return [Ended(error)] if deliver else []
