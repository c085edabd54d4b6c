"""Faults for drills and tests, produced in a real llama-server the way a real GPU failure ends it.

- abort: SIGABRT, what GGML_ABORT does after "CUDA error: out of memory" in CUDA's pool (exit -6).
- kill: SIGKILL, what the kernel's out-of-memory killer does (exit -9).
- hang: SIGSTOP, a process that neither answers /health nor sends another token, until it is killed.

A fault is one-shot. It fires once the worker has sent `after_tokens` tokens (counted by the router as it
relays them, over every request on that worker) since it was armed; with 0 it fires before the next request
reaches the worker, so nothing of that request was generated.

Not produced here: llama-server's in-stream "Compute error." (llama_decode returning -2/-3 while the process
stays up) has no trigger short of a real device running out of memory mid-decode. The router's handling of
it (classified `oom_decode`, replayed on the CPU) is tested against a scripted upstream that sends exactly
what llama-server sends (tests/jobs/test_relay.py).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Literal, get_args

FaultKind = Literal["abort", "kill", "hang"]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
SIGNALS: dict[str, signal.Signals] = {
    "abort": signal.SIGABRT,
    "kill": signal.SIGKILL,
    "hang": signal.SIGSTOP,
}


@dataclass
class ArmedFault:
    kind: FaultKind
    after_tokens: int
    seen_tokens: int = 0

    def to_dict(self) -> dict[str, int | str]:
        return {"kind": self.kind, "after_tokens": self.after_tokens}


def check_fault(kind: str, after_tokens: int) -> ArmedFault:
    """The fault to arm; ValueError (with the kinds that exist) for an unknown kind or a negative count."""
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {kind!r} for llama-server; use one of {', '.join(FAULT_KINDS)}")
    if after_tokens < 0:
        raise ValueError("after_tokens must be >= 0")
    return ArmedFault(kind=kind, after_tokens=after_tokens)  # type: ignore[arg-type]
