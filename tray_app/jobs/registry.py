"""Jobs: the identity and lifecycle of every accepted request. A job reaches a final state exactly once;
every change is journaled and published as an event."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from tray_app.contract.events import ApprovalNeeded, EventBus, JobStateChanged
from tray_app.contract.roles import PEER_ROLE_PREFIX, Route
from tray_app.contract.status import JobSummary
from tray_app.contract.vocabulary import (
    ENDED_WITHOUT_ANSWER,
    FINAL_JOB_STATES,
    JOB_STATES,
    RESPONSE_NOTE,
    JobKind,
    JobState,
)
from tray_app.engine.argv import PROMPT_BATCH
from tray_app.engine.request_fields import forwarded
from tray_app.jobs.excerpt import body_excerpt
from tray_app.jobs.ids import random_hex
from tray_app.jobs.journal import Journal, StoredJob
from tray_app.jobs.path_timing import FirstTokenPath
from tray_app.jobs.weight import approx_bytes
from tray_app.jobs.worker_port import retry_after_seconds

FINAL_STATES = FINAL_JOB_STATES
STATES = JOB_STATES
_ENDED = ENDED_WITHOUT_ANSWER
# The only moves a job's state can make. Final states have none: the first final transition wins, and a late
# start, answer or approval of a job that already ended (cancelled while it waited) is refused.
TRANSITIONS: dict[JobState, frozenset[str]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.AWAITING_APPROVAL, *_ENDED}),
    JobState.RUNNING: frozenset({JobState.RUNNING, JobState.AWAITING_APPROVAL, JobState.COMPLETED, *_ENDED}),
    # Approved (queued for the CPU), or ended.
    JobState.AWAITING_APPROVAL: frozenset({JobState.QUEUED, *_ENDED}),
    **{JobState(state): frozenset() for state in FINAL_STATES},
}
# Finished jobs kept in memory, the latest first: at most this many, weighing at most this much (with the one
# just finished, whatever it weighs); older ones are read from the journal, which keeps every answer. An
# answer with log probabilities is several MiB: 2000 of them would be gigabytes.
KEEP_FINISHED = 2000
KEEP_FINISHED_BYTES = 32 * 1024 * 1024
log = logging.getLogger(__name__)


def can_move(current: str, new: str) -> bool:
    """Whether a job in state `current` may move to `new` (see TRANSITIONS)."""
    return current in JOB_STATES and new in TRANSITIONS[JobState(current)]


def upstream_stream(prompt_tokens: int) -> dict[str, bool]:
    """How every attempt asks for its answer: streamed (see relay), with llama-server's prompt-progress
    events when the prompt takes more than one step to read. Those keep the worker of a long prompt from
    looking hung (relay.stream). A shorter prompt would get two: its start, which the status line already
    tells, and its end, which arrives just before the first token and costs that token the time to read it."""
    return {"stream": True, "return_progress": prompt_tokens > PROMPT_BATCH}


# Fields of a job's body for the router alone: the client's stream options (the router streams from every
# worker and counts the usage itself) and that note.
ROUTER_FIELDS = frozenset({"stream_options", RESPONSE_NOTE})


def worker_fields(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """A job's body as a worker gets it: the fields its route forwards (engine.request_fields), without
    the fields for the router alone."""
    return {key: value for key, value in forwarded(kind, body).items() if key not in ROUTER_FIELDS}


def new_id(prefix: str) -> str:
    return f"{prefix}-{random_hex(12)}"


@dataclass
class Job:
    id: str
    request_id: str
    kind: JobKind
    body: dict[str, Any]  # as sent upstream: seed pinned
    stream: bool
    background: bool
    body_hash: str  # of the request body as sent, under an Idempotency-Key ("" without one)
    idempotency_key: str | None
    prompt_tokens: int
    max_tokens: int
    deadline: float  # monotonic time the client stops waiting
    created_at: float = field(default_factory=time.time)
    # A stream's way to its first token: made with the job, stamped by its first attempt (jobs.path_timing).
    path: FirstTokenPath | None = None
    state: JobState = JobState.QUEUED
    route: Route = "gpu"  # where it runs (an embedding: its embeddings worker's device)
    worker: str | None = None
    attempts: int = 0
    fallback_reason: str | None = None
    error: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    estimated_seconds: float | None = None
    effects_delivered: bool = False  # a tool call reached the client: its action may have run
    # Its client's API writes a tool call only once it is whole (Ollama's): delivered when that is written.
    holds_tool_calls: bool = False
    asked_model: str = ""  # the model the client's request named (its library name)
    # Device -> the model that answers there (the asked one; on the GPU its stand-in after a substitution)
    # and that model's worker: "gpu"/"cpu" for the main model, "gpu@name"/"cpu@name" for another.
    models: dict[str, str] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=lambda: {"gpu": "gpu", "cpu": "cpu"})
    may_stand_in: bool = True  # the request allows another model to answer (X-Failsoft-Stand-In)
    stand_in_offer: str | None = None  # awaiting approval: the stand-in the user may pick instead
    # llama-server's `cache_n` at its CPU attempt: prompt tokens its cache held (the mirror's doing, mostly).
    cpu_cached_tokens: int | None = None
    # Its creator's key to read it back (GET /v1/jobs/{id}, a stored response): returned at creation only.
    read_token: str = field(default_factory=lambda: random_hex(16))
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[Any] | None = None
    _upstream: bytes | None = None

    def upstream_body(self) -> bytes:
        """The body every attempt sends: always streamed (see relay), seed already pinned; encoded once."""
        if self._upstream is None:
            body = worker_fields(self.kind, self.body)
            body.update(upstream_stream(self.prompt_tokens))
            self._upstream = json.dumps(body).encode()
        return self._upstream

    def drop_upstream_body(self) -> int:
        """Its last attempt was sent: the encoded body (as large as the request) is not kept. Its size in
        bytes (0 if none was encoded)."""
        size = len(self._upstream) if self._upstream is not None else 0
        self._upstream = None
        return size

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def worker_role(self, device: str) -> str | None:
        """Which worker serves this job's model on `device` (None: the model may not run there)."""
        return self.roles.get(device)

    @property
    def model(self) -> str:
        """The model that answers on the job's current route."""
        return self.models.get(self.route, self.asked_model)

    @property
    def stand_in_for(self) -> str | None:
        """The model the client asked for, when another (its stand-in) answers."""
        return self.asked_model if self.asked_model and self.asked_model != self.model else None

    @property
    def peer(self) -> str | None:
        """The peer (another machine's server) that answers the job, when it runs on one."""
        role = self.roles.get("peer") if self.route == "peer" else None
        return role.removeprefix(PEER_ROLE_PREFIX) if role else None

    def failsoft(self) -> dict[str, Any]:
        return {
            "job_id": self.id,
            "worker": self.worker,
            "attempts": self.attempts,
            "fallback_reason": self.fallback_reason,
            "model": self.model,
            "device": self.route if self.route in ("gpu", "cpu") else None,
            "route": self.route,
            **({"peer": self.peer} if self.peer else {}),
            "stand_in_for": self.stand_in_for,
            **({"cpu_cached_tokens": self.cpu_cached_tokens} if self.cpu_cached_tokens is not None else {}),
        }

    def summary(self) -> JobSummary:
        """The job as /v1/jobs/{id} and /failsoft/jobs show it."""
        return {
            "id": self.id,
            "request_id": self.request_id,
            "kind": self.kind,
            "state": self.state,
            "route": self.route,
            "worker": self.worker,
            "model": self.model,
            "stand_in_for": self.stand_in_for,
            "stand_in_offer": self.stand_in_offer if self.state == "awaiting_approval" else None,
            "attempts": self.attempts,
            "fallback_reason": self.fallback_reason,
            "estimated_seconds": self.estimated_seconds,
            "created_at": self.created_at,
            "background": self.background,
            "seed": self.body.get("seed"),
            "preview": preview(self.body),
            "error": self.error,
            "result": self.result,
        }

    def retry_after(self) -> int:
        """Seconds a client told to come back (503) waits: about the job's estimate, when it has one."""
        return retry_after_seconds(self.estimated_seconds)


