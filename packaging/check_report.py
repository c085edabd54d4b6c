"""The GPU check's one JSON report, phase by phase (`Report`, `PhaseStop`), what comes back from the GPU
machine (`pack_out`: the report and the logs as at most 8 files), and its lines on stderr.

Budgets: each phase has its own (`PHASE_BUDGETS`), whatever the total time limit; the total limit only stops
later phases from starting. The report and the logs are written under $OUT as each phase ends, so a run
killed from outside (the GPU machine's own limit) still says what it reached.

Standard library only: both halves of the check write it (`gpu_check.py` on the machine's Python, the service
phases in the check's own environment)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

MIB = 1024 * 1024

# Seconds per phase, in the order they run. A phase is never given less because the run is late: it starts
# with its whole budget or, once the total limit is spent, not at all (`teardown` always runs).
PHASE_BUDGETS: dict[str, float] = {
    "host": 120,
    "gpu": 30,
    "python_env": 120,
    "engine": 480,  # the carried engine installs in seconds; an on-device CUDA build took 284 s on 16 cores
    "model": 60,
    "probe": 120,
    "smoke": 90,
    "service": 90,
    "planner": 30,
    "watcher": 60,
    "moe": 60,
    "pressure": 150,
    "bench": 180,
    "teardown": 30,
}
ALWAYS = ("teardown",)
# The phases `gpu_check_service.py` runs in the check's environment, after the model and the probe.
SERVICE_PHASES = (
    "smoke",
    "service",
    "planner",
    "watcher",
    "moe",
    "pressure",
    "bench",
    "teardown",
)  # runs even when the total limit is spent: it stops what the check started

# What comes back from the GPU machine: at most 8 files (the device tool's limit), 16 MiB each.
MAX_OUT_FILES = 8
MAX_OUT_FILE_BYTES = 4 * MIB  # a log's last 4 MiB: 8 of them stay well inside 64 MiB
REPORT_NAME = "gpu-check.json"
OUT_PREFIX = "gpu-check-"
MORE_NAME = "gpu-check-more.log"  # every log without a file of its own, each one's end, one after another
# Logs that get a file of their own under $OUT, by their name's start, in this order of preference.
OWN_FILE = ("engine", "probe", "serve", "gpu-worker", "cpu-worker")


def default_report_path() -> Path:
    out = os.environ.get("OUT")
    return Path(out) / REPORT_NAME if out else Path(REPORT_NAME)


class PhaseStop(Exception):
    """A phase ended the check: `status` says how ("no_gpu", "failed", "not_prepared", "out_of_time")."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


class Report:
    """The check's one JSON report, written again after every phase (a killed run leaves what it did)."""

    def __init__(self, path: Path, deadline: float, data: dict[str, Any] | None = None) -> None:
        self.path = path
        self.deadline = deadline  # time.time() after which no phase starts (but teardown)
        self.data: dict[str, Any] = data or {
            "check": "failsoft gpu-check",
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "time_limit_seconds": round(deadline - time.time()),
            "phases": {},
            "problems": [],
            "verdict": "running",
            "log_dirs": [],
        }

    @classmethod
    def load(cls, path: Path, deadline: float) -> Report:
        return cls(path, deadline, json.loads(path.read_text(encoding="utf-8")))

    @property
    def phases(self) -> dict[str, Any]:
        phases: dict[str, Any] = self.data["phases"]
        return phases

    def problem(self, text: str) -> None:
        self.data["problems"].append(text)

    def remaining(self) -> float:
        return self.deadline - time.time()

    def add_log_dirs(self, *folders: Path) -> None:
        """Folders whose `*.log` files go under $OUT with the report, each time it is written."""
        known = self.data.setdefault("log_dirs", [])
        known.extend(str(folder) for folder in folders if str(folder) not in known)

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(self.data, indent=2, default=str), encoding="utf-8")
        partial.replace(self.path)  # never half a report, even if the run is killed now
        out = os.environ.get("OUT")
        if out and self.path.parent.resolve() == Path(out).resolve():
            with contextlib.suppress(OSError):
                pack_out(Path(out), [Path(folder) for folder in self.data.get("log_dirs") or []])

    @contextlib.contextmanager
    def phase(self, name: str, budget: float | None = None) -> Iterator[dict[str, Any]]:
        """Run a phase with its own budget (PHASE_BUDGETS unless given): its entry in the report (to fill),
        its time; an error ends the check. Once the total limit is spent it does not start
        (PhaseStop "out_of_time"), unless it is one that always runs."""
        budget = float(PHASE_BUDGETS.get(name, 60) if budget is None else budget)
        entry: dict[str, Any] = {"status": "running", "budget_seconds": round(budget)}
        self.phases[name] = entry
        if self.remaining() <= 0 and name not in ALWAYS:
            entry["status"] = "not_started"
            entry["seconds"] = 0.0
            entry["message"] = (
                f"not started: the total time limit ({self.data.get('time_limit_seconds')} s) was spent"
            )
            say(f"{name}: {entry['message']}")
            self.write()
            raise PhaseStop("out_of_time", f"{name}: {entry['message']}")
        say(f"{name}: started (budget {budget:.0f} s)")
        self.write()
        started = time.monotonic()
        try:
            yield entry
        except PhaseStop as stop:
            entry["status"] = stop.status
            entry["message"] = str(stop)
            raise
        except Exception as error:
            entry["status"] = "failed"
            entry["message"] = f"{type(error).__name__}: {error}"
            raise PhaseStop("failed", f"{name}: {type(error).__name__}: {error}") from error
        else:
            if entry["status"] == "running":
                entry["status"] = "ok"
        finally:
            entry["seconds"] = round(time.monotonic() - started, 1)
            if entry["seconds"] > entry["budget_seconds"]:
                entry["over_budget"] = True
            say(f"{name}: {entry['status']} in {entry['seconds']} s")
            self.write()

    def phase_budget(self, name: str) -> float:
        return float(self.phases.get(name, {}).get("budget_seconds", 0))


