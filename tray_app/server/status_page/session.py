"""The status page's login as the outer layer sees it: which paths need no API key (the page's own files,
its login, the signed action links: each carries its own credential or none is needed), and whether a
request carries a valid session cookie from the service's own origin.

A cookie is sent by the browser with every request to this site; SameSite=Strict keeps it off requests
started by other sites, and the origin check here keeps it off pages of another origin of the same site (a
web app on another port of localhost) that the user allowed in `server.allowed_origins`."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import Scope

from tray_app.config import ServerConfig
from tray_app.origins import DEFAULT_PORTS, normalize_origin, split_host
from tray_app.server.origin_guard import public_origin

PREFIX = "/ui/"
COOKIE = "failsoft_session"


def is_page_path(path: str) -> bool:
    """The page, its files, its login and the action links: reachable without the API key."""
    return path == "/ui" or path.startswith(PREFIX)


def cookie_value(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            for pair in value.decode("latin-1").split(";"):
                key, _, item = pair.strip().partition("=")
                if key == COOKIE:
                    return item.strip()
    return ""


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


def has_session(scope: Scope, cfg: ServerConfig, valid: Callable[[str], bool] | None) -> bool:
    if valid is None:
        return False
    cookie = cookie_value(scope)
    return bool(cookie) and valid(cookie) and from_own_origin(scope, cfg)
