"""The control API's admin credential: a random token in a file only its owner can read.

Inference routes take the optional API key; the routes that change what the service does (its config, its
workers and models, approvals, drill faults) also need this token. The service writes it at its first start;
the tray and the `failsoft` commands read it from the same data folder. Whoever can read the file is the
service's owner; an inference client, a web page or another local user is not.

A token found on this machine (the file, $FAILSOFT_ADMIN_TOKEN) goes only to the local service's own address
(`for_url`); a service elsewhere gets only a token named for it (`--admin-token`).
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import secrets
from pathlib import Path
from urllib.parse import urlsplit

from tray_app import config, paths

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


WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


def _loopback(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def is_own_address(url: str, host: str, port: int) -> bool:
    """Whether `url` is the local service's own address, the config's `host`:`port`: over HTTP, that port, at
    a loopback name when the service listens on loopback (or everywhere), else at `host` itself. Another port,
    another machine or a proxy in front is not."""
    try:
        parts = urlsplit(url)
        url_port = parts.port or 80
    except ValueError:
        return False
    if parts.scheme != "http" or parts.username is not None or url_port != port:
        return False
    name = (parts.hostname or "").lower()
    configured = host.lower().strip("[]")
    if name == configured:
        return True
    return _loopback(name) and (configured in WILDCARD_HOSTS or _loopback(configured))


def _own_address() -> tuple[str, int] | None:
    """The config's host and port (this user's config, or $FAILSOFT_CONFIG); None when it cannot be read."""
    try:
        cfg = config.load()
    except (config.ConfigError, OSError):
        return None
    return cfg.server.host, cfg.server.port


def is_local_service(url: str, own: tuple[str, int] | None = None) -> bool:
    """Whether `url` is the local service's own address (`own`: the config's host and port; by default
    read from the config)."""
    own = own or _own_address()
    return own is not None and is_own_address(url, *own)


def for_url(url: str, own: tuple[str, int] | None = None) -> str:
    """What a client sends the service at `url` when no token was named for it: the token found on this
    machine (`for_client`) if `url` is the local service's own address, else "" (a token of this machine
    never goes to another one, nor to another port)."""
    return for_client() if is_local_service(url, own) else ""


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