def budget_of(names: Sequence[str]) -> float:
    """The seconds `names` may take together, each its whole budget."""
    return float(sum(PHASE_BUDGETS[name] for name in names))


# ------------------------------------------------------------------------------------------ $OUT
def _tail_bytes(path: Path, limit: int) -> bytes:
    with path.open("rb") as source:
        size = source.seek(0, os.SEEK_END)
        source.seek(max(0, size - limit))
        data = source.read()
    if size > limit:
        data = f"[... the first {size - limit} bytes left out ...]\n".encode() + data
    return data


def log_files(folders: Sequence[Path]) -> list[Path]:
    """Every `*.log` in `folders` (not below them), each once."""
    found: dict[Path, None] = {}
    for folder in folders:
        if folder.is_dir():
            for path in sorted(folder.glob("*.log")):
                if path.is_file():
                    found.setdefault(path.resolve(), None)
    return list(found)


def own_kind(path: Path) -> str | None:
    """The OWN_FILE kind a log belongs to by its name ("gpu-worker" for gpu-worker.log), or None."""
    name = path.name.removeprefix(OUT_PREFIX)
    return next((kind for kind in OWN_FILE if name.startswith(kind)), None)


def _joined(paths: Sequence[Path], limit: int) -> bytes:
    """One log's end, or several logs' ends one after another (each named), within `limit` bytes."""
    if len(paths) == 1:
        return _tail_bytes(paths[0], limit)
    share = max(64 * 1024, limit // len(paths) - 256)
    parts = [f"===== {path} =====\n".encode() + _tail_bytes(path, share) for path in paths]
    return b"\n".join(parts)[-limit:]


def pack_out(out: Path, folders: Sequence[Path], max_files: int = MAX_OUT_FILES) -> list[str]:
    """The logs in `folders` under `out` beside the report, as at most `max_files` files in all (the report
    one of them): the logs of each OWN_FILE kind in a file of their own (`gpu-check-<kind>.log`), every other
    log in one more file, each log's end (4 MiB a file). What it wrote before is replaced; the names it wrote
    are returned."""
    out.mkdir(parents=True, exist_ok=True)
    logs = [path for path in log_files(folders) if path.parent != out.resolve()]
    kinds = [kind for kind in OWN_FILE if any(own_kind(path) == kind for path in logs)]
    single = kinds[: max(0, max_files - 2)]  # the report and the rest take a file each
    wanted: dict[str, bytes] = {}
    for kind in single:
        wanted[f"{OUT_PREFIX}{kind}.log"] = _joined(
            [path for path in logs if own_kind(path) == kind], MAX_OUT_FILE_BYTES
        )
    rest = [path for path in logs if own_kind(path) not in single]
    if rest:
        wanted[MORE_NAME] = _joined(rest, MAX_OUT_FILE_BYTES)
    for old in out.glob(f"{OUT_PREFIX}*"):
        if old.is_file() and old.name not in wanted:
            old.unlink()
    for name, data in wanted.items():
        partial = out / f".{name}.partial"
        partial.write_bytes(data)
        partial.replace(out / name)
    return sorted(wanted)


def say(text: str) -> None:
    print(f"[gpu-check] {text}", file=sys.stderr, flush=True)


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])
