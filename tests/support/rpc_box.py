"""A real `failsoft rpc serve` on loopback (llama.cpp's rpc-server on its CPU backend): another machine's
device, as the GPU worker meets it."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from tray_app.host.launch import free_port


@dataclass
class RpcBox:
    process: subprocess.Popen[str]
    port: int

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def kill(self) -> None:
        """Gone as a machine that lost power is: no goodbye to the worker that uses it."""
        self.process.kill()
        self.process.wait(30)


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def rpc_box(port: int | None = None) -> Iterator[RpcBox]:
    port = port or free_port()
    command = [sys.executable, "-m", "tray_app", "rpc", "serve", "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    box = RpcBox(process, port)
    try:
        deadline = time.monotonic() + 30
        while not listening(port):
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, "rpc-server did not listen"
            time.sleep(0.1)
        yield box
    finally:
        if process.poll() is None:
            process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.communicate(timeout=30)
