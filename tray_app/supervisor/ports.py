"""A free loopback port, for a worker or a service about to listen on it."""

from __future__ import annotations

import socket


def free_port() -> int:
    # The port is released before the caller binds it: a race only another local process could win.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
