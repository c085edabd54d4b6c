"""A request sent again under its Idempotency-Key: the job made under that key (live, or from the journal for
a day), and what the rules (jobs.idempotency) make of it: the stored answer, the background job already made,
or a refusal that names why."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tray_app.contract.status import JobSummary
from tray_app.jobs import idempotency
from tray_app.jobs.journal import Journal, StoredJob
from tray_app.jobs.registry import Job, JobRegistry, stored_summary
from tray_app.jobs.routing import refused


@dataclass(frozen=True)
class Replay:
    """What an Idempotency-Key says about a request: answer with a stored result, or it is new."""

    job_id: str
    result: dict[str, Any]
    read_token: str = ""  # the same client asking again (same key, same body) gets the same token


@dataclass(frozen=True)
class Accepted:
    """A background job's answer to `POST /v1/jobs`: its summary, 202 (accepted, or still running) or 200
    (an earlier request's, completed); `job` is set when this request made it."""

    summary: JobSummary
    status: int
    job_id: str
    request_id: str
    job: Job | None = None
    read_token: str = ""  # what its creator reads it back with


# A key used again, by verdict: (status, code, what went wrong). "{key}" and "{job_id}" are filled in.
_REUSE_REFUSALS: dict[str, tuple[int, str, str]] = {
    "effects_delivered": (
        409,
        "idempotency_key_effects_delivered",
        "the request with Idempotency-Key {key!r} (job {job_id}) failed after its tool call reached the "
        "client, so the tool's action may have run; it is not run again under this key. Send a new "
        "Idempotency-Key to run it again.",
    ),
    "mismatch": (422, "idempotency_key_reused", "Idempotency-Key {key!r} was used with a different request"),
    "in_progress": (
        409,
        "idempotency_key_in_progress",
        "a request with Idempotency-Key {key!r} is still running (job {job_id})",
    ),
}


class Keys:
    """The jobs made under Idempotency-Keys, as a repeated request finds them."""

    def __init__(self, registry: JobRegistry, journal: Journal) -> None:
        self.registry = registry
        self.journal = journal

    def made_under(self, key: str) -> tuple[Job | None, StoredJob | None]:
        """The latest job made under this Idempotency-Key: live, or else from the journal (24 h)."""
        live = self.registry.by_key(key)
        if live is not None:
            return live, None
        return None, self.journal.job_by_key(key, time.time() - idempotency.RETENTION_SECONDS)

    def replay(self, key: str, body_hash: str) -> Replay | None:
        """The stored answer for a repeated request, None when it is new under its key; Refused (409, 422)
        when the key is taken by another body, a running job, or a job whose tool call was delivered."""
        used = self._used(key, body_hash)
        if used is None:
            return None
        verdict, job = used
        _refuse_reuse(key, verdict, job.id, background=None)
        return Replay(job.id, job.result, job.read_token) if job.result is not None else None

    def existing_background(self, key: str, body_hash: str) -> Accepted | None:
        """The rules chat uses (idempotency.decide): the same key and body give the job already made under
        it (202 while it is unfinished, 200 once completed; never a second job), another body is 422; a
        key whose job ended without an answer may make a new one."""
        used = self._used(key, body_hash)
        if used is None:
            return None
        verdict, job = used
        _refuse_reuse(key, verdict, job.id, background=job.background)
        if isinstance(job, Job):
            summary = job.summary()
        else:
            summary = stored_summary(job, self.journal.attempts(job.id))
        status = 202 if verdict == "in_progress" else 200
        # The same key and body: the same client asking again, who gets the same read token.
        return Accepted(summary, status, job.id, summary["request_id"], None, job.read_token)

    def _used(self, key: str, body_hash: str) -> tuple[str, Job | StoredJob] | None:
        """The rules' verdict on a key a job was made under, with that job (live or stored); None when the
        key is new (never used, or used longer ago than the journal keeps keys)."""
        live, stored = self.made_under(key)
        previous = live or stored
        if previous is None:
            return None
        verdict = idempotency.decide(idempotency.record_of(previous), body_hash, time.time())
        return None if verdict == "new" else (verdict, previous)


def _refuse_reuse(key: str, verdict: str, job_id: str, background: bool | None) -> None:
    """Refused when a repeated request may not have the job made under its key. `background`: None for an
    interactive request (a running job is 409 to it), else whether that job is a background one (a
    background request finds a running one, and may not take an interactive one)."""
    if verdict == "effects_delivered" or (verdict == "in_progress" and background is None):
        status, code, message = _REUSE_REFUSALS[verdict]
    elif verdict == "mismatch" or background is False:
        status, code, message = _REUSE_REFUSALS["mismatch"]
        message += " body" if background is None else "" if background else " (not a background job)"
    else:
        return
    raise refused(
        status,
        code,
        message.format(key=key, job_id=job_id),
        type="invalid_request_error",
        param="Idempotency-Key",
        **({"retry_after": 1} if verdict == "in_progress" else {}),
    )
