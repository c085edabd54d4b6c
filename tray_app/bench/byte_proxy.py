"""A byte-for-byte TCP proxy on loopback: what any extra hop costs on this machine (two more socket writes
and two more wake-ups per message), with no HTTP parsing and no routing. The bench measures it beside the
router, so the router's own share of its overhead is the difference: a machine-independent figure.

    python -m tray_app.bench.byte_proxy UPSTREAM_PORT LISTEN_PORT
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import cast

from tray_app.host.event_loop import run

LOOPBACK = "127.0.0.1"


class _Upstream(asyncio.Protocol):
    def __init__(self, downstream: asyncio.Transport) -> None:
        self.downstream = downstream

    def data_received(self, data: bytes) -> None:
        self.downstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.downstream.close()


class _Downstream(asyncio.Protocol):
    """One client connection: its bytes go to a new upstream connection, the answer's bytes come back."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.upstream: asyncio.Transport | None = None
        self.early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            upstream, _ = await loop.create_connection(
                lambda: _Upstream(self.transport), LOOPBACK, self.upstream_port
            )
        except OSError:
            self.transport.close()
            return
        self.upstream = upstream
        for data in self.early:
            upstream.write(data)

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            self.early.append(data)
        else:
            self.upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


async def serve(upstream_port: int, listen_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Downstream(upstream_port), LOOPBACK, listen_port)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def byte_proxy(upstream_port: int) -> Iterator[str]:
    """A byte proxy in its own process (the bench's client must not share its CPU time); yields its URL."""
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "tray_app.bench.byte_proxy", str(upstream_port), str(port)]
    process = subprocess.Popen(command)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), timeout=0.2):
                break
            time.sleep(0.05)
        yield f"http://{LOOPBACK}:{port}"
    finally:
        process.terminate()
        process.wait(10)


if __name__ == "__main__":
    run(serve(int(sys.argv[1]), int(sys.argv[2])))
