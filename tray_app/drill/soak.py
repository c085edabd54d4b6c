"""`failsoft drill --soak MINUTES`: the chaos mix in rounds for as long as asked; after each round the
invariants and the service's memory, at the end the totals, the memory's growth and every invariant over all
rounds. It held only if every invariant held after every round."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from tray_app.contract.sizes import format_size
from tray_app.drill.chaos import MixPlan, run_mix
from tray_app.drill.chaos_observe import observe
from tray_app.drill.chaos_summary import Figures
from tray_app.drill.client import DrillError, ServiceClient
from tray_app.drill.invariants import InvariantReport, check
from tray_app.drill.soak_memory import MemoryWatch, Sample

# One round: a couple of minutes of the mix on two cores, then the service is checked at rest.
ROUND = MixPlan(requests=120, clients=6, seconds=240.0, request_timeout=240.0)
WAIT_NOTED = 10.0  # seconds of waiting for the workers before a round that are worth a line

Emit = Callable[[str], None]


def soak_minutes(args: argparse.Namespace) -> float | None:
    """`--soak MINUTES` as a number of minutes (None without it); ValueError for a bad combination."""
    minutes = getattr(args, "soak", None)
    if minutes is None:
        return None
    if not minutes > 0:
        raise ValueError(f"--soak takes a positive number of minutes, not {minutes}")
    if getattr(args, "scenario", None) or getattr(args, "pressure", None):
        raise ValueError("--soak runs the chaos mix on its own: leave out --scenario and --pressure")
    return float(minutes)


@dataclass
class RoundRecord:
    number: int
    minute: float  # when it ended, from the soak's start
    report: InvariantReport
    figures: Figures
    memory: Sample | None

    def lines(self) -> list[str]:
        memory = (
            f"; memory {format_size(self.memory.serve)} serve, {format_size(self.memory.total)} with workers"
            if self.memory
            else ""
        )
        held = "all invariants held" if self.report.held else f"{len(self.report.broken)} invariants BROKEN"
        head = f"round {self.number} (at {self.minute:.1f} min): {held}{memory}"
        return [
            head,
            *(f"   {line}" for line in self.figures.lines()),
            *(f"   {line}" for line in self.report.lines()),
        ]


@dataclass
class SoakResult:
    minutes: float
    rounds: list[RoundRecord] = field(default_factory=list)
    totals: Figures = field(default_factory=Figures)
    memory: MemoryWatch = field(default_factory=lambda: MemoryWatch(None))
    seconds: float = 0.0
    error: str = ""  # why it ended before its time

    @property
    def held(self) -> bool:
        return bool(self.rounds) and not self.error and all(record.report.held for record in self.rounds)

    def invariant_lines(self) -> list[str]:
        """Each invariant over every round: held in all, or the rounds that broke it and the first detail."""
        if not self.rounds:
            return ["no round finished: nothing was checked"]
        lines = []
        for index, first in enumerate(self.rounds[0].report.checks):
            broken = [r for r in self.rounds if not r.report.checks[index].held]
            if not broken:
                lines.append(f"ok   {first.name} (after each of {len(self.rounds)} rounds)")
                continue
            numbers = ", ".join(str(r.number) for r in broken)
            lines.append(f"FAIL {first.name}: rounds {numbers}: {broken[0].report.checks[index].detail}")
        return lines

    def lines(self) -> list[str]:
        return [
            f"soak: {self.seconds / 60:.1f} min ({self.minutes:g} asked), {len(self.rounds)} rounds",
            *self.totals.lines(),
            *self.memory.lines(),
            "invariants:",
            *(f"   {line}" for line in self.invariant_lines()),
            *([f"ended early: {self.error}"] if self.error else []),
            f"soak {'PASSED: every invariant held' if self.held else 'FAILED'}",
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "minutes": self.minutes,
            "seconds": round(self.seconds, 1),
            "passed": self.held,
            "error": self.error,
            "totals": self.totals.to_dict(),
            "memory": self.memory.to_dict(),
            "rounds": [
                {
                    "number": r.number,
                    "minute": round(r.minute, 2),
                    "invariants": r.report.to_dict(),
                    **r.figures.to_dict(),
                }
                for r in self.rounds
            ],
        }


async def _round(
    client: ServiceClient, number: int, plan: MixPlan, deadline: float, result: SoakResult
) -> RoundRecord:
    mix = await run_mix(client, replace(plan, seconds=min(plan.seconds, deadline - time.monotonic())))
    observed = await observe(client, mix.sents)
    figures = Figures()
    figures.add(mix, observed)
    result.totals.add(mix, observed)
    if number == 1:
        result.memory.warmed()
    return RoundRecord(number, 0.0, check(mix.sents, observed), figures, result.memory.take())


async def soak(
    client: ServiceClient, minutes: float, serve_pid: int | None, emit: Emit, template: MixPlan = ROUND
) -> SoakResult:
    """Rounds of the mix until `minutes` have passed (no round starts a request after that)."""
    started = time.monotonic()
    deadline = started + minutes * 60
    result = SoakResult(minutes, memory=MemoryWatch(serve_pid))
    stop = asyncio.Event()
    sampler = asyncio.create_task(result.memory.run(stop))
    try:
        while (left := deadline - time.monotonic()) > 0:
            number = len(result.rounds) + 1
            waited = time.monotonic()
            try:
                await client.wait_ready(timeout=left)
            except DrillError as error:
                result.error = f"before round {number}: {error}"
                break
            if (waited := time.monotonic() - waited) > WAIT_NOTED:
                emit(f"round {number}: waited {waited:.0f}s for both workers to be ready")
            if deadline <= time.monotonic():
                break
            try:
                record = await _round(client, number, replace(template, seed=number), deadline, result)
            except (DrillError, httpx.HTTPError) as error:
                result.error = f"round {number} could not finish: {error!r}"
                break
            record.minute = (time.monotonic() - started) / 60
            result.rounds.append(record)
            for line in record.lines():
                emit(line)
    finally:
        stop.set()
        await sampler
    result.seconds = time.monotonic() - started
    return result
