"""What a worker failure was, from how its process ended and the last lines it printed.

Pure: no processes here, so the table of cases is unit-tested directly. The kinds are the contract with the
router and the UI: oom_load, oom_decode, crash_abort, killed, hung, bad_config, exited.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Literal

FailureKind = Literal["oom_load", "oom_decode", "crash_abort", "killed", "hung", "bad_config", "exited"]
FAILURE_KINDS: tuple[FailureKind, ...] = (
    "oom_load",
    "oom_decode",
    "crash_abort",
    "killed",
    "hung",
    "bad_config",
    "exited",
)

# Signals that mean the process crashed (llama.cpp's GGML_ABORT and CUDA errors end in SIGABRT).
_CRASH_SIGNALS = {signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL}

# llama-server's load log, read only up to its "model loaded" line (later lines may quote requests). It exits
# with status 1 after any load failure; these say which. Bad configuration first: a missing file also makes
# "failed to load model" lines, which are not about memory.
_LOAD_PATTERNS: tuple[tuple[FailureKind, re.Pattern[str]], ...] = (
    (
        "bad_config",
        re.compile(
            r"failed to open GGUF file|No such file or directory|invalid magic|unknown model architecture"
            r"|^error: invalid argument|^error while handling argument|error: unknown value"
        ),
    ),
    (
        "oom_load",
        re.compile(
            r"failed to allocate|unable to allocate|insufficient memory|out of memory|cudaMalloc failed"
            r"|hipMalloc failed|ErrorOutOfDeviceMemory|Requested buffer size exceeds|std::bad_alloc"
        ),
    ),
)


@dataclass(frozen=True)
class Failure:
    kind: FailureKind
    message: str


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# llama.cpp's log prefix: elapsed time and level ("0.00.075.895 E ").
_LOG_PREFIX = re.compile(r"^\d+\.\d+\.\d+\.\d+ [A-Z] ")


def _matching_line(lines: list[str]) -> tuple[FailureKind, str] | None:
    """The first kind whose pattern any load line matches, with the first such line."""
    for kind, pattern in _LOAD_PATTERNS:
        for line in lines:
            text = _LOG_PREFIX.sub("", line.strip())
            if pattern.search(text):
                return kind, text
    return None


def classify_exit(returncode: int | None, load_log: list[str]) -> Failure:
    """The failure a worker process ended with: first how it ended (`returncode` as subprocess reports it,
    -N for signal N), then, for an exit status, what its load log said (never what it printed later, which
    can quote a request's own text)."""
    if returncode is not None and returncode < 0:
        number = -returncode
        name = _signal_name(number)
        if number in _CRASH_SIGNALS:
            return Failure("crash_abort", f"worker crashed ({name})")
        if number == signal.SIGKILL:
            return Failure(
                "killed", "worker was killed (SIGKILL), e.g. by the kernel's out-of-memory killer or a user"
            )
        return Failure("exited", f"worker ended by {name}")
    found = _matching_line(load_log)
    if found is not None:
        kind, line = found
        return Failure(kind, line)
    return Failure("exited", f"worker exited with status {returncode}")


def hung_failure(seconds: float, during: str) -> Failure:
    """A worker that did not answer /health in time; `during` says when (start, health check)."""
    return Failure("hung", f"no /health answer within {seconds:g} s during {during}")
