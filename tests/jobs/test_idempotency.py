"""Idempotency-Key decisions (Stripe / IETF draft semantics)."""

from __future__ import annotations

import pytest

from tray_app.jobs.idempotency import RETENTION_SECONDS, KeyRecord, decide

NOW = 1_000_000.0


@pytest.mark.parametrize(
    ("record", "body_hash", "expected"),
    [
        (None, "h1", "new"),
        (KeyRecord("job-1", "h1", NOW - 10, "completed"), "h1", "replay"),
        (KeyRecord("job-1", "h1", NOW - 10, "completed"), "h2", "mismatch"),
        (KeyRecord("job-1", "h1", NOW - 10, "running"), "h1", "in_progress"),
        (KeyRecord("job-1", "h1", NOW - 10, "queued"), "h1", "in_progress"),
        (KeyRecord("job-1", "h1", NOW - 10, "awaiting_approval"), "h1", "in_progress"),
        (KeyRecord("job-1", "h1", NOW - 10, "running"), "h2", "mismatch"),
        (KeyRecord("job-1", "h1", NOW - RETENTION_SECONDS - 1, "completed"), "h2", "new"),
        (KeyRecord("job-1", "h1", NOW - 10, "failed"), "h1", "new"),
        (KeyRecord("job-1", "h1", NOW - 10, "cancelled"), "h1", "new"),
        (KeyRecord("job-1", "h1", NOW - 10, "failed", effects_delivered=True), "h1", "effects_delivered"),
        (KeyRecord("job-1", "h1", NOW - 10, "cancelled", effects_delivered=True), "h1", "effects_delivered"),
        (KeyRecord("job-1", "h1", NOW - 10, "failed", effects_delivered=True), "h2", "mismatch"),
    ],
)
def test_decide(record: KeyRecord | None, body_hash: str, expected: str) -> None:
    assert decide(record, body_hash, NOW) == expected
