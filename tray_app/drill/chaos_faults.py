"""The GPU worker's faults during the chaos mix: SIGKILL and the `hang` fault in turn, at intervals, each
while requests stream from it (`POST /failsoft/debug/faults`: a service started with --enable-faults, the
admin token). A hang still armed when the mix ends is cleared, so the service is left without one."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

BUSY_WAIT = 5.0  # seconds a fault waits for a request on the GPU worker before it is skipped
FIRE_WAIT = 15.0  # seconds a hang has to go off once the mix ended before it is cleared


@dataclass
class FaultTally:
    kills: int = 0
    hangs: int = 0
    skipped: int = 0  # no request on the GPU worker, or it was restarting
    in_flight: list[int] = field(default_factory=list)  # requests on the GPU worker as each went in
    pending_hang: int | None = None  # the pid a hang was armed on, until it went off

    def to_dict(self) -> dict[str, Any]:
        return {"kills": self.kills, "hangs": self.hangs, "skipped": self.skipped}


async def _gpu(http: httpx.AsyncClient) -> dict[str, Any]:
    response = await http.get("/failsoft/status", timeout=10)
    response.raise_for_status()
    worker: dict[str, Any] = (response.json().get("workers") or {}).get("gpu") or {}
    return worker


async def _busy_gpu(http: httpx.AsyncClient, stop: asyncio.Event) -> dict[str, Any] | None:
    """The GPU worker once it is ready with a request on it; None if that did not happen soon."""
    deadline = time.monotonic() + BUSY_WAIT
    while time.monotonic() < deadline and not stop.is_set():
        with contextlib.suppress(httpx.HTTPError, ValueError):
            worker = await _gpu(http)
            if worker.get("state") == "ready" and int(worker.get("in_flight") or 0) >= 1:
                return worker
        await asyncio.sleep(0.05)
    return None


async def _arm(http: httpx.AsyncClient, kind: str, after: int) -> dict[str, Any] | None:
    try:
        response = await http.post(
            "/failsoft/debug/faults", json={"role": "gpu", "kind": kind, "after_tokens": after}, timeout=10
        )
    except httpx.HTTPError:
        return None
    answer: dict[str, Any] = response.json() if response.status_code == 200 else {}
    return answer or None


async def inject_faults(
    http: httpx.AsyncClient, stop: asyncio.Event, every: tuple[float, float], chooser: random.Random
) -> FaultTally:
    """Kill, then hang, then kill... every `every` seconds (a random pause in that range) until `stop`."""
    tally = FaultTally()
    kinds = ("kill", "hang")
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), chooser.uniform(*every))
                break
            kind = kinds[(tally.kills + tally.hangs + tally.skipped) % len(kinds)]
            worker = await _busy_gpu(http, stop)
            # A kill with after_tokens 0 is SIGKILL at once; a hang goes off within a few tokens.
            armed = await _arm(http, kind, 0 if kind == "kill" else chooser.randint(0, 3)) if worker else None
            if armed is None:
                tally.skipped += 1
                continue
            tally.in_flight.append(int((worker or {}).get("in_flight") or 0))
            if kind == "kill":
                tally.kills += 1
            else:
                tally.hangs += 1
                tally.pending_hang = int(armed.get("pid") or 0) or None
    finally:
        await _clear_pending_hang(http, tally)
    return tally


async def _clear_pending_hang(http: httpx.AsyncClient, tally: FaultTally) -> None:
    """A hang armed on a worker that served no more tokens is still armed: once that worker is replaced
    (the hang went off) there is nothing to do; else it is killed, which disarms it."""
    if tally.pending_hang is None:
        return
    deadline = time.monotonic() + FIRE_WAIT
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            if (await _gpu(http)).get("pid") != tally.pending_hang:
                tally.pending_hang = None
                return
        await asyncio.sleep(0.2)
    if await _arm(http, "kill", 0) is not None:
        tally.kills += 1
    tally.pending_hang = None
