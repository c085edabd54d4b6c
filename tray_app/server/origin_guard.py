"""Who may talk to the service: the Host allow-list (against DNS rebinding), the Origin check (against web
pages the user happens to have open), CORS for the origins the user allowed, and JSON-only control routes.

A browser attaches `Origin` to every cross-origin request and to every POST; a page cannot remove or forge
it. Programs (the tray, curl, the openai SDK) send no Origin and pass. A DNS-rebinding page reaches the
service under its own host name, which the Host allow-list refuses. Both checks run in the outermost ASGI
layer (`app.AuthAndErrors`), before the API key and before any route, the generation routes included.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.types import Scope

from tray_app.config import ServerConfig
from tray_app.config.origins import DEFAULT_PORTS, normalize_origin, split_host
from tray_app.contract.sizes import parse_size
from tray_app.server.errors import ApiError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# Control request bodies are a few small JSON fields; nothing needs more.
# Failsoft's own control API: a prefix of its own, since `/api/` is Ollama's (its routes grow over time).
CONTROL_PREFIX = "/failsoft/"
CONTROL_MAX_BODY = parse_size("64KiB")
CONTROL_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
JSON_TYPES = frozenset({"application/json"})
ALLOW_METHODS = "GET, POST, PATCH, DELETE, OPTIONS"
EXPOSE_HEADERS = (
    "X-Request-Id, X-Failsoft-Job, X-Failsoft-Worker, X-Failsoft-Attempts, Retry-After, Idempotent-Replayed"
)
PREFLIGHT_MAX_AGE = "600"


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def is_loopback_name(name: str) -> bool:
    if name in LOOPBACK_NAMES:
        return True
    address = _ip(name)
    return address is not None and address.is_loopback


@dataclass(frozen=True)
class Verdict:
    """What the guard decided: an error to answer with, a preflight to answer, or pass (with CORS headers
    for an allowed cross-origin caller)."""

    error: ApiError | None = None
    preflight: bool = False
    cors_headers: tuple[tuple[bytes, bytes], ...] = ()


PASS = Verdict()


def public_origin(cfg: ServerConfig) -> tuple[str, str, int] | None:
    """`server.public_url`'s origin (scheme, host, port), None when it is not set."""
    if not cfg.public_url:
        return None
    parts = urlsplit(cfg.public_url)
    return normalize_origin(f"{parts.scheme}://{parts.netloc}")


# Distinct Host values whose verdict is kept: a client uses one or two; a flood of made-up ones is checked
# each time rather than kept.
HOST_VERDICTS = 64


