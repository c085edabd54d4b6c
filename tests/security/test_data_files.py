"""Issue 14, data: the journal kept every prompt and answer forever, world-readable (journal and WAL 0644, the
config with api_key 0644). Now: data folder 0700, journal and companions 0600, config 0600, retention."""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tray_app import config, paths
from tray_app.jobs.journal import Journal


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def open_umask() -> Iterator[None]:
    """The usual desktop umask (022): what made the files 0644 before."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_the_data_and_log_folders_are_private(isolated_dirs: Path) -> None:
    assert mode(paths.data_dir()) == 0o700
    assert mode(paths.log_dir()) == 0o700


def test_an_existing_open_data_folder_is_narrowed(isolated_dirs: Path) -> None:
    folder = isolated_dirs / "data"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    assert paths.data_dir() == folder
    assert mode(folder) == 0o700


def test_the_journal_and_its_wal_and_shm_are_0600(isolated_dirs: Path) -> None:
    path = paths.data_dir() / "journal.sqlite3"
    journal = Journal(path)
    try:
        journal.add_job(job_row("job-1", "completed", time.time()))
        assert journal.flush()
        files = [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]
        for file in files:
            assert file.exists(), file
            assert mode(file) == 0o600, (file, oct(mode(file)))
    finally:
        journal.close()


def test_an_existing_open_journal_is_narrowed(isolated_dirs: Path) -> None:
    path = paths.data_dir() / "journal.sqlite3"
    sqlite3.connect(path).close()
    wal = path.with_name(path.name + "-wal")
    wal.write_bytes(b"")
    os.chmod(path, 0o644)
    os.chmod(wal, 0o644)
    Journal(path).close()
    assert mode(path) == 0o600
    if wal.exists():
        assert mode(wal) == 0o600


def test_the_config_is_written_0600(isolated_dirs: Path) -> None:
    path = isolated_dirs / "conf" / "config.toml"
    cfg = config.from_dict({"server": {"api_key": "s3cret"}}, source=str(path))
    config.save(cfg)
    assert mode(path) == 0o600
    assert mode(path.parent) == 0o700
    assert config.load(path).server.api_key == "s3cret"
    os.chmod(path, 0o644)
    config.save(cfg)  # rewriting narrows it again
    assert mode(path) == 0o600
    assert not [p for p in path.parent.iterdir() if p.name != "config.toml"]  # no temporary file left


def test_an_open_config_holding_a_key_is_narrowed_on_load(isolated_dirs: Path) -> None:
    path = isolated_dirs / "config.toml"
    path.write_text('[server]\napi_key = "s3cret"\n')
    os.chmod(path, 0o644)
    assert config.load(path).server.api_key == "s3cret"
    assert mode(path) == 0o600


def test_saving_through_a_symlink_keeps_the_link(isolated_dirs: Path) -> None:
    target = isolated_dirs / "dotfiles" / "failsoft.toml"
    target.parent.mkdir()
    target.write_text("")
    link = isolated_dirs / "config.toml"
    link.symlink_to(target)
    config.save(config.from_dict({"server": {"api_key": "k"}}, source=str(link)))
    assert link.is_symlink()
    assert "api_key" in target.read_text()
    assert mode(target) == 0o600


# --------------------------------------------------------------------------------------------- retention
def job_row(job_id: str, state: str, updated_at: float) -> dict[str, object]:
    return {
        "id": job_id,
        "request_id": "r",
        "idempotency_key": None,
        "body_hash": "h",
        "kind": "chat",
        "stream": 0,
        "background": 1,
        "body": {"messages": [{"role": "user", "content": "private prompt"}]},
        "route": "gpu",
        "state": state,
        "attempts": 1,
        "created_at": updated_at,
        "updated_at": updated_at,
    }


def stored_ids(path: Path) -> set[str]:
    with sqlite3.connect(path) as connection:
        return {row[0] for row in connection.execute("SELECT id FROM jobs")}


def test_retention_deletes_old_finished_jobs_and_keeps_unfinished_ones(isolated_dirs: Path) -> None:
    path = paths.data_dir() / "journal.sqlite3"
    journal = Journal(path, retention_days=30, max_jobs=0)
    try:
        old = time.time() - 31 * 86400
        journal.add_job(job_row("old-done", "completed", old))
        journal.add_job(job_row("old-failed", "failed", old))
        journal.add_job(job_row("old-waiting", "awaiting_approval", old))
        journal.add_job(job_row("new-done", "completed", time.time()))
        journal.start_attempt("old-done", 1, "gpu", old)
        journal.cleanup()
        assert journal.flush()
        assert stored_ids(path) == {"old-waiting", "new-done"}
        assert journal.attempts("old-done") == []
    finally:
        journal.close()


def test_the_row_cap_keeps_the_newest_finished_jobs(isolated_dirs: Path) -> None:
    path = paths.data_dir() / "journal.sqlite3"
    journal = Journal(path, retention_days=0, max_jobs=2)
    try:
        now = time.time()
        for number in range(5):
            journal.add_job(job_row(f"done-{number}", "completed", now - 100 + number))
        journal.add_job(job_row("running", "running", now - 1000))
        journal.cleanup()
        assert journal.flush()
        assert stored_ids(path) == {"done-3", "done-4", "running"}
    finally:
        journal.close()


def test_retention_runs_at_start_and_follows_set_retention(isolated_dirs: Path) -> None:
    path = paths.data_dir() / "journal.sqlite3"
    first = Journal(path, retention_days=0, max_jobs=0)
    first.add_job(job_row("ancient", "completed", time.time() - 400 * 86400))
    first.add_job(job_row("week-old", "completed", time.time() - 7 * 86400))
    first.flush()
    first.close()
    assert stored_ids(path) == {"ancient", "week-old"}
    second = Journal(path)  # the defaults: 30 days
    try:
        second.flush()
        assert stored_ids(path) == {"week-old"}
        second.set_retention(1, 0)
        deadline = time.monotonic() + 5
        while stored_ids(path) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stored_ids(path) == set()
    finally:
        second.close()


def test_journal_retention_config() -> None:
    cfg = config.from_dict({"journal": {"retention_days": 7, "max_jobs": 500}})
    assert (cfg.journal.retention_days, cfg.journal.max_jobs) == (7.0, 500)
    assert config.Config().journal.retention_days == 30.0
    with pytest.raises(config.ConfigError, match=r"journal\.max_jobs"):
        config.from_dict({"journal": {"max_jobs": -1}})
