"""The watcher's own cost per poll, for `failsoft bench`: a reading, the comparison and the ring, timed in
the calling thread (its CPU clock counts the driver's system time on that thread too)."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tray_app.device.ledger import Ledger
from tray_app.device.sources import DeviceSource, LedgerSource, NvmlSource, SourceUnavailable
from tray_app.device.watcher import DeviceWatcher

MIB = 1024 * 1024
DEFAULT_POLLS = 500


@dataclass(frozen=True)
class PollCost:
    polls: int
    cpu_seconds: float  # per poll, this thread's CPU (user and system)
    wall_seconds: float  # per poll

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_poll_cost(source: DeviceSource, polls: int = DEFAULT_POLLS) -> PollCost:
    """What one poll of `source` costs a watcher, averaged over `polls` (after one untimed warm-up)."""
    if polls < 1:
        raise ValueError(f"polls must be at least 1, got {polls}")
    watcher = DeviceWatcher(source)
    watcher.poll_once()  # first reading: process names looked up, lazy imports done
    cpu, wall = time.thread_time(), time.perf_counter()
    for _ in range(polls):
        watcher.poll_once()
    return PollCost(
        polls=polls,
        cpu_seconds=(time.thread_time() - cpu) / polls,
        wall_seconds=(time.perf_counter() - wall) / polls,
    )


def ledger_poll_cost(polls: int = DEFAULT_POLLS, holders: int = 3) -> PollCost:
    """A watcher on a scratch simulated GPU (its own file, not the running service's) with `holders`
    labelled holdings of this process, as a service with a worker and a drill's pressure would have."""
    with tempfile.TemporaryDirectory(prefix="failsoft-ledger-") as folder:
        ledger = Ledger(Path(folder) / "ledger.json")
        ledger.create(64 * 1024 * MIB)
        for index in range(holders):
            ledger.take(f"holder-{index}", 256 * MIB)
        return measure_poll_cost(LedgerSource(ledger, own_pids=lambda: {os.getpid()}), polls)


def watcher_cost_figures(polls: int = DEFAULT_POLLS) -> dict[str, Any]:
    """Cost per poll on the simulated GPU's ledger, and through NVML where there is an NVIDIA GPU."""
    figures: dict[str, Any] = {"poll_seconds": 1.0, "ledger": ledger_poll_cost(polls).to_dict()}
    try:
        source = NvmlSource()
    except SourceUnavailable as error:
        figures["nvml"] = {"absent": str(error)}
    else:
        try:
            figures["nvml"] = measure_poll_cost(source, polls).to_dict()
        finally:
            source.close()
    return figures


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} µs"


def watcher_cost_lines(figures: dict[str, Any] | None) -> list[str]:
    """The bench's line (after a blank one): CPU per poll, and the share of one core at one poll a second."""
    if not figures:
        return []
    parts = []
    for name, label in (("ledger", "simulated GPU's ledger"), ("nvml", "NVML")):
        cost = figures.get(name) or {}
        if "cpu_seconds" in cost:
            share = cost["cpu_seconds"] / figures.get("poll_seconds", 1.0) * 100
            parts.append(
                f"{label} {_us(cost['cpu_seconds'])} CPU ({_us(cost['wall_seconds'])} wall, "
                f"{share:.3f} % of a core)"
            )
        elif "absent" in cost:
            parts.append(f"{label} not measured ({cost['absent']})")
    return ["", f"device watcher, per poll: {'; '.join(parts)}"]
