"""`failsoft hog` as a real separate process against a test's service: it takes simulated VRAM from that
service's ledger and gives it back when stopped."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.support.service import ServiceHandle

FAILSOFT = str(Path(sys.executable).with_name("failsoft"))


@contextlib.contextmanager
def hog(svc: ServiceHandle, size: str, name: str) -> Iterator[subprocess.Popen[str]]:
    """A hog holding `size` as `name` once its first line says so; SIGTERM (it gives back) on exit."""
    process = subprocess.Popen(
        [FAILSOFT, "hog", size, "--name", name],
        env=svc.hog_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert f"{name} (pid {process.pid}) holds" in line, line + process.stdout.read()
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