def preview(body: dict[str, Any]) -> str:
    """A request's opening words, as the admin routes show it: its last message, or its prompt."""
    messages = body.get("messages") or []
    last = messages[-1].get("content") if messages and isinstance(messages[-1], dict) else body.get("prompt")
    return str(last or "")[:200]


def stored_summary(stored: StoredJob, attempts: list[dict[str, Any]]) -> JobSummary:
    """A job no longer held in memory, from the journal, in the live job's shape and with its attempts;
    who answered, and where, comes from its stored answer."""
    answered = (stored.result or {}).get("failsoft") or {}
    return {
        "id": stored.id,
        "request_id": stored.request_id,
        "kind": stored.kind,
        "state": stored.state,
        "route": answered.get("device") or "",
        "worker": stored.worker,
        "model": answered.get("model") or stored.body.get("model") or "",
        "stand_in_for": answered.get("stand_in_for"),
        "stand_in_offer": None,
        "attempts": stored.attempts,
        "fallback_reason": stored.fallback_reason,
        "estimated_seconds": stored.estimated_seconds,
        "created_at": stored.created_at,
        "background": stored.background,
        "seed": stored.seed,
        "preview": preview(stored.body),
        "error": {"message": stored.error} if stored.error else None,
        "result": stored.result,
        "attempt_log": attempts,
    }


