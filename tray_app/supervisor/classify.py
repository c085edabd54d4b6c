"""What a worker failure was, from how its process ended and the last lines it printed.

Pure: no processes here, so the table of cases is unit-tested directly. The kinds are the contract with the
router and the UI (tray_app.contract.vocabulary.FAILURE_KINDS).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from tray_app.contract.vocabulary import FAILURE_KINDS, FailureKind
from tray_app.supervisor import signatures
from tray_app.supervisor.failed_allocation import FailedAllocation

__all__ = ["FAILURE_KINDS", "Failure", "FailureKind", "classify_exit"]

# Signals that mean the process crashed (llama.cpp's GGML_ABORT and CUDA errors end in SIGABRT).
_CRASH_SIGNALS = {signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL}


@dataclass(frozen=True)
class Failure:
    kind: FailureKind
    message: str
    # oom_load: the allocation that failed and what the load had reached, where llama.cpp printed its size
    allocation: FailedAllocation | None = None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# llama.cpp's log prefix: elapsed time and level ("0.00.075.895 E ").
_LOG_PREFIX = re.compile(r"^\d+\.\d+\.\d+\.\d+ [A-Z] ")


def _text(line: str) -> str:
    return _LOG_PREFIX.sub("", line.strip())


def _matching_line(lines: Sequence[str]) -> tuple[FailureKind, str] | None:
    """The first kind (signatures.LOAD, in order) that any load line matches, with the first such line."""
    for kind, table in signatures.LOAD:
        for line in lines:
            text = _text(line)
            if signatures.match(table, text) is not None:
                return kind, text
    return None


def _fatal_cause(lines: Sequence[str]) -> str:
    """What a crashed worker's last lines say caused it (signatures.FATAL; the first, most specific entry
    that matches any line), or ""."""
    texts = [_text(line) for line in lines]
    for signature in signatures.FATAL:
        for text in texts:
            if signature.pattern.search(text):
                return f"{signature.what}: {text}"
    return ""


def classify_exit(returncode: int | None, load_log: Sequence[str], tail: Sequence[str] = ()) -> Failure:
    """The failure a worker process ended with: first how it ended (`returncode` as subprocess reports it,
    -N for signal N), then, for an exit status, what its load log said (never what it printed later, which
    can quote a request's own text). A crash's message names its cause when its last lines (`tail`) show
    a backend's fatal error; the kind stays the signal's."""
    if returncode is not None and returncode < 0:
        number = -returncode
        name = _signal_name(number)
        if number in _CRASH_SIGNALS:
            cause = _fatal_cause(tail)
            return Failure("crash_abort", f"worker crashed ({name})" + (f" after {cause}" if cause else ""))
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
