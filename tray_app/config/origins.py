"""Host names and web origins as the service compares them: parsed once, in one place, for the config's
checks and the request guard (tray_app.server.origin_guard)."""

from __future__ import annotations

from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}


def split_host(value: str) -> tuple[str, int | None] | None:
    """`name[:port]`, `[v6][:port]` -> (lower-case name without brackets or trailing dot, port or None)."""
    value = value.strip().lower()
    port_text = ""
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                return None
            port_text = rest[1:]
    elif value.count(":") == 1:
        name, _, port_text = value.partition(":")
    elif ":" in value:
        name = value  # a bare IPv6 address (not valid in Host, but unambiguous)
    else:
        name = value
    name = name.rstrip(".")
    if not name:
        return None
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            return None
        return name, int(port_text)
    return name, None


def normalize_origin(origin: str) -> tuple[str, str, int] | None:
    """`scheme://host[:port]` -> (scheme, host, port with the scheme's default); None when not an origin."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/"):
        return None
    if parts.query or parts.fragment or parts.username or parts.password:
        return None
    if any(char.isspace() or char in "/\\@" for char in parts.hostname):
        return None
    return scheme, parts.hostname.lower().rstrip("."), port or DEFAULT_PORTS[scheme]
