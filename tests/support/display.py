"""A virtual X display for the GUI tests: Xvfb on a number it reserves itself, used once it says it is ready.

Two things made a fresh machine's gui stage flaky, and both are settled here rather than by polling:

- The number. Xvfb is not given one: with `-displayfd` it binds the first display whose sockets are free
  (the abstract socket is taken atomically by the kernel, so a display still being torn down, or one that
  another test is starting on, is skipped) and writes that number on the pipe once it accepts clients.
- The reset. By default an X server resets when its last client disconnects, and a reset drops every
  connection still being set up: a readiness probe (`xdotool`) or `display -window root` exiting just as
  trayer connected left trayer with "cannot open display". `-noreset` keeps the server as it is.
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from typing import IO

READY_TIMEOUT = 30.0


def start_xvfb(*args: str, log: IO[bytes]) -> tuple[str, subprocess.Popen[bytes]]:
    """Start Xvfb (extra `args`, e.g. a `-screen`) and return its DISPLAY (":N") once it accepts clients."""
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen(
            ["Xvfb", "-displayfd", str(write_end), "-noreset", "-nolisten", "tcp", *args],
            pass_fds=(write_end,),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)  # only Xvfb holds it now: its exit ends the read below
    try:
        number = read_display_number(read_end, process)
    except BaseException:
        process.kill()
        process.wait(timeout=10)
        raise
    finally:
        os.close(read_end)
    return f":{number}", process


def read_display_number(fd: int, process: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + READY_TIMEOUT
    received = b""
    while not received.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise RuntimeError(f"Xvfb gave no display number within {READY_TIMEOUT:g} s (see its log)")
        chunk = os.read(fd, 32)
        if not chunk:
            code = process.wait(timeout=10)
            raise RuntimeError(f"Xvfb exited with {code} before it was ready (see its log)")
        received += chunk
    return int(received)
