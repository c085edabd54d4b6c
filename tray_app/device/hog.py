"""`failsoft hog SIZE --name NAME`: take simulated VRAM from a running simulated GPU, as another program
(ComfyUI, a game) would take it on a real card, hold it, and give it back on exit.

Held until SIGINT or SIGTERM, or for `--hold` seconds. A hog killed with SIGKILL gives nothing back itself:
the ledger drops a dead process's holding when it is next read, as a driver frees a killed process's memory.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from types import FrameType

from tray_app.contract.sizes import format_size, parse_size
from tray_app.device.ledger import Ledger, NoSimulatedDevice


def _fail(message: str) -> int:
    print(f"failsoft hog: {message}", file=sys.stderr, flush=True)
    return 1


def _hold(stop: threading.Event, seconds: float | None) -> None:
    """Until `stop` is set or `seconds` pass; short waits, so a signal is acted on promptly on any OS."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while not stop.is_set():
        left = 1.0 if deadline is None else deadline - time.monotonic()
        if left <= 0:
            return
        stop.wait(min(left, 1.0))


def run(args: argparse.Namespace) -> int:
    try:
        size = parse_size(args.size)
    except ValueError as error:
        return _fail(str(error))
    if args.hold is not None and args.hold < 0:
        return _fail("--hold takes a number of seconds >= 0")
    ledger = Ledger()
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    # Installed before taking, so a signal that comes right after the take still gives the memory back.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            state = ledger.take(args.name, size)
        except NoSimulatedDevice as error:
            return _fail(f"{error}; start one with `failsoft serve --simulate-vram 8GiB`")
        except MemoryError as error:
            return _fail(str(error))
        until = f"for {args.hold:g} s" if args.hold is not None else "until Ctrl-C or SIGTERM"
        print(
            f"failsoft hog: {args.name} (pid {os.getpid()}) holds {format_size(size)} of {state.name} "
            f"({format_size(state.free_bytes)} of {format_size(state.total_bytes)} left free), {until}",
            flush=True,
        )
        try:
            _hold(stop, args.hold)
        finally:
            released = ledger.release(args.name)
        print(f"failsoft hog: {args.name} gave back {format_size(released)}", flush=True)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
