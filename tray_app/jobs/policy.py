"""The failover policy: pure decisions over plain data, never effects.

Three questions are answered here and nowhere else:
- `decide_route`: where should a new request run, given its size and the two worker profiles?
- `decide_replay`: a GPU attempt failed; may the job run (again) on the CPU, wait for the user's approval,
  or must it end with a controlled error carrying a reason code?
- the CPU mirror (jobs.mirror): is a job's prompt worth reading on the CPU in the background
  (`mirror_reason`), which of the waiting reads go first and which are given up (`mirror_order`), in pieces
  of what size (`mirror_piece_tokens`), and when a stream's answer so far is read too (`extend_due`)?
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tray_app.contract.vocabulary import Reason

FallbackPolicy = Literal["auto", "approval", "never"]
StreamFailurePolicy = Literal["resume", "error"]
Action = Literal["gpu", "peer", "cpu", "approval", "refuse"]

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


def estimate_cpu_seconds(
    prompt_tokens: int, max_tokens: int, tokens_per_second: float, cached_tokens: int = 0
) -> float:
    """How long the CPU worker needs for this job; infinity when its speed is unknown or zero. The prompt's
    `cached_tokens` (the mirror read them already) cost nothing to read again."""
    if tokens_per_second <= 0:
        return float("inf")
    unread = max(prompt_tokens - max(cached_tokens, 0), 0)
    return (unread / PROMPT_SPEEDUP + max_tokens) / tokens_per_second


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
    cached_tokens: int = 0  # of the prompt, already read by the CPU worker (the mirror)


def decide_replay(failure: FailureContext, cpu: CpuState, settings: Settings) -> Decision:
    """May the failed job continue on the CPU? Checks run from the hardest rule (effects) to the softest."""
    unsafe = replay_refusal(failure, settings)
    if unsafe is not None:
        return unsafe
    resume = failure.streaming and failure.content_delivered
    unusable = _cpu_unusable(cpu, failure.prompt_tokens + failure.remaining_tokens)
    if unusable is not None:
        return unusable
    needed = estimate_cpu_seconds(
        failure.prompt_tokens, failure.remaining_tokens, cpu.tokens_per_second, failure.cached_tokens
    )
    return _cpu_route(cpu, settings, needed, failure.time_left, resume=resume)


def peer_takes_over(failure: FailureContext, settings: Settings) -> Decision | None:
    """The ladder's rung after this machine's GPU: a peer's GPU continues a failed job when a replay is safe
    at all, by the rules a CPU replay follows (effects, a started stream, a stand-in's text, a grammar), and
    with no approval: it is a GPU, as fast as the one that failed. None: the next rung decides."""
    if replay_refusal(failure, settings) is not None:
        return None
    return Decision("peer", "", resume=failure.streaming and failure.content_delivered)


def replay_refusal(failure: FailureContext, settings: Settings) -> Decision | None:
    """The refusal when a failed job may not continue anywhere (the hardest rules: effects, then what
    already reached the client); None when a replay is safe."""
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
    return None


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


# ------------------------------------------------------------------------------------------ the mirror
MIRROR_LONG_PROMPT = "long_prompt"
MIRROR_STREAM = "stream"
MIRROR_AGENT = "agent"
# How long one mirror request may keep the CPU worker's cores: llama-server finishes the batch it is in before
# it sees a cancel, so this bounds how long real work can wait behind mirror work.
MIRROR_PIECE_SECONDS = 0.5
# Smaller batches read slowly: SmolLM2 on one thread read 38 tokens/s in pieces of 32, 80 in pieces of 64.
MIRROR_PIECE_MIN = 64
MIRROR_PIECE_MAX = 1024
# A read that would take the CPU longer than this is given up: the conversation has likely moved on, and
# newer work is waiting.
MIRROR_CATCH_UP_SECONDS = 300.0


@dataclass(frozen=True)
class MirrorCase:
    """A job starting on the GPU, as the mirror's policy sees it."""

    prompt_tokens: int
    max_tokens: int
    streaming: bool
    tools: bool  # an agent's request: its next turn repeats this prompt and adds to it
    prompt_tokens_per_second: float  # the CPU worker's reading speed; 0: not known yet
    min_ms: float  # cpu.mirror_min_ms


def prompt_read_seconds(tokens: int, prompt_tokens_per_second: float) -> float:
    """How long the CPU worker takes to read `tokens` of prompt; infinity while its speed is unknown."""
    if tokens <= 0:
        return 0.0
    if prompt_tokens_per_second <= 0:
        return float("inf")
    return tokens / prompt_tokens_per_second


def cpu_prompt_speed(measured: float, generation_tokens_per_second: float) -> float:
    """The CPU's prompt-reading speed: measured when it has been, else estimated from its generation."""
    return measured if measured > 0 else generation_tokens_per_second * PROMPT_SPEEDUP


def mirror_reason(case: MirrorCase) -> str:
    """Why this job is worth mirroring ("" when it is not): its prompt alone would keep a replay waiting
    longer than `min_ms`; or a stream whose answer may grow that long (a resume reads it too); or an agent's
    request, whose next turn starts with this one. A speed not known yet counts as slow."""
    limit = case.min_ms / 1000.0
    if case.tools:
        return MIRROR_AGENT
    if prompt_read_seconds(case.prompt_tokens, case.prompt_tokens_per_second) >= limit:
        return MIRROR_LONG_PROMPT
    grown = case.prompt_tokens + case.max_tokens
    if case.streaming and prompt_read_seconds(grown, case.prompt_tokens_per_second) >= limit:
        return MIRROR_STREAM
    return ""


def mirror_piece_tokens(prompt_tokens_per_second: float) -> int:
    """Tokens per mirror request: about MIRROR_PIECE_SECONDS of the CPU's reading."""
    if prompt_tokens_per_second <= 0:
        return MIRROR_PIECE_MIN
    wanted = int(prompt_tokens_per_second * MIRROR_PIECE_SECONDS)
    return min(max(wanted, MIRROR_PIECE_MIN), MIRROR_PIECE_MAX)


@dataclass(frozen=True)
class MirrorWork:
    """One job's read waiting for the CPU: how far behind the CPU is, and when the job last changed it."""

    key: str
    behind_tokens: int
    updated_at: float


def mirror_order(
    work: list[MirrorWork], limit: int, prompt_tokens_per_second: float
) -> tuple[list[str], list[str]]:
    """Which reads to do, newest first (the conversation the user is in), and which to give up: beyond the
    `limit` newest, or more than MIRROR_CATCH_UP_SECONDS of reading behind. Work with nothing behind is in
    neither list."""
    keep: list[str] = []
    drop: list[str] = []
    for item in sorted(work, key=lambda w: w.updated_at, reverse=True):
        if item.behind_tokens <= 0:
            continue
        too_far = prompt_read_seconds(item.behind_tokens, prompt_tokens_per_second) > MIRROR_CATCH_UP_SECONDS
        if len(keep) >= limit or (too_far and prompt_tokens_per_second > 0):
            drop.append(item.key)
        else:
            keep.append(item.key)
    return keep, drop


def extend_due(new_tokens: int, seconds: float, every_tokens: int, every_seconds: float) -> bool:
    """Whether a stream's answer so far goes to the mirror now: `every_tokens` new tokens, or
    `every_seconds` since the last time with something new (0 turns either off)."""
    if new_tokens <= 0:
        return False
    by_tokens = every_tokens > 0 and new_tokens >= every_tokens
    return by_tokens or (every_seconds > 0 and seconds >= every_seconds)
