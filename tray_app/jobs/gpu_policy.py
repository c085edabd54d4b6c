"""The GPU path's policy: pure decisions over the device now (the watcher's reading, as plain figures).

- `gpu_path_state`: normal, squeezed (another program ate into the reserve), yielded or lost.
- `decide_gpu_start`: may a worker start on the GPU with the memory free now, or with a smaller plan, or
  not at all (then the stand-in or the CPU answer by the usual rules); the reason names who holds the memory.
- `yield_targets`: which programs on the card the GPU is given to (`gpu.yield_to`).
- `decide_return`: after a yield, is it time to take the GPU back (free long enough, not too often)?
- `why_not_gpu`: what a job routed off the GPU says about the GPU path (for the intake's decision detail).

The host gathers the figures and acts on the answers; nothing here reads a device or starts a process.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from tray_app.contract.sizes import format_size

GpuPath = Literal["normal", "squeezed", "yielded", "lost"]
GPU_PATHS: tuple[GpuPath, ...] = ("normal", "squeezed", "yielded", "lost")


@dataclass(frozen=True)
class Holder:
    """A program other than this worker holding device memory, as a reason names it."""

    name: str  # "comfyui (python3, pid 4242)"
    used_bytes: int | None

    def describe(self) -> str:
        size = format_size(self.used_bytes) if self.used_bytes is not None else "memory"
        return f"{self.name} holds {size}"


def holders_text(holders: Iterable[Holder], limit: int = 3) -> str:
    """The largest holders first, in words: "comfyui (python3, pid 4242) holds 3.00 GiB"."""
    ranked = sorted(holders, key=lambda h: h.used_bytes or 0, reverse=True)
    if not ranked:
        return "no other program is listed (the driver or memory no process accounts for)"
    text = "; ".join(h.describe() for h in ranked[:limit])
    return text + (f"; and {len(ranked) - limit} more" if len(ranked) > limit else "")


def gpu_path_state(
    *, device_state: str, yielded: bool, free_bytes: int, reserve_bytes: int, held_back: bool = False
) -> GpuPath:
    """Where the GPU path stands. `held_back`: a GPU start was not made for want of memory.

    Lost wins (the card itself is gone); then a yield (on purpose); then squeezed: the memory free on the
    card is below the reserve, or a start was held back, so nothing new starts there while what is loaded
    keeps serving."""
    if device_state == "lost":
        return "lost"
    if yielded:
        return "yielded"
    if held_back or free_bytes < reserve_bytes:
        return "squeezed"
    return "normal"


@dataclass(frozen=True)
class StartCheck:
    """One GPU start as the policy weighs it: what its plan needs, what is free now, and the minimums."""

    role: str
    need_bytes: int  # the plan's weights + KV cache + compute on the device
    free_bytes: int  # free on the device now (this worker holds nothing: it is about to start)
    reserve_bytes: int  # never spent: a start must leave it free
    n_ctx_per_seq: int
    n_gpu_layers: int
    min_ctx: int
    min_layers: int
    holders: tuple[Holder, ...] = ()
    path: GpuPath = "normal"
    smaller_need_bytes: int | None = None  # a plan made for what is free now; None: none was made
    smaller_ctx: int = 0
    smaller_layers: int = 0
    # Held back beside the plan's need: its last loads ran out of memory by about this much (the estimate
    # was short on this device), so the next start is weighed as needing more.
    learned_bytes: int = 0


StartAction = Literal["start", "smaller", "refuse"]


@dataclass(frozen=True)
class StartDecision:
    action: StartAction
    reason: str  # in words; a refusal names the programs holding the memory

    @property
    def refused(self) -> bool:
        return self.action == "refuse"


def _within(check: StartCheck, need: int, ctx: int, layers: int) -> str | None:
    """Why a plan with these figures is not started ("" when it fits and keeps the minimums)."""
    if ctx < check.min_ctx or layers < check.min_layers:
        return (
            f"the largest plan that fits has {ctx} tokens per request and {layers} layers on the GPU, "
            f"below gpu.min_ctx {check.min_ctx} / gpu.min_layers {check.min_layers}"
        )
    if need + check.learned_bytes + check.reserve_bytes > check.free_bytes:
        learned = (
            f" (+{format_size(check.learned_bytes)} its last load lacked)" if check.learned_bytes else ""
        )
        return (
            f"needs {format_size(need)}{learned} and the {format_size(check.reserve_bytes)} reserve, "
            f"{format_size(check.free_bytes)} free"
        )
    return None


def _learned_text(check: StartCheck) -> str:
    if not check.learned_bytes:
        return ""
    return f"; its last load ran out of memory, {format_size(check.learned_bytes)} more held back"


def decide_gpu_start(check: StartCheck) -> StartDecision:
    """Start with the plan as it is when it fits what is free now; else with the smaller plan when that one
    fits within the minimums; else not at all, saying which programs hold the memory."""
    if check.path in ("yielded", "lost"):
        why = "the GPU is yielded to another program" if check.path == "yielded" else "the GPU is lost"
        return StartDecision("refuse", f"{check.role} not started on the GPU: {why}")
    whole = _within(check, check.need_bytes, check.n_ctx_per_seq, check.n_gpu_layers)
    if whole is None:
        return StartDecision("start", "")
    if check.smaller_need_bytes is not None:
        smaller = _within(check, check.smaller_need_bytes, check.smaller_ctx, check.smaller_layers)
        if smaller is None:
            return StartDecision(
                "smaller",
                f"{check.role} starts with a smaller plan ({check.smaller_ctx} tokens per request, "
                f"{check.smaller_layers} layers, {format_size(check.smaller_need_bytes)}): "
                f"{holders_text(check.holders)}{_learned_text(check)}",
            )
        whole = smaller
    return StartDecision(
        "refuse",
        f"{check.role} not started on the GPU: {whole}; {holders_text(check.holders)}{_learned_text(check)}",
    )


def matches_yield(name: str, label: str, patterns: Sequence[str]) -> str | None:
    """The `gpu.yield_to` pattern that a program's name or label matches (shell patterns, any case)."""
    for pattern in patterns:
        wanted = pattern.strip().lower()
        if not wanted:
            continue
        for candidate in (name.lower(), label.lower()):
            if candidate and (fnmatch.fnmatchcase(candidate, wanted) or candidate == wanted):
                return pattern
    return None


