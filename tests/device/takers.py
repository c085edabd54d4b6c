"""Functions run in separate processes (spawned, so nothing of the test process is inherited) that take
from a ledger the way another program would."""

from __future__ import annotations

import os
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path

from tray_app.device.ledger import Ledger


def take_one_slot(
    path: str, size: int, start: Event, release: Event, results: Queue[tuple[int, bool]]
) -> None:
    """Try to take `size` once, all takers at the same moment; report whether it fitted; hold until told."""
    ledger = Ledger(Path(path))
    start.wait()
    try:
        ledger.take("slot", size)
        results.put((os.getpid(), True))
    except MemoryError:
        results.put((os.getpid(), False))
    release.wait()
    ledger.release("slot")


def take_many(path: str, count: int, start: Event, release: Event, done: Queue[int]) -> None:
    """`count` holdings of one byte each, taken one after another as fast as possible."""
    ledger = Ledger(Path(path))
    start.wait()
    for index in range(count):
        ledger.take(f"label-{index}", 1)
    done.put(os.getpid())
    release.wait()
