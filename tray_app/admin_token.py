"""The control API's admin credential: a random token in a file only its owner can read.

Inference routes take the optional API key; the routes that change what the service does (its config, its
workers and models, approvals, drill faults) also need this token. The service writes it at its first start;
the tray and the `failsoft` commands read it from the same data folder. Whoever can read the file is the
service's owner; an inference client, a web page or another local user is not.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
from pathlib import Path

from tray_app import paths

HEADER = "X-Failsoft-Admin"
FILE_NAME = "admin-token"
ENV_VARIABLE = "FAILSOFT_ADMIN_TOKEN"  # for a client whose service keeps its data folder elsewhere
# A system service's copy (`failsoft install --system`), readable by the group `failsoft`. It exists while
# that service runs (systemd removes /run/failsoft when it stops), so a client reading it finds that one.
SYSTEM_COPY = Path("/run/failsoft") / FILE_NAME
# Control paths that need no token: read-only views (the tray's live status and events, Prometheus).
READ_ONLY_PATHS = frozenset(
    {"/failsoft/status", "/failsoft/events", "/failsoft/timing", "/failsoft/device/history"}
)


def token_path(data_dir: Path | None = None) -> Path:
    return (data_dir or paths.data_dir()) / FILE_NAME


def ensure(data_dir: Path | None = None) -> str:
    """The token, made (0600, written once, never replaced) if there is none yet."""
    path = token_path(data_dir)
    existing = read(path)
    if existing:
        return existing
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read(path) or token  # another process made it first: theirs is the one
    with os.fdopen(descriptor, "w", encoding="ascii") as file:
        file.write(token + "\n")
    return token


def read(path: Path | None = None) -> str:
    """The token in `path` (default: this user's data folder), "" where there is none to read."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return (path or token_path()).read_text(encoding="ascii").strip()
    return ""


def for_client(data_dir: Path | None = None) -> str:
    """What a local client sends: $FAILSOFT_ADMIN_TOKEN, else a running system service's copy (for a member
    of the group `failsoft`: the tray at login attaches to that service), else the token file of this user's
    data folder (or of `data_dir` when given, and then only that)."""
    from_env = os.environ.get(ENV_VARIABLE, "").strip()
    if from_env or data_dir is not None:
        return from_env or read(token_path(data_dir))
    return read(SYSTEM_COPY) or read(token_path())


def headers(token: str) -> dict[str, str]:
    return {HEADER: token} if token else {}


def needs_token(path: str) -> bool:
    """Whether a request to `path` is an admin request (every /failsoft/ route but the read-only views)."""
    return path.startswith("/failsoft/") and path not in READ_ONLY_PATHS


def sent_by_owner(path: str) -> bool:
    """Whether the owner's own clients (the tray, the commands) send the token on `path`: the admin routes,
    and the jobs they read back by id (any job is its owner's too)."""
    return needs_token(path) or path.startswith("/v1/jobs/")


def matches(sent: bytes | None, token: str) -> bool:
    """Compared in constant time, as bytes: a header with non-ASCII bytes is a wrong token, not an error."""
    return bool(token) and sent is not None and hmac.compare_digest(sent.strip(), token.encode("ascii"))
