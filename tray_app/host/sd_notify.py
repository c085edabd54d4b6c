"""systemd's notify protocol (READY=1, WATCHDOG=1, STOPPING=1) over $NOTIFY_SOCKET, with no dependency.

Outside systemd the socket variable is unset and every call is a no-op returning False.
"""

from __future__ import annotations

import os
import socket


def notify(state: str) -> bool:
    """Send one state line to systemd; False when not running under a notify-type unit."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace socket
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(state.encode("utf-8"))
    return True


def watchdog_interval() -> float | None:
    """Half of WATCHDOG_USEC in seconds (ping twice per period), or None when no watchdog is set."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and int(pid) != os.getpid()):
        return None
    return int(usec) / 2_000_000