class OriginGuard:
    """The checks, against the server config as it is now (`server()` is read on each request, so a config
    reload that changes the allow-lists applies at once). `api_key` is the key the running service checks.

    A request without Origin (a program, not a page) is judged by its Host and the config alone: that
    verdict is kept per Host value for the config object it was made under (a reload makes a new one), so
    every token-stream request does not parse its Host again."""

    def __init__(self, server: Callable[[], ServerConfig], api_key: str) -> None:
        self.server = server
        self.api_key = api_key
        self._host_verdicts: dict[bytes | None, Verdict] = {}
        self._verdicts_of: ServerConfig | None = None

    # ----------------------------------------------------------------------------------------- hosts
    def host_allowed(self, name: str, port: int | None, cfg: ServerConfig) -> bool:
        if is_loopback_name(name):
            return True
        configured = cfg.host.lower().strip("[]")
        if name == configured:
            return True
        if "*" in cfg.allowed_hosts and self.api_key:
            return True
        public = public_origin(cfg)
        if public is not None and public[1] == name and self.api_key:
            # The address the user gave for links (server.public_url): a reverse proxy's name. Never without
            # an API key: `failsoft serve` refuses that at start, and a config reload does not open it.
            return True
        for entry in cfg.allowed_hosts:
            allowed = split_host(entry)
            if allowed is not None and allowed[0] == name and allowed[1] in (None, port):
                return True
        # An address literal cannot be a rebinding (that needs a name the attacker's DNS answers); when the
        # service was bound beyond loopback on purpose, LAN clients may use its address.
        return _ip(name) is not None and not is_loopback_name(configured)

    # --------------------------------------------------------------------------------------- origins
    def origin_allowed(
        self, origin: str, scope_port: int | None, host: tuple[str, int | None] | None, cfg: ServerConfig
    ) -> bool:
        parsed = normalize_origin(origin)
        if parsed is None:
            return False  # "null" (sandboxed frames, file://) and anything malformed
        scheme, name, port = parsed
        own_ports = {cfg.port} if scope_port is None else {cfg.port, scope_port}
        if is_loopback_name(name) and port in own_ports:
            return True  # a page the service itself would serve (same host and port)
        if host is not None and name == host[0] and port == (host[1] or DEFAULT_PORTS[scheme]):
            return True  # same origin as the request's (already allowed) Host
        if "*" in cfg.allowed_origins and self.api_key:
            return True
        if parsed == public_origin(cfg):
            return True  # the status page as the phone reaches it (server.public_url)
        return any(normalize_origin(entry) == parsed for entry in cfg.allowed_origins if entry != "*")

    # ----------------------------------------------------------------------------------------- check
    def check(self, scope: Scope) -> Verdict:
        headers: dict[bytes, bytes] = {}
        for key, value in scope.get("headers", ()):
            headers.setdefault(key, value)
        cfg = self.server()
        raw_host = headers.get(b"host")
        raw_origin = headers.get(b"origin")
        if raw_origin is None:
            return self._host_verdict(raw_host, cfg)
        host, refused = self._judge_host(raw_host, cfg)
        if refused is not None:
            return refused
        method = str(scope.get("method", ""))
        origin = raw_origin.decode("latin-1")
        server = scope.get("server")
        scope_port = server[1] if isinstance(server, (tuple, list)) and len(server) > 1 else None
        if not self.origin_allowed(origin, scope_port, host, cfg):
            return Verdict(
                ApiError(
                    403,
                    f"Origin {origin!r} is not allowed; add it to server.allowed_origins",
                    type="permission_error",
                    code="forbidden_origin",
                    param="Origin",
                )
            )
        cors = (
            (b"access-control-allow-origin", raw_origin),
            (b"vary", b"Origin"),
            (b"access-control-expose-headers", EXPOSE_HEADERS.encode()),
        )
        if method == "OPTIONS" and b"access-control-request-method" in headers:
            preflight = (
                *cors[:2],
                (b"access-control-allow-methods", ALLOW_METHODS.encode()),
                (b"access-control-allow-headers", headers.get(b"access-control-request-headers", b"")),
                (b"access-control-max-age", PREFLIGHT_MAX_AGE.encode()),
            )
            return Verdict(preflight=True, cors_headers=preflight)
        return Verdict(cors_headers=cors)

    def _host_verdict(self, raw_host: bytes | None, cfg: ServerConfig) -> Verdict:
        if cfg is not self._verdicts_of:
            self._host_verdicts.clear()
            self._verdicts_of = cfg
        verdict = self._host_verdicts.get(raw_host)
        if verdict is None:
            verdict = self._judge_host(raw_host, cfg)[1] or PASS
            if len(self._host_verdicts) < HOST_VERDICTS:
                self._host_verdicts[raw_host] = verdict
        return verdict

    def _judge_host(
        self, raw_host: bytes | None, cfg: ServerConfig
    ) -> tuple[tuple[str, int | None] | None, Verdict | None]:
        """The parsed Host (None without one), and the refusal when it is not allowed."""
        if raw_host is None:
            return None, None
        host = split_host(raw_host.decode("latin-1"))
        if host is not None and self.host_allowed(host[0], host[1], cfg):
            return host, None
        return host, Verdict(
            ApiError(
                403,
                f"Host {raw_host.decode('latin-1')!r} is not allowed; add it to server.allowed_hosts",
                type="permission_error",
                code="forbidden_host",
                param="Host",
            )
        )

    @staticmethod
    def check_control_body(scope: Scope) -> ApiError | None:
        """Control routes (`/failsoft/...`) change state: JSON bodies only (a browser can send text/plain or
        a form without a preflight, never JSON), and small ones.

        Ollama's routes (under `/api/`) are not control routes: like the OpenAI routes they take bodies up to
        `server.max_body` in whatever type the client labels them (curl -d sends a form type, and Ollama
        accepts it); the Host and Origin checks apply to them as to every route."""
        path = str(scope.get("path", ""))
        if not path.startswith(CONTROL_PREFIX) or scope.get("method") not in CONTROL_METHODS:
            return None
        content_type: bytes | None = None
        length: bytes | None = None
        chunked = False
        for key, value in scope.get("headers", ()):
            if key == b"content-type":
                content_type = value
            elif key == b"content-length":
                length = value
            elif key == b"transfer-encoding":
                chunked = True
        size = 0
        if length is not None:
            text = length.decode("latin-1").strip()
            if not text.isdigit():
                return ApiError(400, "Content-Length is not a number", code="invalid_request")
            size = int(text)
            if size > CONTROL_MAX_BODY:
                return ApiError(
                    413,
                    f"control request bodies are at most {CONTROL_MAX_BODY} bytes",
                    code="request_too_large",
                )
        has_body = chunked or size > 0
        if content_type is None:
            if not has_body:
                return None
        else:
            media = content_type.decode("latin-1").split(";", 1)[0].strip().lower()
            if media in JSON_TYPES:
                return None
        return ApiError(
            415,
            "control requests take Content-Type: application/json (or no body)",
            code="unsupported_media_type",
            param="Content-Type",
        )
