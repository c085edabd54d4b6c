"""Where plain HTTP may go: the config's rule for a literal address or a name, and the check of a name's
resolved addresses made before a plain-HTTP probe (a LAN-looking name can still point at the internet)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

from tray_app.config.peers import is_local_address, plain_http_allowed_host

__all__ = ["plain_http_allowed_host", "resolved_is_local"]


async def resolved_is_local(host: str) -> bool:
    """True when `host` resolves only to loopback, private or link-local addresses (False when it resolves
    to none). A failed resolution raises OSError (socket.gaierror): the peer is unreachable, not insecure."""
    found = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    addresses = {ipaddress.ip_address(str(sockaddr[0])) for *_, sockaddr in found}
    return bool(addresses) and all(is_local_address(address) for address in addresses)
