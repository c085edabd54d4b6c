"""Fault injection for drills and tests; only ever active in a worker started with --enable-faults.

Each fault is one-shot and fires at the first decode after `after_tokens` tokens were generated since it was
armed, from inside llama-cpp-python's own decode path (the Llama instance's `eval`), so it travels exactly the
way the real failure does:
- oom_decode: raises what a real failed `llama_decode` raises, RuntimeError("llama_decode returned -2"),
  before anything is decoded (a real -2 leaves the KV cache as it was, too). The worker stays up.
- abort: prints CUDA's out-of-memory line and aborts the process (SIGABRT), like CUDA's pool failing.
- hang: stops the whole process (SIGSTOP to itself): no token, no /health answer, until it is killed.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

FaultKind = Literal["oom_decode", "abort", "hang"]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
MARK = "(simulated)"


@dataclass(frozen=True)
class ArmedFault:
    kind: FaultKind
    after_tokens: int


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _fire(kind: FaultKind) -> None:
    if kind == "oom_decode":
        _say(f"llama_decode: failed to decode, ret = -2 {MARK}")
        raise RuntimeError("llama_decode returned -2")
    if kind == "abort":
        _say(f"CUDA error: out of memory {MARK}")
        _say(f"  current device: 0, in function ggml_cuda_pool_malloc {MARK}")
        if sys.platform != "win32":
            import resource

            # A drill must not leave a core file behind.
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.abort()
    _say(f"worker stops answering (SIGSTOP) {MARK}")
    os.kill(os.getpid(), signal.SIGSTOP)


class FaultInjector:
    """Holds at most one armed fault and fires it from the wrapped decode path."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: ArmedFault | None = None
        self._generated = 0

    def arm(self, kind: str, after_tokens: int) -> ArmedFault:
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; use one of {', '.join(FAULT_KINDS)}")
        if after_tokens < 0:
            raise ValueError("after_tokens must be >= 0")
        fault = ArmedFault(kind=kind, after_tokens=after_tokens)  # type: ignore[arg-type]
        with self._lock:
            self._armed = fault
            self._generated = 0
        return fault

    def armed(self) -> ArmedFault | None:
        with self._lock:
            return self._armed

    def attach(self, llama: Any) -> None:
        """Wrap this Llama instance's eval (every decode) and sample (every generated token)."""
        original_eval: Callable[[Sequence[int]], None] = llama.eval
        original_sample: Callable[..., int] = llama.sample

        def eval_with_faults(tokens: Sequence[int]) -> None:
            self._before_decode()
            original_eval(tokens)

        def sample_counting(*args: Any, **kwargs: Any) -> int:
            token = original_sample(*args, **kwargs)
            with self._lock:
                self._generated += 1
            return token

        setattr(llama, "eval", eval_with_faults)  # noqa: B010 - instance attribute shadows the method
        setattr(llama, "sample", sample_counting)  # noqa: B010

    def _before_decode(self) -> None:
        with self._lock:
            fault = self._armed
            if fault is None or self._generated < fault.after_tokens:
                return
            self._armed = None  # one-shot
        _fire(fault.kind)
