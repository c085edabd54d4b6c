"""The status page's login as the outer layer sees it: which paths need no API key (the page's own files,
its login, the signed action links: each carries its own credential or none is needed), and whether a
request carries a valid session cookie, from the service's own origin, for what it asks.

A cookie is sent by the browser with every request to this site; SameSite=Strict keeps it off requests
started by other sites, and the origin check here keeps it off pages of another origin of the same site (a
web app on another port of localhost) that the user allowed in `server.allowed_origins`. Browsers send a
cookie to every port of its host name, so other programs there may hold it: without the Origin (or
`Sec-Fetch-Site: same-origin`) that a browser's page of this service sends, the cookie is good for reading
only (GET), never for a request that changes something. Behind HTTPS it is a `__Host-` cookie: Secure (never
sent over plain HTTP, to another port or not), for this host only, for every path."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import Scope

from tray_app.config import ServerConfig
from tray_app.config.origins import DEFAULT_PORTS, normalize_origin, split_host
from tray_app.server.origin_guard import public_origin

PREFIX = "/ui/"
COOKIE = "failsoft_session"
SECURE_COOKIE = "__Host-" + COOKIE  # over HTTPS: Secure, Path=/, no Domain (the browser enforces all three)
COOKIES = (SECURE_COOKIE, COOKIE)
SAFE_METHODS = frozenset({"GET", "HEAD"})
# Sec-Fetch-Site values a browser sends for the page's own requests ("none": the user opened the address).
OWN_FETCH_SITES = frozenset({b"same-origin", b"none"})


def is_page_path(path: str) -> bool:
    """The page, its files, its login and the action links: reachable without the API key."""
    return path == "/ui" or path.startswith(PREFIX)


def cookie_values(scope: Scope) -> list[str]:
    """The session cookies the request carries (either name; a cookie jar may hold more than one)."""
    values: list[str] = []
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            for pair in value.decode("latin-1").split(";"):
                key, _, item = pair.strip().partition("=")
                if key in COOKIES and item.strip():
                    values.append(item.strip())
    return values


def _header(scope: Scope, wanted: bytes) -> bytes | None:
    return next((value for name, value in scope.get("headers", ()) if name == wanted), None)


def over_https(scope: Scope, cfg: ServerConfig) -> bool:
    """Whether the browser reached the page over HTTPS: directly, through a proxy that says so
    (X-Forwarded-Proto), or at an https `server.public_url`'s host (a proxy passes the Host on)."""
    if scope.get("scheme") == "https":
        return True
    forwarded = (_header(scope, b"x-forwarded-proto") or b"").split(b",")[0].strip().lower()
    if forwarded == b"https":
        return True
    public = public_origin(cfg)
    host = _header(scope, b"host")
    target = split_host(host.decode("latin-1")) if host else None
    if public is None or public[0] != "https" or target is None:
        return False
    return target[0] == public[1] and (target[1] or DEFAULT_PORTS["https"]) == public[2]


def from_own_origin(scope: Scope, cfg: ServerConfig) -> bool:
    """No Origin (a same-origin GET, EventSource), or the Origin of the Host it was sent to, or
    `server.public_url`'s."""
    origin = host = None
    for name, value in scope.get("headers", ()):
        if name == b"origin":
            origin = value.decode("latin-1")
        elif name == b"host":
            host = value.decode("latin-1")
    if origin is None:
        return True
    parsed = normalize_origin(origin)
    if parsed is None:
        return False
    if parsed == public_origin(cfg):
        return True
    target = split_host(host) if host else None
    return (
        target is not None and target[0] == parsed[1] and (target[1] or DEFAULT_PORTS[parsed[0]]) == parsed[2]
    )


def for_what_it_asks(scope: Scope) -> bool:
    """A browser's request from another site (Sec-Fetch-Site) never rides on the cookie; a request that
    changes something does only with the Origin (checked: the service's own) or the Sec-Fetch-Site a
    browser's page of this service sends. A program sending the cookie alone may read, not act."""
    site = _header(scope, b"sec-fetch-site")
    if site is not None and site.strip().lower() not in OWN_FETCH_SITES:
        return False
    if scope.get("method") in SAFE_METHODS:
        return True
    return _header(scope, b"origin") is not None or (site or b"").strip().lower() == b"same-origin"


def has_session(scope: Scope, cfg: ServerConfig, valid: Callable[[str], bool] | None) -> bool:
    if valid is None:
        return False
    cookies = cookie_values(scope)
    if not cookies or not from_own_origin(scope, cfg) or not for_what_it_asks(scope):
        return False
    return any(valid(cookie) for cookie in cookies)
