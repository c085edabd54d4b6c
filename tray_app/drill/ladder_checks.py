"""What scenarios h to j check beyond the route decision (pure): an unloaded model's worker is gone, a busy
one kept its stream, the job record names the models the answer named, and a stream outlived its request."""

from __future__ import annotations

from typing import Any

import psutil

from tray_app.contract.status import WorkerStatus
from tray_app.drill.client import Answer
from tray_app.drill.records import JobTrace


def gone_problems(name: str, pid: int | None, worker: WorkerStatus | None, alive: bool) -> list[str]:
    """What is wrong when `name`'s GPU worker (pid `pid` before) should have been unloaded."""
    if pid is None:
        return [f"{name}'s GPU worker had no pid after loading"]
    problems = []
    if worker and worker.get("state") not in ("stopped", "absent", None):
        problems.append(
            f"{name}'s GPU worker is {worker.get('state')} (pid {worker.get('pid')}), not unloaded"
        )
    if alive:
        problems.append(f"{name}'s GPU worker process {pid} is still running")
    return problems


def kept_problems(
    name: str, pid_before: int | None, worker: WorkerStatus | None, trace: JobTrace | None, role: str
) -> list[str]:
    """What is wrong when `name`'s worker `role` should have kept its stream: its job completed in one
    attempt on that worker, and the worker is the same process, still ready."""
    problems = []
    if trace is None:
        problems.append(f"{name}'s stream has no job record")
    elif trace.state != "completed" or [a.get("worker") for a in trace.attempts] != [role]:
        attempts = ", ".join(trace.attempt_words()) or "none"
        problems.append(f"{name}'s stream: {trace.state}, attempts {attempts} (expected one, on {role})")
    pid_after = (worker or {}).get("pid")
    state = (worker or {}).get("state")
    if pid_before is None or pid_after != pid_before or state != "ready":
        problems.append(f"{name}'s {role} worker: pid {pid_before} before, {pid_after} ({state}) after")
    return problems


def record_problems(failsoft: dict[str, Any] | None, job: dict[str, Any]) -> list[str]:
    """The job record (/v1/jobs/{id}) must name the same model, and the same asked model, as the answer."""
    if not failsoft:
        return []
    problems = []
    for key in ("model", "stand_in_for"):
        if job.get(key) != failsoft.get(key):
            recorded, answered = job.get(key), failsoft.get(key)
            problems.append(
                f"job {job.get('id')}: {key} {recorded!r} in its record, {answered!r} in the answer"
            )
    return problems


def overlap_problem(what: str, stream: Answer, other: Answer) -> list[str]:
    """The stream must still have been running when the other request was answered."""
    if stream.ended_at > other.ended_at and stream.started_at < other.started_at:
        return []
    return [
        f"{what} ended {other.ended_at - stream.ended_at:.2f}s before the request it had to outlive was "
        "answered: this run did not test it (a faster machine needs a longer stream)"
    ]


def pid_alive(pid: int | None) -> bool:
    """A process with this pid runs (a zombie, waiting to be reaped, does not)."""
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
