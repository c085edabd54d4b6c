"""The failover policy: pure decisions over plain data, never effects.

Two questions are answered here and nowhere else:
- `decide_route`: where should a new request run, given its size and the two worker profiles?
- `decide_replay`: a GPU attempt failed; may the job run (again) on the CPU, wait for the user's approval,
  or must it end with a controlled error carrying a reason code?
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tray_app.contract.vocabulary import Reason

FallbackPolicy = Literal["auto", "approval", "never"]
StreamFailurePolicy = Literal["resume", "error"]
Action = Literal["gpu", "cpu", "approval", "refuse"]

# Reason codes (tray_app.contract.vocabulary.Reason), by the names this module's decisions use.
CPU_TOO_SLOW = Reason.CPU_TOO_SLOW
CPU_RAM_INSUFFICIENT = Reason.CPU_RAM_INSUFFICIENT
NO_CPU_WORKER = Reason.NO_CPU_WORKER
EFFECTS_DELIVERED = Reason.EFFECTS_DELIVERED
STREAM_STARTED = Reason.STREAM_STARTED
FALLBACK_DISABLED = Reason.FALLBACK_DISABLED
CONTEXT_EXCEEDED = Reason.CONTEXT_EXCEEDED
CONSTRAINED_STREAM_STARTED = Reason.CONSTRAINED_STREAM_STARTED
APPROVAL_BACKLOG_FULL = Reason.APPROVAL_BACKLOG_FULL
STAND_IN = Reason.STAND_IN

# Prompt processing runs much faster than generation; this keeps the estimate honest for long prompts
# without a second measurement.
PROMPT_SPEEDUP = 8.0


@dataclass(frozen=True)
class CpuState:
    """What the effect layer found out about the CPU worker just before asking."""

    enabled: bool
    ready: bool
    ram_ok: bool
    tokens_per_second: float
    n_ctx_per_seq: int


@dataclass(frozen=True)
class Settings:
    fallback: FallbackPolicy = "auto"
    stream_after_content: StreamFailurePolicy = "resume"
    auto_approve_seconds: float = 0.0


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str  # a reason code, or "" for the plain GPU route
    estimated_seconds: float = 0.0
    detail: str = ""
    resume: bool = False  # continue after text the client already has

    @property
    def refused(self) -> bool:
        return self.action == "refuse"


def estimate_cpu_seconds(prompt_tokens: int, max_tokens: int, tokens_per_second: float) -> float:
    """How long the CPU worker needs for this job; infinity when its speed is unknown or zero."""
    if tokens_per_second <= 0:
        return float("inf")
    return (prompt_tokens / PROMPT_SPEEDUP + max_tokens) / tokens_per_second


def _cpu_route(
    cpu: CpuState, settings: Settings, needed_seconds: float, time_left: float, *, resume: bool
) -> Decision:
    """The CPU is usable in principle: run it now, ask the user, or refuse for speed."""
    if settings.fallback == "never":
        return Decision("refuse", FALLBACK_DISABLED, needed_seconds, "failover.fallback is never")
    auto_approved = needed_seconds <= settings.auto_approve_seconds
    if settings.fallback == "approval" and not auto_approved:
        if resume:
            # A live stream cannot wait for a person; it ends with a reason instead.
            return Decision("refuse", CPU_TOO_SLOW, needed_seconds, "the CPU run needs approval")
        return Decision("approval", Reason.APPROVAL_REQUIRED, needed_seconds)
    if needed_seconds <= time_left or auto_approved:
        return Decision("cpu", "", needed_seconds, resume=resume)
    detail = f"CPU needs about {needed_seconds:.1f}s, {max(time_left, 0.0):.1f}s left before the deadline"
    if resume:
        return Decision("refuse", CPU_TOO_SLOW, needed_seconds, detail)
    return Decision("approval", CPU_TOO_SLOW, needed_seconds, detail)


def _cpu_unusable(cpu: CpuState, total_tokens: int) -> Decision | None:
    if not cpu.enabled or not cpu.ready:
        return Decision("refuse", NO_CPU_WORKER, detail="the CPU worker is disabled or not ready")
    if not cpu.ram_ok:
        return Decision("refuse", CPU_RAM_INSUFFICIENT, detail="not enough free RAM for the CPU worker")
    if total_tokens > cpu.n_ctx_per_seq:
        return Decision(
            "refuse",
            CONTEXT_EXCEEDED,
            detail=f"needs {total_tokens} tokens; the CPU profile fits {cpu.n_ctx_per_seq}",
        )
    return None


@dataclass(frozen=True)
class RouteRequest:
    prompt_tokens: int
    max_tokens: int
    gpu_n_ctx_per_seq: int
    gpu_available: bool  # the GPU worker exists and is not failed/stopped
    time_left: float


def route_on_gpu(request: RouteRequest) -> Decision | None:
    """The GPU when the request fits its profile; None when the CPU must be considered (decide_route).
    Asked first so a request that fits the GPU never waits for the CPU worker's state."""
    if request.gpu_available and request.prompt_tokens + request.max_tokens <= request.gpu_n_ctx_per_seq:
        return Decision("gpu", "")
    return None


