"""The GPU check's one JSON report, phase by phase (`Report`, `PhaseStop`), and its lines on stderr.

Standard library only: both halves of the check write it (`gpu_check.py` on the machine's Python, the service
phases in the check's own environment)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MIB = 1024 * 1024


def default_report_path() -> Path:
    out = os.environ.get("OUT")
    return Path(out) / "gpu-check.json" if out else Path("gpu-check.json")


class PhaseStop(Exception):
    """A phase ended the check: `status` says how ("no_gpu", "failed", "not_prepared")."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


class Report:
    """The check's one JSON report, written again after every phase (a killed run leaves what it did)."""

    def __init__(self, path: Path, deadline: float, data: dict[str, Any] | None = None) -> None:
        self.path = path
        self.deadline = deadline  # time.time() by which everything must be over
        self.data: dict[str, Any] = data or {
            "check": "failsoft gpu-check",
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "time_limit_seconds": round(deadline - time.time()),
            "phases": {},
            "problems": [],
            "verdict": "running",
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

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2, default=str), encoding="utf-8")

    @contextlib.contextmanager
    def phase(self, name: str, budget: float) -> Iterator[dict[str, Any]]:
        """Run a phase: its entry in the report (to fill), its time and budget; an error ends the check."""
        budget = max(1.0, min(budget, self.remaining()))
        entry: dict[str, Any] = {"status": "running", "budget_seconds": round(budget)}
        self.phases[name] = entry
        say(f"{name}: started (budget {budget:.0f} s)")
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


def say(text: str) -> None:
    print(f"[gpu-check] {text}", file=sys.stderr, flush=True)


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])
