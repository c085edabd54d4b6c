"""Jobs waiting for a person's decision on a slow CPU run, from a `/failsoft/jobs?state=awaiting_approval`
answer. No Qt here: the approvals window and `failsoft approvals` list the same jobs in the same words."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tray_app.view.state import format_duration


@dataclass(frozen=True)
class PendingJob:
    job_id: str
    estimated_seconds: float
    preview: str
    created_at: float
    model: str = ""  # the model asked for (its CPU run waits for approval)
    stand_in: str | None = None  # a smaller model the user may pick instead: it answers on the GPU now

    def choice(self) -> str:
        """The approval's question in words: the big model on the CPU in about N s, or the small one now."""
        cpu = format_duration(self.estimated_seconds) if self.estimated_seconds else "an unknown time"
        if not self.stand_in:
            return f"{self.model or 'the model'} on the CPU in about {cpu}"
        return f"{self.stand_in} on the GPU now, or {self.model or 'the model'} on the CPU in about {cpu}?"


def _first(job: dict[str, Any], *names: str) -> Any:
    for name in names:
        if job.get(name) is not None:
            return job[name]
    return None


def job_list(answer: object) -> list[dict[str, Any]]:
    rows = answer.get("data", []) if isinstance(answer, dict) else answer
    return [row for row in rows if isinstance(row, dict)] if isinstance(rows, list) else []


def pending_jobs(answer: object) -> list[PendingJob]:
    """The jobs of a `/failsoft/jobs?state=awaiting_approval` answer: {"object": "list", "data": [...]}."""
    rows = job_list(answer)
    jobs = []
    for job in rows:
        jobs.append(
            PendingJob(
                job_id=str(_first(job, "job_id", "id") or ""),
                estimated_seconds=float(_first(job, "estimated_seconds", "estimated_cpu_seconds") or 0),
                preview=str(_first(job, "preview", "prompt_preview") or ""),
                created_at=float(_first(job, "created_at", "created", "queued_at") or time.time()),
                model=str(job.get("model") or ""),
                stand_in=job.get("stand_in_offer") or None,
            )
        )
    return sorted(jobs, key=lambda job: job.created_at)
