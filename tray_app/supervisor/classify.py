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

# (kind, pattern) checked against each output line, newest line first: the last thing the worker said wins,
# so an old decode error earlier in the log does not explain a later load failure.
_LINE_PATTERNS: tuple[tuple[FailureKind, re.Pattern[str]], ...] = (
    ("oom_decode", re.compile(r"llama_decode returned -[23]\b")),
    (
        "bad_config",
        re.compile(
            r"Model path does not exist|No such file or directory|invalid magic|unknown model architecture"
        ),
    ),
    # argparse: "prog: error: ..." is the last line, after the usage lines.
    ("bad_config", re.compile(r"^python -m tray_app\.worker: error: |^usage: ")),
    (
        "oom_load",
        re.compile(
            r"failed to allocate|cudaMalloc failed|out of memory|Failed to create llama_context"
            r"|Failed to load model|unable to allocate|MemoryError|std::bad_alloc"
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


def _matching_line(lines: list[str]) -> tuple[FailureKind, str] | None:
    for line in reversed(lines):
        text = line.strip()
        if not text:
            continue
        for kind, pattern in _LINE_PATTERNS:
            if pattern.search(text):
                return kind, text
    return None


def classify_exit(returncode: int | None, output_tail: list[str]) -> Failure:
    """The failure a worker process ended with (`returncode` as subprocess reports it: -N for signal N)."""
    if returncode is not None and returncode < 0:
        number = -returncode
        name = _signal_name(number)
        if number in _CRASH_SIGNALS:
            found = _matching_line(output_tail)
            detail = f": {found[1]}" if found else ""
            return Failure("crash_abort", f"worker crashed ({name}){detail}")
        if number == signal.SIGKILL:
            return Failure(
                "killed", "worker was killed (SIGKILL), e.g. by the kernel's out-of-memory killer or a user"
            )
        return Failure("exited", f"worker ended by {name}")
    found = _matching_line(output_tail)
    if found is not None:
        kind, line = found
        return Failure(kind, line)
    if returncode == 2:
        return Failure("bad_config", "worker rejected its arguments (exit status 2)")
    return Failure("exited", f"worker exited with status {returncode}")


def hung_failure(seconds: float, during: str) -> Failure:
    """A worker that did not answer /health in time; `during` says when (start, health check)."""
    return Failure("hung", f"no /health answer within {seconds:g} s during {during}")