@dataclass(frozen=True)
class Program:
    """A program on the card, as `yield_targets` reads it."""

    name: str
    label: str
    describe: str
    used_bytes: int | None


def yield_targets(programs: Iterable[Program], patterns: Sequence[str]) -> list[Program]:
    """The programs the GPU is given to: those whose name or label matches a `gpu.yield_to` pattern."""
    return [p for p in programs if matches_yield(p.name, p.label, patterns) is not None]


@dataclass(frozen=True)
class ReturnCheck:
    """After a yield: may the GPU worker come back now?"""

    manual: bool  # the user asked for the yield; only `failsoft resume` ends it
    resume_asked: bool  # the user asked to come back (now, if it fits)
    targets_present: bool  # a program of gpu.yield_to still holds memory
    fits_now: bool  # the main GPU plan fits what is free now, reserve kept
    fits_since: float | None  # monotonic time since when it has fitted without a break
    now: float
    return_after: float
    recent_returns: Sequence[float]  # monotonic times of the earlier returns
    max_returns: int
    return_window: float


ReturnAction = Literal["return", "wait", "hold"]


@dataclass(frozen=True)
class ReturnDecision:
    action: ReturnAction  # return now; wait (it may return soon by itself); hold (only the user ends it)
    reason: str
    at: float | None = None  # a "wait" with a known end: when to look again (monotonic)


def decide_return(check: ReturnCheck) -> ReturnDecision:
    """Return once the memory has been free for `return_after` seconds, at most `max_returns` times per
    `return_window` (no flapping). A manual yield returns only when asked, at once if the plan fits."""
    if check.manual and not check.resume_asked:
        return ReturnDecision("hold", "yielded by request: `failsoft resume` gives the GPU back to Failsoft")
    if check.targets_present and not check.resume_asked:
        return ReturnDecision("wait", "a program the GPU is yielded to still holds memory")
    if not check.fits_now or check.fits_since is None:
        return ReturnDecision("wait", "the memory the GPU worker needs is not free yet")
    recent = [t for t in check.recent_returns if check.now - t < check.return_window]
    if len(recent) >= check.max_returns:
        until = min(recent) + check.return_window
        return ReturnDecision(
            "wait",
            f"{len(recent)} returns within {check.return_window:.0f} s already (gpu.max_returns): "
            f"next one in {until - check.now:.0f} s",
            at=until,
        )
    if check.resume_asked:
        return ReturnDecision("return", "resumed by request")
    due = check.fits_since + check.return_after
    if check.now < due:
        waited = check.now - check.fits_since
        return ReturnDecision("wait", f"free for {waited:.0f} s of {check.return_after:.0f}", due)
    return ReturnDecision("return", f"the memory has been free for {check.return_after:.0f} s")


def why_not_gpu(path: GpuPath, path_reason: str) -> str:
    """The words a job routed off the GPU carries when the GPU path explains it ("" when it does not): the
    intake adds them to the decision's detail next to the reason code (gpu_unavailable)."""
    if path == "normal":
        return ""
    if path == "squeezed":
        return f"the GPU is squeezed by another program, nothing new starts there: {path_reason}"
    if path == "yielded":
        return f"the GPU is yielded to another program: {path_reason}"
    return f"the GPU is lost: {path_reason}"