class JobRegistry:
    """The live jobs, their journal rows and their events; the only place a job's state changes.

    Every change of a job's state goes through `_allowed` (TRANSITIONS): an illegal one changes nothing and
    returns False (0 from `start_attempt`), so two transitions racing for a job cannot both win. The notes on
    a live job that move no state (`set_route`, `substitute`, `name_fallback`, `refine_fallback`,
    `extend_deadline`, `client_stopped_waiting`, `note_effects_delivered`, `note_cpu_cache`,
    `set_prompt_tokens`) are written here too, without a transition to check."""

    def __init__(self, journal: Journal, bus: EventBus) -> None:
        self.journal = journal
        self.bus = bus
        self._live: dict[str, Job] = {}
        # The finished jobs held here, oldest first, each with its weight (jobs.weight), and their sum.
        self._finished: OrderedDict[str, tuple[Job, int]] = OrderedDict()
        self._finished_bytes = 0
        # Idempotency-Key -> the latest job made under it, for the jobs held here; older ones are found in
        # the journal. Written only by add() and dropped with the job it names.
        self._keys: dict[str, str] = {}
        self.counters: dict[str, int] = {state: 0 for state in FINAL_STATES}
        self.counters["accepted"] = 0

    def add(self, job: Job, *, journaled: bool = False) -> None:
        self._live[job.id] = job
        if job.idempotency_key:
            self._keys[job.idempotency_key] = job.id
        self.counters["accepted"] += 1
        if not journaled:
            self.journal.add_job(
                {
                    "id": job.id,
                    "request_id": job.request_id,
                    "idempotency_key": job.idempotency_key,
                    "body_hash": job.body_hash,
                    "kind": job.kind,
                    "stream": int(job.stream),
                    "background": int(job.background),
                    "body": job.body,
                    "route": job.route,
                    "state": job.state,
                    "attempts": 0,
                    "created_at": job.created_at,
                    "updated_at": job.created_at,
                    "seed": job.body.get("seed"),
                    "read_token": job.read_token,
                }
            )
        self.bus.publish(JobStateChanged(job_id=job.id, state=job.state))

    def by_key(self, key: str) -> Job | None:
        """The latest job made under this Idempotency-Key, if it is still held here."""
        job_id = self._keys.get(key)
        return self.get(job_id) if job_id else None

    def get(self, job_id: str) -> Job | None:
        held = self._finished.get(job_id)
        return self._live.get(job_id) or (held[0] if held is not None else None)

    @property
    def finished_bytes(self) -> int:
        """What the finished jobs held here weigh (jobs.weight), in bytes."""
        return self._finished_bytes

    def live(self) -> list[Job]:
        return list(self._live.values())

    def count(self, state: str) -> int:
        """Live jobs in `state` (an unfinished state)."""
        return sum(1 for job in self._live.values() if job.state == state)

    def background_pending(self) -> int:
        """Background jobs not finished yet (queued, running or waiting for approval)."""
        return sum(1 for job in self._live.values() if job.background)

    def by_state(self, state: str | None) -> list[Job]:
        jobs = [*self._live.values(), *(job for job, _ in self._finished.values())]
        return [job for job in jobs if state is None or job.state == state]

    @staticmethod
    def _allowed(job: Job, state: str) -> bool:
        if can_move(job.state, state):
            return True
        log.debug("job %s: %s -> %s refused", job.id, job.state, state)
        return False

    def set_state(self, job: Job, state: str, reason: str | None = None) -> bool:
        """Move a live job to `state`; False (nothing changes) when the move is not allowed or no move."""
        if job.state == state or state in FINAL_STATES or not self._allowed(job, state):
            return False
        job.state = JobState(state)
        self.journal.update_job(job.id, state=state, route=job.route)
        self.bus.publish(JobStateChanged(job_id=job.id, state=state, worker=job.worker, reason=reason))
        return True

    def start_attempt(self, job: Job, worker: str) -> int:
        """Number the next attempt and mark the job running; 0 (no attempt) when the job can no longer
        start: it ended meanwhile (a cancellation wins over a late start) or waits for approval."""
        if not self._allowed(job, "running"):
            return 0
        job.attempts += 1
        job.worker = worker
        self.journal.start_attempt(job.id, job.attempts, worker, time.time())
        self.journal.update_job(job.id, attempts=job.attempts, worker=worker, state="running")
        if job.state != "running":
            job.state = JobState.RUNNING
            self.bus.publish(JobStateChanged(job_id=job.id, state="running", worker=worker))
        return job.attempts

    def end_attempt(self, job: Job, number: int, outcome: str, error: str | None = None) -> None:
        self.journal.end_attempt(job.id, number, outcome, error)

    def set_route(self, job: Job, route: Route, fallback_reason: str | None = None) -> None:
        """Where the job runs next (gpu or cpu) and, when it leaves its first choice, why."""
        reason = fallback_reason or job.fallback_reason
        if (job.route, job.fallback_reason) == (route, reason):
            return  # the common case, a request staying on the GPU: no journal write on the hot path
        job.route, job.fallback_reason = route, reason
        self.journal.update_job(job.id, route=route, fallback_reason=reason)

    def substitute(self, job: Job, model: str, gpu_role: str, prompt_tokens: int, reason: str) -> None:
        """The asked model's stand-in answers on the GPU from now on (its CPU rung stays the asked model's),
        and why: never silent, the answer's failsoft object and headers name the model that answered.
        `prompt_tokens`: the larger of the two models' counts, so either's context check holds."""
        job.models = {**job.models, "gpu": model}
        job.roles = {**job.roles, "gpu": gpu_role}
        job.prompt_tokens = max(job.prompt_tokens, prompt_tokens)
        job.route, job.fallback_reason = "gpu", reason
        self.journal.update_job(job.id, route="gpu", fallback_reason=reason)

    def to_peer(self, job: Job, role: str, reason: str) -> None:
        """The job goes to a peer (worker role "peer:<name>") next, and why; its CPU rung stays this
        machine's, and the answer's failsoft object names the peer."""
        job.roles = {**job.roles, "peer": role}
        job.models = {**job.models, "peer": job.asked_model}
        job.route, job.fallback_reason = "peer", reason or job.fallback_reason
        self.journal.update_job(job.id, route="peer", fallback_reason=job.fallback_reason)

    def name_fallback(self, job: Job, reason: str) -> None:
        """Record why the job left the GPU, unless a reason is recorded already."""
        if job.fallback_reason is None:
            self._set_fallback(job, reason)

    def refine_fallback(self, job: Job, vague: str, precise: str) -> None:
        """Replace a vague reason (a dropped connection) with what its supervisor found (an abort, a kill)."""
        if job.fallback_reason == vague:
            self._set_fallback(job, precise)

    def _set_fallback(self, job: Job, reason: str) -> None:
        job.fallback_reason = reason
        self.journal.update_job(job.id, fallback_reason=reason)

    def set_prompt_tokens(self, job: Job, tokens: int) -> None:
        """A resumed job's prompt, counted again after a restart (the journal keeps no count)."""
        job.prompt_tokens = tokens

    def extend_deadline(self, job: Job, seconds: float) -> None:
        """The user accepted a longer wait (an approved CPU run)."""
        job.deadline = time.monotonic() + seconds

    def client_stopped_waiting(self, job: Job, error: dict[str, Any]) -> None:
        """The client's deadline passed while someone else runs the job (approval): what it was told; the
        job itself goes on."""
        job.error = error

    def note_effects_delivered(self, job: Job) -> None:
        """A tool call of this job reached its client; once set, it stays set (journaled)."""
        if not job.effects_delivered:
            job.effects_delivered = True
            self.journal.update_job(job.id, effects_delivered=1)

    def note_cpu_cache(self, job: Job, cached_tokens: int) -> None:
        """What the CPU worker's prompt cache held at the job's CPU attempt (its answer's failsoft object
        says so; not journaled: the answer carries it)."""
        job.cpu_cached_tokens = cached_tokens

    def set_attempt_error(self, job: Job, number: int, error: str) -> None:
        self.journal.set_attempt_error(job.id, number, error)

    def await_approval(
        self, job: Job, estimated_seconds: float, reason: str, stand_in_offer: str | None = None
    ) -> bool:
        """Put the job in the user's hands (with a stand-in they may pick instead of the slow CPU run);
        False (no event) when it ended already."""
        if not self._allowed(job, "awaiting_approval"):
            return False
        # An unknown CPU speed gives an infinite estimate: stored as unknown (None; -1 in the event).
        known = math.isfinite(estimated_seconds)
        job.estimated_seconds = estimated_seconds if known else None
        job.fallback_reason = job.fallback_reason or reason
        job.stand_in_offer = stand_in_offer
        self.journal.update_job(
            job.id, estimated_seconds=job.estimated_seconds, fallback_reason=job.fallback_reason
        )
        self.set_state(job, "awaiting_approval", reason)
        event_estimate = estimated_seconds if known else -1.0
        # The event says which model, how large and why; the prompt's opening stays off the wire (the
        # admin routes show it) and goes only to the notification channels that opted in.
        self.bus.publish(
            ApprovalNeeded(
                job_id=job.id,
                estimated_seconds=event_estimate,
                model=job.model,
                prompt_tokens=job.prompt_tokens,
                reason=job.fallback_reason or reason,
                stand_in=stand_in_offer,
                prompt_preview=preview(job.body),
            )
        )
        return True

    def complete(self, job: Job, result: dict[str, Any]) -> bool:
        """Store the answer; False (nothing changes) unless the job is running: a late answer is dropped."""
        if not self._allowed(job, "completed"):
            return False
        job.result = result
        self._finish(job, "completed", result=result)
        return True

    def fail(self, job: Job, state: str, error: dict[str, Any], reason: str | None = None) -> bool:
        """End the job without an answer (`state`: failed, cancelled or rejected); False if it had ended."""
        if state not in _ENDED:
            raise ValueError(f"fail() ends a job as failed, cancelled or rejected, not {state!r}")
        if not self._allowed(job, state):
            return False
        job.error = error
        self._finish(job, state, error=str(error.get("message", "")), reason=reason)
        return True

    def _finish(
        self,
        job: Job,
        state: str,
        result: dict[str, Any] | None = None,
        error: str | None = None,
        reason: str | None = None,
    ) -> None:
        job.state = JobState(state)
        self.counters[state] += 1
        self.journal.update_job(
            job.id,
            state=state,
            worker=job.worker,
            attempts=job.attempts,
            fallback_reason=job.fallback_reason,
            error=error,
            result=result,
        )
        if state in _ENDED and job.attempts == 0:
            # Refused, or ended while it waited: no worker saw it and none will. Its job is read back by
            # its model and a Responses request's note; the rest of a body of megabytes is not kept.
            body = job.body
            self.journal.replace_body(job.id, lambda: body_excerpt(body, ("model", RESPONSE_NOTE)))
        self._live.pop(job.id, None)
        self._keep_finished(job)
        job.finished.set()
        self.bus.publish(JobStateChanged(job_id=job.id, state=state, worker=job.worker, reason=reason))

    def _keep_finished(self, job: Job) -> None:
        """Hold a job that just finished, and let go of the oldest ones beyond the count or the bytes."""
        # The body as sent counts where its estimate (a sample of a long conversation) may fall short.
        body = max(approx_bytes(job.body), job.drop_upstream_body())
        weight = body + approx_bytes(job.result) + approx_bytes(job.error)
        self._finished[job.id] = (job, weight)
        self._finished_bytes += weight
        while len(self._finished) > KEEP_FINISHED or (
            self._finished_bytes > KEEP_FINISHED_BYTES and len(self._finished) > 1
        ):
            old_id, (old, old_weight) = self._finished.popitem(last=False)
            self._finished_bytes -= old_weight
            if old.idempotency_key and self._keys.get(old.idempotency_key) == old_id:
                del self._keys[old.idempotency_key]
