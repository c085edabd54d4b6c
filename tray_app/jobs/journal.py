"""The durable journal: SQLite in WAL mode with a versioned schema (jobs, attempts, results).

Writes go through one writer thread that batches them into a transaction, so the response path only puts a
tuple on a queue. `flush()` waits until everything queued so far is committed (used where durability must
come before the answer, e.g. accepting a background job).

The journal holds prompts and answers: the file and its -wal/-shm companions are 0600 (the data folder is
0700, see paths), deleted rows are overwritten (secure_delete), and finished jobs are deleted after the
retention time or beyond a row cap (`journal.retention_days`, `journal.max_jobs`), checked at start and then
every CLEANUP_INTERVAL seconds by the writer thread. Unfinished jobs are never deleted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tray_app.contract.vocabulary import UNFINISHED_JOB_STATES
from tray_app.jobs.journal_owner import JournalOwner

# Each entry moves the schema one version up; never edit an entry once released, append a new one.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        request_id TEXT NOT NULL,
        idempotency_key TEXT,
        body_hash TEXT NOT NULL,
        kind TEXT NOT NULL,
        stream INTEGER NOT NULL,
        background INTEGER NOT NULL,
        body TEXT NOT NULL,
        route TEXT,
        state TEXT NOT NULL,
        worker TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        fallback_reason TEXT,
        error TEXT,
        result TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE attempts (
        job_id TEXT NOT NULL REFERENCES jobs(id),
        number INTEGER NOT NULL,
        worker TEXT NOT NULL,
        started_at REAL NOT NULL,
        ended_at REAL,
        outcome TEXT,
        error TEXT,
        PRIMARY KEY (job_id, number)
    );
    """,
    """
    CREATE INDEX jobs_by_key ON jobs(idempotency_key) WHERE idempotency_key IS NOT NULL;
    CREATE INDEX jobs_by_state ON jobs(state);
    ALTER TABLE jobs ADD COLUMN estimated_seconds REAL;
    ALTER TABLE jobs ADD COLUMN seed INTEGER;
    """,
    # A tool call reached the client before the job ended: a retry under its Idempotency-Key is refused.
    "ALTER TABLE jobs ADD COLUMN effects_delivered INTEGER NOT NULL DEFAULT 0;",
    # Who may read the job back: the token its creator got (jobs made before it have none: admin only).
    "ALTER TABLE jobs ADD COLUMN read_token TEXT NOT NULL DEFAULT '';",
)
SCHEMA_VERSION = len(MIGRATIONS)
UNFINISHED = UNFINISHED_JOB_STATES
RETENTION_DAYS = 30.0
MAX_JOBS = 100_000
CLEANUP_INTERVAL = 3600.0
COMPANIONS = ("", "-wal", "-shm", "-journal")
log = logging.getLogger(__name__)

_JOB_FIELDS = (
    "effects_delivered",
    "route",
    "state",
    "worker",
    "attempts",
    "fallback_reason",
    "error",
    "result",
    "estimated_seconds",
)


def make_private(path: Path) -> None:
    """Create the journal file 0600 if it is missing, and narrow it and its companions to 0600.

    SQLite creates -wal and -shm with the main file's permissions, so a 0600 main file keeps them 0600."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(descriptor)
    for suffix in COMPANIONS:
        companion = path.with_name(path.name + suffix)
        with contextlib.suppress(FileNotFoundError):
            if companion.stat().st_mode & 0o077:
                os.chmod(companion, 0o600)


def connect(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    connection.execute("PRAGMA secure_delete=ON")  # deleted prompts do not linger in free pages
    connection.row_factory = sqlite3.Row
    return connection


def schema_version(connection: sqlite3.Connection) -> int:
    connection.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL)"
    )
    row = connection.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
    return int(row[0] or 0)


def migrate(connection: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Apply the migrations above the current version, each in one transaction; returns the new version."""
    current = schema_version(connection)
    if current > SCHEMA_VERSION:
        raise RuntimeError(
            f"journal schema {current} is newer than this program understands ({SCHEMA_VERSION})"
        )
    for version in range(current + 1, target + 1):
        script = MIGRATIONS[version - 1]
        connection.execute("BEGIN")
        try:
            for statement in (s.strip() for s in script.split(";")):
                if statement:
                    connection.execute(statement)
            connection.execute("INSERT INTO schema_migrations VALUES (?, ?)", (version, time.time()))
            connection.execute("COMMIT")
        except sqlite3.Error:
            connection.execute("ROLLBACK")
            raise
    return max(current, target)


