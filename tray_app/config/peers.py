"""The `[[peers]]` tables of the config: other machines' OpenAI-compatible servers (best another Failsoft)
asked between the local GPU and the local CPU, other machines' devices the GPU worker spans through
llama.cpp's RPC backend (`rpc`), and the rule for where plain HTTP may go.

Kept apart from the sections (schema.py): validation.py fills a `PeerConfig` as it fills any section, then
asks `problem` what else is wrong; `tray_app.peers` reuses the address rule when it probes a peer."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from tray_app.contract.sizes import parse_size

MAX_SLOTS = 64
_NAME = re.compile(r"[A-Za-z0-9._-]{1,40}")
_HOST_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?")
# A name in one of these zones, or one without a dot, is answered by the local network's own resolver.
_LAN_SUFFIXES = (".local", ".lan", ".home.arpa")
_PRIVATE_NETWORKS = tuple(
    ipaddress.ip_network(network) for network in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
)
PLAIN_HTTP_RULE = "plain HTTP only on the local network; use https://"


@dataclass
class PeerConfig:
    """One `[[peers]]` table: another machine's server, used as a worker tier."""

    name: str = ""  # for the status and the log; [A-Za-z0-9._-]{1,40}, unique (required)
    url: str = ""  # scheme://host[:port], no path (required unless rpc is set); no trailing "/"
    api_key: str = ""  # the peer's server.api_key, sent as Authorization: Bearer
    models: list[str] = field(default_factory=list)  # local model names it is asked for; empty: the main one
    priority: int = 0  # lower is asked first
    slots: int = 4  # requests sent to it at once
    # host:port of `failsoft rpc serve` on that machine: its device takes layers the local GPU cannot hold.
    rpc: str = ""
    rpc_memory: str = ""  # the most of that device the plan may use, e.g. "6GiB" (default: all it has free)


def is_local_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Loopback, private (RFC 1918, fc00::/7) or link-local. Not `is_private`: that also takes documentation
    and benchmark ranges, which no peer lives in."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return (
        address.is_loopback
        or address.is_link_local
        or any(address in network for network in _PRIVATE_NETWORKS)
    )


def literal_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`host` as an IP address when it is written as one ("[::1]" too), else None."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def plain_http_allowed_host(host: str) -> bool:
    """Whether plain HTTP may go to `host`: a literal loopback, private or link-local address, `localhost`,
    or a LAN name (ending in .local, .lan, .home.arpa, or without a dot). A name's address is checked again
    when the peer is probed: a LAN-looking name can still resolve to a public address."""
    address = literal_address(host)
    if address is not None:
        return is_local_address(address)
    name = host.lower().rstrip(".")
    if not name:
        return False
    return name == "localhost" or name.endswith(_LAN_SUFFIXES) or "." not in name


def normalized_url(url: str) -> str:
    """A checked peer URL as `scheme://host[:port]`: the trailing "/" dropped."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def problem(peer: PeerConfig) -> tuple[str, str] | None:
    """What is wrong with a filled-in peer, as (key, what is wrong); None when nothing is. The types were
    checked as the table was read."""
    if not peer.name:
        return "name", 'is required: what the status and the log call the peer, e.g. "gaming-pc"'
    if not _NAME.fullmatch(peer.name):
        return "name", f"= {peer.name!r} must be 1 to 40 of A-Z, a-z, 0-9, '.', '_' and '-'"
    if not peer.url and not peer.rpc:
        return "url", 'is required: the peer\'s server, e.g. "http://192.168.1.20:8750" (or rpc alone)'
    url_problem = _url_problem(peer.url) if peer.url else None
    if url_problem:
        return "url", f"= {peer.url!r} {url_problem}"
    rpc_problem = _rpc_problem(peer.rpc) if peer.rpc else None
    if rpc_problem:
        return "rpc", f"= {peer.rpc!r} {rpc_problem}"
    if peer.rpc_memory and not _size_ok(peer.rpc_memory):
        return "rpc_memory", f'= {peer.rpc_memory!r} must be a size such as "6GiB" or "6000MiB"'
    if not peer.api_key.isascii() or not peer.api_key.isprintable() or " " in peer.api_key:
        return "api_key", "must be printable ASCII without spaces (it is sent in an HTTP header)"
    if any(not model or model != model.strip() for model in peer.models):
        return "models", f"= {peer.models!r}: each must be a model name, without spaces at either end"
    if not 1 <= peer.slots <= MAX_SLOTS:
        return "slots", f"= {peer.slots} must be in 1..{MAX_SLOTS}"
    return None


def _url_problem(url: str) -> str | None:
    example = "e.g. http://192.168.1.20:8750"
    if any(char.isspace() or not char.isprintable() for char in url):
        return "must have no spaces or control characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:  # a bad IPv6 literal, a port that is not a number in 0..65535
        return f"is not a URL ({error}); {example}"
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https") or not host:
        return f"must be an http:// or https:// URL with a host, {example}"
    if literal_address(host) is None and not _HOST_NAME.fullmatch(host):
        return f"has no valid host name ({host!r})"
    if port == 0:
        return "has port 0; leave the port out or use 1..65535"
    if parts.username is not None or parts.password is not None:
        return "must hold no user or password; the peer's key goes in api_key"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return f"must be the server's root, without a path, query or fragment, {example}"
    if parts.scheme == "http" and not plain_http_allowed_host(host):
        return f"goes to {host}, not a local address or a LAN name: {PLAIN_HTTP_RULE}"
    return None


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """`host:port` ("[::1]:50052" for IPv6) as (host, port); ValueError when it is not one."""
    host, colon, port = endpoint.rpartition(":")
    if not colon or not host or not port.isdigit():
        raise ValueError("is not host:port")
    return host.strip("[]"), int(port)


def _rpc_problem(endpoint: str) -> str | None:
    example = "e.g. 192.168.1.20:50052 (what `failsoft rpc serve` prints there)"
    if any(char.isspace() or not char.isprintable() for char in endpoint):
        return "must have no spaces or control characters"
    try:
        host, port = split_endpoint(endpoint)
    except ValueError:
        return f"must be host:port, {example}"
    if not 1 <= port <= 65535:
        return f"has port {port}; use 1..65535"
    if literal_address(host) is None and not _HOST_NAME.fullmatch(host.lower()):
        return f"has no valid host name ({host!r})"
    # llama.cpp's RPC has no authentication and no encryption: never beyond the local network.
    if not plain_http_allowed_host(host):
        return f"goes to {host}, not a local address or a LAN name: llama.cpp's RPC is for a LAN only"
    return None


def _size_ok(text: str) -> bool:
    try:
        return parse_size(text) > 0
    except ValueError:
        return False
