"""Job states, worker states, failure kinds and reason codes: stable strings on the wire, in the journal,
in events and in the tray. Each is defined here once; every other module takes them from here."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"


# What a job asks of a worker: a chat, a text completion, or embeddings.
JobKind = Literal["chat", "completion", "embedding"]
JOB_KINDS: tuple[JobKind, ...] = get_args(JobKind)


def job_kind(value: str) -> JobKind:
    """A stored kind read back as a JobKind; ValueError for any other string."""
    for kind in JOB_KINDS:
        if kind == value:
            return kind
    raise ValueError(f"unknown job kind {value!r}; kinds are {', '.join(JOB_KINDS)}")


FINAL_JOB_STATES: frozenset[str] = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.REJECTED}
)
UNFINISHED_JOB_STATES: tuple[str, ...] = (JobState.QUEUED, JobState.RUNNING, JobState.AWAITING_APPROVAL)
# The final states of a job that ended without an answer (it may be asked again under its Idempotency-Key).
ENDED_WITHOUT_ANSWER: frozenset[str] = frozenset({JobState.FAILED, JobState.CANCELLED, JobState.REJECTED})
JOB_STATES: tuple[str, ...] = tuple(JobState)

# A worker process's life, as its supervisor owns it.
WorkerState = Literal["stopped", "starting", "ready", "unhealthy", "restarting", "stopping", "failed"]
WORKER_STATES: tuple[WorkerState, ...] = get_args(WorkerState)

# How a worker attempt or process failed (the supervisor's classification, the router's view of a stream).
FailureKind = Literal["oom_load", "oom_decode", "crash_abort", "killed", "hung", "bad_config", "exited"]
FAILURE_KINDS: tuple[FailureKind, ...] = get_args(FailureKind)


class Reason(StrEnum):
    """Why a request went where it went, or why it could not be served: clients, events, the journal and
    the tray all use these codes (each has words: tray_app.view.reasons)."""

    EXCEEDS_GPU_PROFILE = "exceeds_gpu_profile"
    GPU_UNAVAILABLE = "gpu_unavailable"
    APPROVAL_REQUIRED = "approval_required"
    CPU_TOO_SLOW = "cpu_too_slow"
    CPU_RAM_INSUFFICIENT = "cpu_ram_insufficient"
    NO_CPU_WORKER = "no_cpu_worker"
    EFFECTS_DELIVERED = "effects_delivered"
    STREAM_STARTED = "stream_started"
    CONSTRAINED_STREAM_STARTED = "constrained_stream_started"
    FALLBACK_DISABLED = "fallback_disabled"
    CONTEXT_EXCEEDED = "context_length_exceeded"
    APPROVAL_BACKLOG_FULL = "approval_backlog_full"
    STAND_IN = "stand_in"  # the asked model could not use the GPU; its smaller stand-in answered there
    MODEL_DOES_NOT_FIT = "model_does_not_fit"  # no room on the GPU even after unloading idle models
    # Why a job ended without an answer, besides the policy's decisions above.
    QUEUE_FULL = "queue_full"  # too many requests already wait for a worker slot
    QUEUE_TIMEOUT = "queue_timeout"  # no worker slot came free within the client's deadline
    TOO_MANY_JOBS = "too_many_jobs"  # server.jobs_max background jobs are unfinished
    JOURNAL_FAILED = "journal_failed"  # the journal could not store accepted work
    INTERNAL_ERROR = "internal_error"  # a fault in the router itself
    CLIENT_DISCONNECTED = "client_disconnected"  # the client left (or stopped reading and was dropped)
    CANCELLED_BY_REQUEST = "cancelled_by_request"  # DELETE /v1/jobs/{id}
    REJECTED = "rejected"  # the user rejected the slow CPU run
    SERVICE_RESTARTED = "service_restarted"  # the service restarted: the job's client is gone
    CPU_ATTEMPT_FAILED = "cpu_attempt_failed"  # the CPU worker failed the job too
    NO_WORKER_FOR_MODEL = "no_worker_for_model"  # the model has no worker on this machine
    PEER_FAILED = "peer_failed"  # a peer (another machine's server) refused the job: the next rung takes it


# The translated body's note of the Responses request a job came from (server.responses.translate), kept
# with the job so a later request can continue its conversation; the router's alone, never a worker's.
RESPONSE_NOTE = "failsoft_response"
