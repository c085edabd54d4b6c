"""The journal: schema versions and migrations, batched writes, and what a restart finds unfinished."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tray_app.jobs import journal
from tray_app.jobs.journal import SCHEMA_VERSION, Journal, connect, migrate, schema_version
from tray_app.jobs.journal_owner import JournalInUse, JournalOwner


def _job(job_id: str, state: str = "queued", key: str | None = None) -> dict[str, object]:
    now = time.time()
    return {
        "id": job_id,
        "request_id": f"req-{job_id}",
        "idempotency_key": key,
        "body_hash": "hash",
        "kind": "chat",
        "stream": 0,
        "background": 1,
        "body": {"messages": [{"role": "user", "content": "hi"}], "seed": 7},
        "route": "gpu",
        "state": state,
        "attempts": 0,
        "created_at": now,
        "updated_at": now,
        "seed": 7,
    }


def test_a_new_journal_is_at_the_latest_version_in_wal_mode(tmp_path: Path) -> None:
    store = Journal(tmp_path / "j.sqlite3")
    try:
        connection = connect(tmp_path / "j.sqlite3")
        assert schema_version(connection) == SCHEMA_VERSION
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        connection.close()
    finally:
        store.close()


def test_an_old_journal_is_migrated_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    connection = connect(path)
    assert migrate(connection, target=1) == 1
    connection.execute(
        "INSERT INTO jobs (id, request_id, body_hash, kind, stream, background, body, state, created_at, "
        "updated_at) VALUES ('job-old', 'req', 'h', 'chat', 0, 1, '{\"messages\": []}', 'queued', 1, 1)"
    )
    connection.close()
    store = Journal(path)  # opening migrates to the current version
    try:
        assert schema_version(connect(path)) == SCHEMA_VERSION
        old = store.job("job-old")
        assert old is not None and old.state == "queued" and old.seed is None
    finally:
        store.close()


def test_a_journal_from_a_newer_program_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite3"
    connection = connect(path)
    migrate(connection)
    connection.execute("INSERT INTO schema_migrations VALUES (?, ?)", (SCHEMA_VERSION + 1, time.time()))
    try:
        migrate(connection)
    except RuntimeError as error:
        assert "newer" in str(error)
    else:
        raise AssertionError("a newer schema must not be opened")
    connection.close()


def test_jobs_attempts_and_results_round_trip(tmp_path: Path) -> None:
    store = Journal(tmp_path / "j.sqlite3")
    try:
        store.add_job(_job("job-1", key="key-1"))
        store.start_attempt("job-1", 1, "gpu", time.time())
        store.end_attempt("job-1", 1, "failed", "oom_decode: llama_decode returned -2")
        store.start_attempt("job-1", 2, "cpu", time.time())
        store.end_attempt("job-1", 2, "completed")
        store.update_job("job-1", state="completed", worker="cpu", attempts=2, result={"choices": []})
        assert store.flush()
        stored = store.job("job-1")
        assert stored is not None
        assert (stored.state, stored.worker, stored.attempts, stored.result) == (
            "completed",
            "cpu",
            2,
            {"choices": []},
        )
        assert [a["outcome"] for a in store.attempts("job-1")] == ["failed", "completed"]
        assert store.job_by_key("key-1", since=0) is not None
        assert store.job_by_key("key-1", since=time.time() + 10) is None
    finally:
        store.close()


def test_an_attempts_error_can_be_named_later_and_keeps_its_end_time(tmp_path: Path) -> None:
    store = Journal(tmp_path / "j.sqlite3")
    try:
        store.add_job(_job("job-1"))
        store.start_attempt("job-1", 1, "gpu", time.time())
        store.end_attempt("job-1", 1, "failed", "exited: the worker closed the connection")
        assert store.flush()
        (before,) = store.attempts("job-1")
        store.set_attempt_error("job-1", 1, "crash_abort: worker crashed (SIGABRT)")
        assert store.flush()
        (after,) = store.attempts("job-1")
        assert after["error"] == "crash_abort: worker crashed (SIGABRT)"
        assert (after["outcome"], after["ended_at"]) == ("failed", before["ended_at"])
    finally:
        store.close()


def test_unfinished_jobs_are_found_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    store = Journal(path)
    for job_id, state in [("a", "queued"), ("b", "running"), ("c", "completed"), ("d", "awaiting_approval")]:
        store.add_job(_job(job_id, state))
    store.close()  # closing commits what was queued
    reopened = Journal(path)
    try:
        assert [job.id for job in reopened.unfinished()] == ["a", "b", "d"]
        assert reopened.unfinished()[0].body["seed"] == 7
    finally:
        reopened.close()


def test_a_bad_write_does_not_lose_the_batch(tmp_path: Path) -> None:
    store = Journal(tmp_path / "j.sqlite3")
    try:
        store.add_job(_job("x"))
        store.add_job(_job("x"))  # duplicate primary key: fails alone
        store.add_job(_job("y"))
        assert store.flush() is False  # a lost write is reported: the service is degraded from now on
        assert store.job("x") is not None and store.job("y") is not None  # the rest of the batch was kept
        assert store.failure is not None and "IntegrityError" in store.failure
    finally:
        store.close()


def test_migrations_are_append_only_sql() -> None:
    # Every migration applies cleanly on top of the previous ones.
    connection = sqlite3.connect(":memory:")
    connection.isolation_level = None
    assert migrate(connection) == len(journal.MIGRATIONS)


def test_a_journal_has_one_owner_until_it_closes(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    first = Journal(path)
    try:
        with pytest.raises(JournalInUse) as refused:
            Journal(path)
        message = str(refused.value)
        assert f"(pid {os.getpid()})" in message and str(path) in message
        assert "FAILSOFT_DATA_DIR" in message
    finally:
        first.close()
    second = Journal(path)  # the owner closed: the journal is free
    second.close()


def test_a_journal_that_cannot_open_keeps_no_lock(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    path.write_bytes(b"this is not a database, and it is long enough for SQLite to say so" * 20)
    with pytest.raises(sqlite3.DatabaseError):
        Journal(path)
    owner = JournalOwner.claim(path)  # nothing held it
    owner.release()


def test_the_owner_lock_ends_with_the_owning_process(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    code = (
        "import sys, pathlib\n"
        "from tray_app.jobs.journal_owner import JournalOwner\n"
        "owner = JournalOwner.claim(pathlib.Path(sys.argv[1]))\n"
        "print('claimed', flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "claimed"
        with pytest.raises(JournalInUse, match=f"pid {child.pid}"):
            JournalOwner.claim(path)
        child.kill()  # no clean exit: the kernel ends the lock
        child.wait(timeout=10)
        JournalOwner.claim(path).release()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
