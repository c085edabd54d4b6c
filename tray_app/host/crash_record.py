"""How the service's previous run ended, told by the run after it: "the service restarted after a crash at
HH:MM (signal 11)", in the status, the tray and `failsoft status`.

A run writes a marker file once it owns the data folder (the journal's lock) and removes it when it stops
cleanly; a marker found at start is a run that did not. `faulthandler` writes a crashing run's Python stack
to the crash log, whose fatal-error line names the signal; a parent that restarts the service (the tray)
also passes what it saw (FAILSOFT_PREVIOUS_EXIT, the child's exit status: negative for a signal), which
names a SIGKILL that no stack can.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tray_app.contract.status import CrashNote, ServiceRun
from tray_app.view.service_run import crash_line

log = logging.getLogger(__name__)

MARKER_FILE = "service-run.json"
CRASH_LOG = "service-crash.log"
PREVIOUS_EXIT_ENV = "FAILSOFT_PREVIOUS_EXIT"  # set by a parent that restarts the service after it died
RESTARTED_BY_ENV = "FAILSOFT_RESTARTED_BY"
STACK_LINES_LOGGED = 60
# faulthandler's "Fatal Python error: <name>" for the signals it handles.
FATAL_SIGNALS = {
    "Segmentation fault": 11,
    "Aborted": 6,
    "Bus error": 7,
    "Floating-point exception": 8,
    "Illegal instruction": 4,
}


def enable_crash_stacks(log_dir: Path) -> IO[str] | None:
    """faulthandler on, writing to the crash log (from the first moment of `failsoft serve`): a native
    crash leaves the Python stack of every thread there. None when the file cannot be opened."""
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        stream = open(log_dir / CRASH_LOG, "a", encoding="utf-8")  # noqa: SIM115 - open for the whole run
    except OSError as error:
        log.warning("no crash log (%s): a crash's stack goes to stderr", error)
        faulthandler.enable(all_threads=True)
        return None
    faulthandler.enable(file=stream, all_threads=True)
    return stream


@dataclass
class RunRecord:
    """This run, and how the one before it ended (None: cleanly, or there was none)."""

    marker: Path | None  # None: a service run in-process (tests), which marks nothing
    crash_log: Path
    pid: int = field(default_factory=os.getpid)
    started_at: float = field(default_factory=time.time)
    previous: CrashNote | None = None

    def view(self) -> ServiceRun:
        return ServiceRun(pid=self.pid, started_at=self.started_at, restarted_after_crash=self.previous)

    def end(self) -> None:
        """A clean stop: the next run finds no marker."""
        if self.marker is not None:
            with contextlib.suppress(FileNotFoundError):
                self.marker.unlink()


def begin_run(data_dir: Path, log_dir: Path, env: Mapping[str, str] = os.environ) -> RunRecord:
    """Read how the previous run ended, then mark this one as running. Call it once this process owns the
    data folder, so the marker read is the previous run's, not a running one's."""
    record = RunRecord(data_dir / MARKER_FILE, log_dir / CRASH_LOG)
    marker = record.marker = data_dir / MARKER_FILE
    record.previous = previous_crash(marker, record.crash_log, env)
    if record.previous is not None:
        log.warning("%s", crash_line(record.previous))
        _log_stack(record.previous)
    size = _size(record.crash_log)
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(
            json.dumps(
                {
                    "pid": record.pid,
                    "started_at": record.started_at,
                    "crash_log": str(record.crash_log),
                    "crash_log_bytes": size,
                }
            )
        )
    except OSError as error:
        log.warning("cannot mark this run in %s: %s (a crash will not be reported)", marker, error)
    return record


def previous_crash(marker: Path, crash_log: Path, env: Mapping[str, str]) -> CrashNote | None:
    parent_saw = _int(env.get(PREVIOUS_EXIT_ENV))
    restarted_by = env.get(RESTARTED_BY_ENV) or ("systemd" if env.get("INVOCATION_ID") else None)
    try:
        left = json.loads(marker.read_text())
    except (OSError, ValueError):
        left = None
    if not isinstance(left, dict):
        left = None
    if left is None and not parent_saw:
        return None  # a clean stop before (or a first start), and nobody saw a crash
    signal_number: int | None = -parent_saw if parent_saw and parent_saw < 0 else None
    exit_code = parent_saw if parent_saw and parent_saw > 0 else None
    stack = None
    if left is not None:
        crash_log = Path(str(left.get("crash_log") or crash_log))  # that run's, wherever its logs went
        stack = _new_text(crash_log, _int(left.get("crash_log_bytes")) or 0)
        if signal_number is None and exit_code is None and stack:
            signal_number = fatal_signal(stack)
    at = time.time()
    with contextlib.suppress(OSError):
        at = crash_log.stat().st_mtime if stack else marker.stat().st_mtime if left is not None else at
    pid = _int(left.get("pid")) if left is not None else None
    return CrashNote(
        at=at,
        signal=signal_number,
        exit_code=exit_code,
        pid=pid,
        stack_log=str(crash_log) if stack else None,
        restarted_by=restarted_by,
    )


def fatal_signal(stack_text: str) -> int | None:
    """The signal named by the last "Fatal Python error: ..." line of faulthandler's output."""
    for line in reversed(stack_text.splitlines()):
        if line.startswith("Fatal Python error: "):
            name = line.removeprefix("Fatal Python error: ").strip()
            return FATAL_SIGNALS.get(name)
    return None


def _log_stack(note: CrashNote) -> None:
    if note["stack_log"] is None:
        return
    try:
        lines = Path(note["stack_log"]).read_text(errors="replace").splitlines()
    except OSError:
        return
    log.warning("the crashed run's stack (%s):\n%s", note["stack_log"], "\n".join(last_crash(lines)))


def last_crash(lines: list[str]) -> list[str]:
    """The last crash in a crash log, from its "Fatal Python error" line (which names the signal) on.

    Many threads make a long report; its head names the signal and the crashing thread, so that is kept.
    """
    starts = [index for index, line in enumerate(lines) if line.startswith("Fatal Python error: ")]
    first = starts[-1] if starts else max(0, len(lines) - STACK_LINES_LOGGED)
    shown = lines[first : first + STACK_LINES_LOGGED]
    left_out = len(lines) - first - len(shown)
    return [*shown, f"... {left_out} more lines in the file"] if left_out > 0 else shown


def _new_text(path: Path, offset: int) -> str:
    """What was written to `path` after its first `offset` bytes."""
    try:
        with open(path, "rb") as stream:
            stream.seek(offset)
            return stream.read(1 << 20).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _int(value: object) -> int | None:
    try:
        return int(str(value)) if value not in (None, "") else None
    except ValueError:
        return None