@dataclass
class StoredJob:
    """A job as the journal has it (used to resume after a restart and to answer /v1/jobs/{id})."""

    id: str
    request_id: str
    idempotency_key: str | None
    body_hash: str
    kind: str
    stream: bool
    background: bool
    body: dict[str, Any]
    state: str
    worker: str | None
    attempts: int
    fallback_reason: str | None
    error: str | None
    result: dict[str, Any] | None
    created_at: float
    estimated_seconds: float | None
    seed: int | None
    effects_delivered: bool = False
    read_token: str = ""

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> StoredJob:
        return cls(
            id=row["id"],
            request_id=row["request_id"],
            idempotency_key=row["idempotency_key"],
            body_hash=row["body_hash"],
            kind=row["kind"],
            stream=bool(row["stream"]),
            background=bool(row["background"]),
            body=json.loads(row["body"]),
            state=row["state"],
            worker=row["worker"],
            attempts=row["attempts"],
            fallback_reason=row["fallback_reason"],
            error=row["error"],
            result=json.loads(row["result"]) if row["result"] else None,
            created_at=row["created_at"],
            estimated_seconds=row["estimated_seconds"],
            seed=row["seed"],
            effects_delivered=bool(row["effects_delivered"]),
            read_token=row["read_token"],
        )


Operation = Callable[[sqlite3.Connection], Any]


