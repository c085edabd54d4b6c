"""A peer on loopback for the tests: a real HTTP server whose `/health` answer a test sets (and changes), and
which keeps each request's path and headers; a closed port; a clock moved by hand; a resolver that knows a
few names."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.http_server import serving

FAILSOFT_GPU_READY = {"status": "ok", "workers": {"gpu": "ready", "cpu": "ready"}, "simulated": False}
FAILSOFT_GPU_RESTARTING = {
    "status": "ok",
    "workers": {"gpu": "restarting", "cpu": "ready"},
    "simulated": False,
}
LLAMA_SERVER = {"status": "ok"}


@dataclass
class Health:
    """What the server answers now, and what it was asked."""

    status: int = 200
    body: bytes = json.dumps(LLAMA_SERVER).encode()
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)  # (path, headers)

    def reset(self) -> None:
        self.answer(200, LLAMA_SERVER)
        self.requests.clear()

    def answer(self, status: int, body: dict[str, Any] | bytes) -> None:
        self.status = status
        self.body = body if isinstance(body, bytes) else json.dumps(body).encode()


@contextlib.contextmanager
def peer_server(health: Health) -> Iterator[str]:
    """Yields the base URL (http://127.0.0.1:port) of a server answering every GET with `health`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            health.requests.append((self.path, dict(self.headers)))
            self.send_response(health.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(health.body)))
            self.end_headers()
            with contextlib.suppress(ConnectionError):  # a client that read enough may leave
                self.wfile.write(health.body)

        def log_message(self, format: str, *args: object) -> None:
            return

    with serving(Handler) as port:
        yield f"http://127.0.0.1:{port}"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def resolving(addresses: dict[str, list[str]]) -> Any:
    """A stand-in for the loop's getaddrinfo that knows `addresses` only."""

    async def getaddrinfo(host: str, port: object, **_: object) -> list[tuple[Any, ...]]:
        if host not in addresses:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, 0))
            for address in addresses[host]
        ]

    return getaddrinfo
