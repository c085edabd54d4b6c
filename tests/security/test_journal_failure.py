"""Issue 14: a journal write or commit that fails marks the service degraded, says so on the event bus, and
new background jobs get 503 instead of an acceptance the service cannot keep."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.security.conftest import JOB_BODY, StandInService, client_for
from tray_app import paths
from tray_app.contract.events import JournalFailed
from tray_app.jobs.journal import Journal
from tray_app.server.routes import create_app


def test_a_failed_write_makes_flush_false_and_is_reported_once(isolated_dirs: Path) -> None:
    reported: list[str] = []
    journal = Journal(paths.data_dir() / "journal.sqlite3", on_failure=reported.append)
    try:
        assert journal.flush() and journal.failure is None
        journal.add_job({"body": {}, "no_such_column": 1})  # fails as a full disk or a damaged file would
        assert journal.flush() is False
        assert journal.failure is not None and "no_such_column" in journal.failure
        journal.add_job({"no_body": 2})  # not even SQL: the writer thread must survive it too
        assert journal.flush() is False
        assert len(reported) == 1  # sticky, reported once
    finally:
        journal.close()


def _post_job(client: TestClient) -> Any:
    return client.post("/v1/jobs", json=JOB_BODY)


def test_background_jobs_get_503_once_the_journal_failed(service: StandInService, client: TestClient) -> None:
    seen: list[Any] = []
    service.bus.add_listener(seen.append)
    # The stand-in service publishes journal failures the way the real one does.
    service.journal._on_failure = lambda reason: service.bus.publish(JournalFailed(reason=reason))
    assert _post_job(client).status_code == 202
    service.journal.add_job({"body": {}, "no_such_column": 1})
    service.journal.flush()
    refused = _post_job(client)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "60"
    error = refused.json()["error"]
    assert error["code"] == "journal_unavailable" and "no_such_column" in error["message"]
    assert len(service.spawned) == 1  # the refused job never ran
    assert [event.reason for event in seen if isinstance(event, JournalFailed)] == [service.journal.failure]


def test_a_job_whose_write_is_not_confirmed_is_not_accepted(
    service: StandInService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service.journal, "flush", lambda timeout=10.0: False)
    with client_for(create_app(service, manage_lifecycle=False)) as client:  # type: ignore[arg-type]
        refused = _post_job(client)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "journal_unavailable"
    (job_id,) = service.spawned
    job = service.registry.get(job_id)
    assert job is not None and job.state == "failed"