class Journal:
    """The writer thread and the read helpers over one journal file."""

    def __init__(
        self,
        path: Path,
        retention_days: float = RETENTION_DAYS,
        max_jobs: int = MAX_JOBS,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.path = path
        # Written by the writer thread only: the first write or commit that failed. Sticky: a journal that
        # lost a write cannot promise durability again until the service restarts.
        self._failure: str | None = None
        self._on_failure = on_failure
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._owner = JournalOwner.claim(path)  # before anything is read: see journal_owner
        self.retention_days = retention_days
        self.max_jobs = max_jobs
        self._next_cleanup = 0.0  # monotonic time of the next cleanup: the first batch does one
        try:
            make_private(path)
            self._write = connect(path)
            migrate(self._write)
            self._read = connect(path)
        except BaseException:
            self._owner.release()  # a journal that cannot open owns nothing
            raise
        self._read_lock = threading.Lock()
        # SimpleQueue: a put costs the response path far less than Queue's condition variable.
        self._queue: queue.SimpleQueue[Operation | threading.Event | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="failsoft-journal", daemon=True)
        self._thread.start()

    # writes (queued) ------------------------------------------------------------------------------
    # The JSON encoding happens on the writer thread, off the response path; callers never change a body or
    # a result once they handed it over.
    def add_job(self, job: dict[str, Any]) -> None:
        row = dict(job)
        columns = ", ".join(row)
        marks = ", ".join("?" for _ in row)

        def insert(c: sqlite3.Connection) -> None:
            row["body"] = json.dumps(row["body"])
            c.execute(f"INSERT INTO jobs ({columns}) VALUES ({marks})", tuple(row.values()))

        self._queue.put(insert)

    def update_job(self, job_id: str, **values: Any) -> None:
        unknown = set(values) - set(_JOB_FIELDS)
        if unknown:
            raise ValueError(f"unknown job fields {sorted(unknown)}")
        values["updated_at"] = time.time()
        assignments = ", ".join(f"{name} = ?" for name in values)

        def update(c: sqlite3.Connection) -> None:
            if values.get("result") is not None:
                values["result"] = json.dumps(values["result"])
            c.execute(f"UPDATE jobs SET {assignments} WHERE id = ?", (*values.values(), job_id))

        self._queue.put(update)

    def replace_body(self, job_id: str, shrink: Callable[[], dict[str, Any]]) -> None:
        """Store `shrink()` as the job's body from now on (called on the writer thread: it may encode a
        large body), for a job no attempt will send again (jobs.excerpt)."""

        def replace(c: sqlite3.Connection) -> None:
            c.execute("UPDATE jobs SET body = ? WHERE id = ?", (json.dumps(shrink()), job_id))

        self._queue.put(replace)

    def start_attempt(self, job_id: str, number: int, worker: str, started_at: float) -> None:
        params = (job_id, number, worker, started_at)
        self._queue.put(
            lambda c: c.execute("INSERT INTO attempts VALUES (?, ?, ?, ?, NULL, NULL, NULL)", params)
        )

    def end_attempt(self, job_id: str, number: int, outcome: str, error: str | None = None) -> None:
        params = (time.time(), outcome, error, job_id, number)
        self._queue.put(
            lambda c: c.execute(
                "UPDATE attempts SET ended_at = ?, outcome = ?, error = ? WHERE job_id = ? AND number = ?",
                params,
            )
        )

    def set_attempt_error(self, job_id: str, number: int, error: str) -> None:
        """Replace an ended attempt's error (its end time stays)."""
        params = (error, job_id, number)
        self._queue.put(
            lambda c: c.execute("UPDATE attempts SET error = ? WHERE job_id = ? AND number = ?", params)
        )

    def set_retention(self, retention_days: float, max_jobs: int) -> None:
        """New retention settings (config reload); the next cleanup, due at once, follows them."""
        self.retention_days = retention_days
        self.max_jobs = max_jobs
        self._next_cleanup = 0.0
        self._queue.put(lambda c: None)  # wake the writer thread

    def cleanup(self) -> None:
        """Queue a cleanup now (tests, and after a reload); `flush()` waits for it."""
        self._queue.put(self._cleanup)

    def _cleanup(self, c: sqlite3.Connection) -> int:
        """Delete finished jobs (with their attempts) past the retention time or beyond the row cap."""
        finished = f"state NOT IN ({', '.join('?' for _ in UNFINISHED)})"
        doomed: list[str] = []
        if self.retention_days > 0:
            cutoff = time.time() - self.retention_days * 86400
            query = f"SELECT id FROM jobs WHERE {finished} AND updated_at < ?"
            rows = c.execute(query, (*UNFINISHED, cutoff))
            doomed += [row[0] for row in rows]
        if self.max_jobs > 0:
            rows = c.execute(
                f"SELECT id FROM jobs WHERE {finished} ORDER BY updated_at DESC LIMIT -1 OFFSET ?",
                (*UNFINISHED, self.max_jobs),
            )
            doomed += [row[0] for row in rows]
        ids = [(job_id,) for job_id in dict.fromkeys(doomed)]
        if ids:
            c.executemany("DELETE FROM attempts WHERE job_id = ?", ids)
            c.executemany("DELETE FROM jobs WHERE id = ?", ids)
            log.info("journal: deleted %d finished jobs past retention", len(ids))
        return len(ids)

    @property
    def failure(self) -> str | None:
        """Why the journal can no longer keep what it is given (None while it can)."""
        return self._failure

    def flush(self, timeout: float = 10.0) -> bool:
        """Block until everything queued before this call is committed; False if that did not happen (a
        timeout, or a write or commit that failed)."""
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout) and self._failure is None

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)
        self._write.close()
        self._read.close()
        self._owner.release()

    # reads ----------------------------------------------------------------------------------------
    def job(self, job_id: str) -> StoredJob | None:
        with self._read_lock:
            row = self._read.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return StoredJob.from_row(row) if row else None

    def job_by_key(self, key: str, since: float) -> StoredJob | None:
        with self._read_lock:
            row = self._read.execute(
                "SELECT * FROM jobs WHERE idempotency_key = ? AND created_at >= ? "
                "ORDER BY created_at DESC LIMIT 1",
                (key, since),
            ).fetchone()
        return StoredJob.from_row(row) if row else None

    def unfinished(self) -> list[StoredJob]:
        with self._read_lock:
            rows = self._read.execute(
                f"SELECT * FROM jobs WHERE state IN ({', '.join('?' for _ in UNFINISHED)}) "
                "ORDER BY created_at",
                UNFINISHED,
            ).fetchall()
        return [StoredJob.from_row(row) for row in rows]

    def attempts(self, job_id: str) -> list[dict[str, Any]]:
        with self._read_lock:
            rows = self._read.execute(
                "SELECT number, worker, started_at, ended_at, outcome, error FROM attempts WHERE job_id = ? "
                "ORDER BY number",
                (job_id,),
            ).fetchall()
        return [dict(row) for row in rows]

    # the writer thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        stop = False
        while not stop:
            wait = self._next_cleanup - time.monotonic()
            batch: list[Operation | threading.Event | None] = []
            if wait <= 0:
                self._next_cleanup = time.monotonic() + CLEANUP_INTERVAL
                batch.append(self._cleanup)
            else:
                try:
                    batch.append(self._queue.get(timeout=wait))
                except queue.Empty:
                    continue  # the cleanup is due
            while len(batch) < 500:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            waiters: list[threading.Event] = []
            try:
                self._write.execute("BEGIN")
                for item in batch:
                    if item is None:
                        stop = True
                    elif isinstance(item, threading.Event):
                        waiters.append(item)
                    else:
                        try:
                            item(self._write)
                        except Exception as error:  # any error here would end the writer thread
                            # One bad write must not lose the batch, nor stop the writer thread for good;
                            # the journal keeps the rest and reports itself degraded.
                            self._failed(f"a journal write failed: {type(error).__name__}: {error}")
                self._write.execute("COMMIT")
            except sqlite3.Error as error:  # a full disk, a lost file, a lock held elsewhere
                self._failed(f"the journal could not commit: {error}")
                with contextlib.suppress(sqlite3.Error):
                    self._write.execute("ROLLBACK")
            for waiter in waiters:
                waiter.set()

    def _failed(self, reason: str) -> None:
        log.error("%s", reason)
        if self._failure is None:
            self._failure = reason
            if self._on_failure is not None:
                self._on_failure(reason)
