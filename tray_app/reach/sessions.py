"""The status page's login sessions, kept by the service: a random id in the browser's cookie, and here what
it stands for. Logging out ends a session at once; a new admin token ends every session opened with the old
one (each is bound to its digest); a session unused for IDLE, or older than TTL, is over.

The sessions live in memory and in a file of the data folder (0600), so a restart of the service does not log
the page out. The file holds digests of the ids, never the ids: reading it gives no cookie."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# Idle: the page is checked now and then, and an open tab keeps it alive; a cookie nobody uses for half a day
# (a forgotten browser, a copy another program kept) is over. Absolute: a session kept alive without a pause
# still asks for the admin token again after a week. Logout and a new admin token end it at once.
IDLE = 12 * 3600.0
TTL = 7 * 24 * 3600.0
# Last use is written to the file at most this often (the file is not rewritten on every request): after a
# restart a session may end this much earlier than it would have.
SEEN_SAVE_EVERY = 600.0
MAX_SESSIONS = 32  # one per browser that logged in; beyond it the least recently used ends
MAX_ID_CHARS = 256  # a longer cookie is not one of ours (ids are 43 characters)


@dataclass
class _Session:
    owner: str  # the digest of the admin token it was opened with
    created: float
    seen: float
    saved_seen: float = 0.0  # `seen` as the file has it


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()


class Sessions:
    """Open, check and end sessions, bound to `owner` (a digest of the admin token the service checks)."""

    def __init__(self, owner: str, file: Path | None = None, now: Callable[[], float] = time.time) -> None:
        self.owner = owner
        self.idle = IDLE
        self.ttl = TTL
        self._file = file
        self._now = now
        self._lock = threading.Lock()
        self._sessions, ended = self._load()
        if ended:
            with self._lock:
                self._save()  # what ended while the service was stopped leaves the file too

    def start(self) -> str:
        session_id = secrets.token_urlsafe(32)
        now = self._now()
        with self._lock:
            self._drop_ended(now)
            while len(self._sessions) >= MAX_SESSIONS:
                oldest = min(self._sessions, key=lambda key: self._sessions[key].seen)
                del self._sessions[oldest]
            self._sessions[_digest(session_id)] = _Session(self.owner, now, now, now)
            self._save()
        return session_id

    def valid(self, session_id: str) -> bool:
        """Whether `session_id` is an open session of this owner; a use keeps it from going idle."""
        if not session_id or len(session_id) > MAX_ID_CHARS:
            return False
        key = _digest(session_id)
        now = self._now()
        with self._lock:
            session = self._sessions.get(key)
            if session is None:
                return False
            if not self._open(session, now):
                del self._sessions[key]
                self._save()
                return False
            session.seen = now
            if now - session.saved_seen >= SEEN_SAVE_EVERY:
                self._save()
            return True

    def end(self, session_id: str) -> None:
        if not session_id or len(session_id) > MAX_ID_CHARS:
            return
        with self._lock:
            if self._sessions.pop(_digest(session_id), None) is not None:
                self._save()

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    # ---------------------------------------------------------------------------------------- inside
    def _open(self, session: _Session, now: float) -> bool:
        return (
            session.owner == self.owner  # a digest, not a secret: it is in the file
            and now - session.seen <= self.idle
            and now - session.created <= self.ttl
        )

    def _drop_ended(self, now: float) -> None:
        self._sessions = {key: s for key, s in self._sessions.items() if self._open(s, now)}

    def _load(self) -> tuple[dict[str, _Session], int]:
        """The file's sessions that are still open under this owner (those of an old admin token are not),
        and how many others it held."""
        if self._file is None:
            return {}, 0
        try:
            entries = json.loads(self._file.read_text(encoding="utf-8"))["sessions"]
            items = list(entries.items())
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return {}, 0
        loaded: dict[str, _Session] = {}
        for key, entry in items:
            with contextlib.suppress(TypeError, ValueError, KeyError):
                session = _Session(str(entry["owner"]), float(entry["created"]), float(entry["seen"]))
                session.saved_seen = session.seen
                if self._open(session, self._now()):
                    loaded[str(key)] = session
        return loaded, len(items) - len(loaded)

    def _save(self) -> None:
        """Written whole under another name, then renamed (0600). Called with the lock held."""
        if self._file is None:
            return
        sessions = {}
        for key, session in self._sessions.items():
            session.saved_seen = session.seen
            entry = asdict(session)
            del entry["saved_seen"]
            sessions[key] = entry
        temporary = self._file.with_name(f".{self._file.name}.tmp")
        try:
            self._file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "w", encoding="utf-8") as file:
                json.dump({"sessions": sessions}, file)
            os.replace(temporary, self._file)
        except OSError as error:
            # Kept in memory still; an ended session could come back only after a restart.
            log.warning("could not write the status page's sessions to %s: %s", self._file, error)