def decide_route(request: RouteRequest, cpu: CpuState, settings: Settings) -> Decision:
    """Capacity routing of a new request: the GPU when it fits, else the CPU by policy, else an error."""
    total = request.prompt_tokens + request.max_tokens
    on_gpu = route_on_gpu(request)
    if on_gpu is not None:
        return on_gpu
    reason = Reason.GPU_UNAVAILABLE if not request.gpu_available else Reason.EXCEEDS_GPU_PROFILE
    unusable = _cpu_unusable(cpu, total)
    if unusable is not None:
        if unusable.reason == CONTEXT_EXCEEDED or request.gpu_available:
            cpu_fits = cpu.n_ctx_per_seq if cpu.enabled else 0
            fits = max(request.gpu_n_ctx_per_seq if request.gpu_available else 0, cpu_fits)
            return Decision(
                "refuse",
                CONTEXT_EXCEEDED,
                detail=f"prompt {request.prompt_tokens} + max_tokens {request.max_tokens} = {total} tokens; "
                f"the GPU profile fits {request.gpu_n_ctx_per_seq}, the largest that fits is {fits}",
            )
        return unusable
    needed = estimate_cpu_seconds(request.prompt_tokens, request.max_tokens, cpu.tokens_per_second)
    decision = _cpu_route(cpu, settings, needed, request.time_left, resume=False)
    if decision.action == "cpu":
        return Decision("cpu", reason, needed)
    if decision.reason == FALLBACK_DISABLED and reason == "exceeds_gpu_profile":
        return Decision(
            "refuse",
            CONTEXT_EXCEEDED,
            needed,
            f"prompt {request.prompt_tokens} + max_tokens {request.max_tokens} = {total} tokens; the GPU "
            f"profile fits {request.gpu_n_ctx_per_seq} and failover.fallback is never",
        )
    return decision


@dataclass(frozen=True)
class FailureContext:
    """What happened so far to a job whose GPU attempt just failed."""

    streaming: bool
    content_delivered: bool  # any generated text reached the client
    tool_call_delivered: bool  # a tool call reached the client: its action may already have run
    prompt_tokens: int
    remaining_tokens: int  # max_tokens minus what the client already has
    time_left: float  # seconds until the client's deadline
    constrained: bool = False  # a grammar, JSON schema or tool list shapes it, or it has log probabilities
    stand_in_answering: bool = False  # a stand-in (another model) wrote what the client has so far


def decide_replay(failure: FailureContext, cpu: CpuState, settings: Settings) -> Decision:
    """May the failed job continue on the CPU? Checks run from the hardest rule (effects) to the softest."""
    if failure.tool_call_delivered:
        return Decision("refuse", EFFECTS_DELIVERED, detail="a tool call was already delivered")
    resume = failure.streaming and failure.content_delivered
    if resume and settings.stream_after_content == "error":
        return Decision("refuse", STREAM_STARTED, detail="content was already streamed to the client")
    if resume and failure.stand_in_answering:
        # The CPU worker is the asked model's: a second model cannot continue another's text.
        return Decision(
            "refuse",
            STREAM_STARTED,
            detail="a smaller stand-in model streamed part of the answer; another model cannot continue it",
        )
    if resume and failure.constrained:
        # A continuation is a plain completion of the text so far: no grammar can pick up mid-answer, and
        # a tool call in it would arrive as text. Better a clear error than an answer outside its shape.
        return Decision(
            "refuse",
            CONSTRAINED_STREAM_STARTED,
            detail="the streamed answer follows a grammar, JSON schema or tool list, or carries log "
            "probabilities, which a continuation on the CPU cannot keep",
        )
    unusable = _cpu_unusable(cpu, failure.prompt_tokens + failure.remaining_tokens)
    if unusable is not None:
        return unusable
    needed = estimate_cpu_seconds(failure.prompt_tokens, failure.remaining_tokens, cpu.tokens_per_second)
    return _cpu_route(cpu, settings, needed, failure.time_left, resume=resume)


# Failures that say nothing about a worker's health (it was busy, or not up yet).
NOT_WORKER_FAULTS = frozenset({"unavailable", "queue_timeout"})


def try_gpu_again(failure_kind: str, content_delivered: bool, decision: Decision) -> bool:
    """After a GPU attempt failed only because the worker was busy or starting (not a fault of it), and the
    CPU is not the answer: wait for the GPU worker and try it again, if nothing reached the client yet."""
    return decision.action != "cpu" and failure_kind in NOT_WORKER_FAULTS and not content_delivered


@dataclass(frozen=True)
class StandInCase:
    """The ladder's middle rung: the asked model cannot use the GPU (now, or after a failure there)."""

    allowed: bool  # by the config (library.stand_in) and by the request (X-Failsoft-Stand-In)
    available: bool  # the stand-in's GPU worker is ready, or can be loaded now
    fits: bool  # the request fits the stand-in's context per slot
    content_delivered: bool = False
    tool_call_delivered: bool = False


def stand_in_first(case: StandInCase) -> bool:
    """Whether the stand-in on the GPU answers before this model on the CPU is considered. Only while the
    client has nothing of the first model's answer: a second model cannot continue another's text, and a
    delivered tool call is never run again (the same safety rules as a CPU replay)."""
    return (
        case.allowed
        and case.available
        and case.fits
        and not case.content_delivered
        and not case.tool_call_delivered
    )
