"""The service's memory through a soak: the RSS of the `failsoft serve` process alone and with its workers
(every process under it), sampled at intervals; start, end, max and growth per hour of each."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from tray_app.contract.sizes import format_size

SAMPLE_EVERY = 5.0


@dataclass(frozen=True)
class Sample:
    at: float  # monotonic seconds
    serve: int  # bytes: the serve process
    total: int  # bytes: it and every process under it (its workers)


def serve_pid_of(status: dict[str, Any]) -> int | None:
    """The serve process of a service found by URL: its GPU (or CPU) worker's parent."""
    for role in ("gpu", "cpu"):
        pid = ((status.get("workers") or {}).get(role) or {}).get("pid")
        if pid:
            with contextlib.suppress(psutil.Error):
                return int(psutil.Process(int(pid)).ppid())
    return None


def sample(pid: int) -> Sample | None:
    try:
        process = psutil.Process(pid)
        serve = int(process.memory_info().rss)
        total = serve
        for child in process.children(recursive=True):
            with contextlib.suppress(psutil.Error):  # a worker killed a moment ago
                total += int(child.memory_info().rss)
    except psutil.Error:
        return None
    return Sample(time.monotonic(), serve, total)


def growth_per_hour(points: list[tuple[float, int]]) -> float:
    """Bytes per hour: the least-squares slope through (seconds, bytes); 0 with fewer than two points."""
    if len(points) < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / len(points)
    mean_b = sum(b for _, b in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return 0.0
    return sum((t - mean_t) * (b - mean_b) for t, b in points) / spread * 3600.0


@dataclass
class MemoryWatch:
    """Samples `pid` every `every` seconds while `run` runs; `warm_at` marks where growth is measured from
    (after the first round: the embeddings worker and the caches start in it)."""

    pid: int | None
    every: float = SAMPLE_EVERY
    samples: list[Sample] = field(default_factory=list)
    warm_at: float | None = None

    def take(self) -> Sample | None:
        found = sample(self.pid) if self.pid else None
        if found is not None:
            self.samples.append(found)
        return found

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.take()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every)

    def warmed(self) -> None:
        self.warm_at = time.monotonic()

    def figures(self, which: str) -> dict[str, float]:
        values = [(s.at, s.serve if which == "serve" else s.total) for s in self.samples]
        if not values:
            return {}
        warm = [point for point in values if self.warm_at is None or point[0] >= self.warm_at]
        return {
            "start": values[0][1],
            "end": values[-1][1],
            "max": max(b for _, b in values),
            "growth_per_hour": growth_per_hour(warm or values),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "samples": len(self.samples),
            **{w: self.figures(w) for w in ("serve", "total")},
        }

    def lines(self) -> list[str]:
        if not self.samples:
            return [f"memory: not measured (no access to the service's process {self.pid})"]
        out = []
        for which, label in (("serve", "serve process"), ("total", "serve + workers")):
            f = self.figures(which)
            growth = f["growth_per_hour"]
            out.append(
                f"memory ({label}, RSS): start {format_size(f['start'])}, end {format_size(f['end'])}, "
                f"max {format_size(f['max'])}, growth {'+' if growth >= 0 else ''}{format_size(growth)}/h"
            )
        out.append(
            f"   {len(self.samples)} samples every {self.every:.0f}s; growth: least-squares, after round 1"
        )
        return out
