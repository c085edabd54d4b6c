"""The router's listening socket, bound as the service binds it: `failsoft serve`, the tray's service and
`failsoft doctor`'s port check all ask the same question the same way."""

from __future__ import annotations

import socket


def listening_socket(host: str, port: int) -> socket.socket:
    """The router's socket, bound before anything else starts: a port in use is known at once, before a
    worker is started or a model read. Raises OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
