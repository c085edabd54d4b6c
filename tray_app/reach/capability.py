"""Signed, expiring, single-use capabilities: an Approve or Reject link for one job; and the status page's
login sessions. The phone holding a link needs no API key; the link says which job and which decision, and
an HMAC over them (with a key only the service reads) means it cannot be changed into another.

A link: `<job id>.<decision>.<expiry>.<nonce>.<signature>`, all URL-safe. Its nonce is remembered once used
(in a file of the data folder, so a restart does not make it usable again) until the link has expired.

A session is a random id the service keeps (sessions.Sessions), not a signed value: logging out ends it
here, and a new admin token ends every session made under the old one."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tray_app.reach import admin_token
from tray_app.reach.sessions import Sessions

KEY_FILE = "action-key"
USED_FILE = "actions-used.json"
DECISIONS = ("approve", "reject")
Decision = Literal["approve", "reject"]
LINK_TTL = 6 * 3600.0  # a job waiting longer is still on the status page; the link has stopped working
SESSIONS_FILE = "sessions.json"
MAX_USED = 10_000  # used nonces kept (each until its link expires): bounded against a flood of presses


def _read_key(path: Path) -> bytes | None:
    with contextlib.suppress(OSError, ValueError):
        key = bytes.fromhex(path.read_text(encoding="ascii").strip())
        if len(key) >= 32:
            return key
    return None


def ensure_key(data_dir: Path) -> bytes:
    """The signing key (32 random bytes, 0600, written once), made at the service's first start."""
    path = data_dir / KEY_FILE
    existing = _read_key(path)
    if existing is not None:
        return existing
    key = secrets.token_bytes(32)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Written whole under another name, then linked in: a second service starting at once keeps the first's.
    temporary = path.with_name(f".{KEY_FILE}.{os.getpid()}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="ascii") as file:
        file.write(key.hex() + "\n")
    try:
        os.link(temporary, path)
    except FileExistsError:
        theirs = _read_key(path)
        if theirs is not None:
            return theirs
        os.replace(temporary, path)  # a broken key file: this one replaces it
        return key
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
    return key


@dataclass(frozen=True)
class Action:
    """A verified link: this decision, for this job."""

    job_id: str
    decision: Decision
    expires_at: float
    nonce: str


class Refused(Exception):
    """The link is not one the service made, has been changed, has expired, or was used already."""


def _sign(key: bytes, purpose: str, payload: str) -> str:
    # surrogatepass: a path's text may hold anything; one string, one byte string, never an error.
    message = f"{purpose}\n{payload}".encode("utf-8", "surrogatepass")
    digest = hmac.new(key, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _same(sent: str, expected: str) -> bool:
    """Constant-time, as bytes: text with non-ASCII characters is a mismatch, not a TypeError."""
    return hmac.compare_digest(sent.encode("utf-8", "surrogatepass"), expected.encode("ascii"))


class Signer:
    """Makes and checks the links with one key, and remembers used links; keeps the status page's sessions,
    bound to `owner` (the admin token they were opened with)."""

    def __init__(
        self,
        key: bytes,
        used_file: Path | None = None,
        now: Callable[[], float] = time.time,
        sessions_file: Path | None = None,
        owner: str = "",
    ) -> None:
        self._key = key
        self._now = now
        self._used_file = used_file
        self._lock = threading.Lock()
        self._used: dict[str, float] = self._load_used()
        self.sessions = Sessions(_sign(key, "session-owner", owner), sessions_file, now)
        self.session_ttl = self.sessions.ttl  # the cookie's Max-Age: the browser drops it when it ends here

    # -------------------------------------------------------------------------------------- links
    def link_token(self, job_id: str, decision: Decision, ttl: float = LINK_TTL) -> str:
        if decision not in DECISIONS or "." in job_id or not job_id:
            raise ValueError(f"no link for {decision!r} on {job_id!r}")
        expiry = int(self._now() + ttl)
        payload = f"{job_id}.{decision}.{expiry}.{secrets.token_urlsafe(9)}"
        return f"{payload}.{_sign(self._key, 'action', payload)}"

    def check(self, token: str) -> Action:
        """The action a token grants, without using it up. Refused when forged, changed or expired."""
        parts = token.split(".")
        if len(parts) != 5:
            raise Refused("this link is not a Failsoft action link")
        job_id, decision, expiry, nonce, signature = parts
        if not _same(signature, _sign(self._key, "action", ".".join(parts[:4]))):
            raise Refused("this link was not made by this Failsoft service, or it has been changed")
        if decision not in DECISIONS or not expiry.isdigit():
            raise Refused("this link is not a Failsoft action link")
        if int(expiry) < self._now():
            raise Refused("this link has expired: decide on the status page instead")
        return Action(job_id, decision, float(expiry), nonce)  # type: ignore[arg-type]

    def use(self, token: str) -> Action:
        """Check the token and use it up, in one step: a second use (also after a restart) is refused."""
        action = self.check(token)
        with self._lock:
            now = self._now()
            self._used = {nonce: until for nonce, until in self._used.items() if until >= now}
            if action.nonce in self._used:
                raise Refused("this link was used already")
            if len(self._used) >= MAX_USED:
                raise Refused("too many links were used recently: decide on the status page instead")
            self._used[action.nonce] = action.expires_at
            self._save_used()
        return action

    # ------------------------------------------------------------------------------------ session
    def start_session(self) -> str:
        """A new session (after the admin token was checked): the id the cookie carries."""
        return self.sessions.start()

    def session_valid(self, cookie: str) -> bool:
        return self.sessions.valid(cookie)

    def end_session(self, cookie: str) -> None:
        self.sessions.end(cookie)

    # -------------------------------------------------------------------------------------- files
    def _load_used(self) -> dict[str, float]:
        if self._used_file is None:
            return {}
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(self._used_file.read_text(encoding="utf-8"))
            if isinstance(data, dict):
                return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}
        return {}

    def _save_used(self) -> None:
        if self._used_file is None:
            return
        temporary = self._used_file.with_name(f".{self._used_file.name}.tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            json.dump(self._used, file)
        os.replace(temporary, self._used_file)


def signer_for(data_dir: Path) -> Signer:
    """The service's signer: its key, used links and sessions in `data_dir`; sessions bound to the admin token
    there (the one the service checks: `admin_token.ensure` on the same folder reads the same file)."""
    owner = admin_token.ensure(data_dir)
    return Signer(
        ensure_key(data_dir), data_dir / USED_FILE, sessions_file=data_dir / SESSIONS_FILE, owner=owner
    )
