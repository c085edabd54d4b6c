"""Idempotency-Key rules (as Stripe and the IETF draft define them): within the retention window, the same key
with the same body returns the stored answer, with a different body is 422, and while the first request with
that key is still running is 409."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from tray_app.contract.vocabulary import ENDED_WITHOUT_ANSWER, FINAL_JOB_STATES

RETENTION_SECONDS = 24 * 3600

Verdict = Literal["new", "replay", "in_progress", "mismatch", "effects_delivered"]


@dataclass(frozen=True)
class KeyRecord:
    job_id: str
    body_hash: str
    created_at: float
    state: str
    effects_delivered: bool = False  # a tool call reached the client before the job ended


class KeyedJob(Protocol):
    """What a job made under a key tells about it, live (Job) or from the journal (StoredJob)."""

    @property
    def id(self) -> str: ...

    @property
    def body_hash(self) -> str: ...

    @property
    def created_at(self) -> float: ...

    @property
    def state(self) -> str: ...

    @property
    def effects_delivered(self) -> bool: ...


def record_of(job: KeyedJob) -> KeyRecord:
    return KeyRecord(job.id, job.body_hash, job.created_at, job.state, job.effects_delivered)


def decide(
    record: KeyRecord | None, body_hash: str, now: float, retention: float = RETENTION_SECONDS
) -> Verdict:
    """What to do with a request carrying a key that `record` (or nothing) already used."""
    if record is None or now - record.created_at > retention:
        return "new"
    if record.body_hash != body_hash:
        return "mismatch"
    if record.state not in FINAL_JOB_STATES:
        return "in_progress"
    if record.state in ENDED_WITHOUT_ANSWER:
        # A request that ended without an answer may be tried again under the same key, unless its tool
        # call already reached the client: running it again could repeat the tool's action.
        return "effects_delivered" if record.effects_delivered else "new"
    return "replay"
