"""Jobs waiting for a person's decision on a slow CPU run, from a `/failsoft/jobs?state=awaiting_approval`
answer. No Qt here: the approvals window and `failsoft approvals` list the same jobs in the same words."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import cast

from tray_app.contract.status import JobSummary
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


def as_job(answer: object) -> JobSummary | None:
    """A `/v1/jobs/{id}` answer as the contract's job summary; None for anything else. Its fields are read
    with `.get`: a job read back from the journal lacks some."""
    return cast(JobSummary, answer) if isinstance(answer, dict) else None


def job_list(answer: object) -> list[JobSummary]:
    """The jobs of a `/failsoft/jobs` answer ({"object": "list", "data": [...]}, or the bare list)."""
    rows = answer.get("data", []) if isinstance(answer, dict) else answer
    return [job for row in rows if (job := as_job(row)) is not None] if isinstance(rows, list) else []


def pending_jobs(answer: object) -> list[PendingJob]:
    """The jobs of a `/failsoft/jobs?state=awaiting_approval` answer, oldest first."""
    jobs = [
        PendingJob(
            job_id=str(job.get("id") or ""),
            estimated_seconds=float(job.get("estimated_seconds") or 0),
            preview=str(job.get("preview") or ""),
            created_at=float(job.get("created_at") or time.time()),
            model=str(job.get("model") or ""),
            stand_in=job.get("stand_in_offer") or None,
        )
        for job in job_list(answer)
    ]
    return sorted(jobs, key=lambda job: job.created_at)
