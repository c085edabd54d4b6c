"""The chaos mix's figures: requests by kind and outcome, failovers, faults; one line each when printed."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from tray_app.drill.chaos import MixResult
from tray_app.drill.invariants import Observed


@dataclass
class Figures:
    """Added up over one mix or many (a soak's rounds)."""

    requests: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    failovers: int = 0  # jobs that needed more than one attempt
    answered_after_failover: int = 0  # of those, answered all the same
    kills: int = 0
    hangs: int = 0
    skipped_faults: int = 0
    gpu_restarts: int = 0
    seconds: float = 0.0

    def add(self, result: MixResult, observed: Observed) -> None:
        for sent in result.sents:
            self.requests[sent.kind][sent.outcome or "unknown"] += 1
        retried = [record for record in observed.jobs.values() if int(record.get("attempts") or 0) > 1]
        self.failovers += len(retried)
        self.answered_after_failover += sum(record.get("state") == "completed" for record in retried)
        self.kills += result.faults.kills
        self.hangs += result.faults.hangs
        self.skipped_faults += result.faults.skipped
        self.gpu_restarts += result.gpu_restarts
        self.seconds += result.seconds

    @property
    def total(self) -> int:
        return sum(sum(outcomes.values()) for outcomes in self.requests.values())

    def lines(self) -> list[str]:
        outcomes: Counter[str] = Counter()
        for counter in self.requests.values():
            outcomes.update(counter)
        by_kind = "; ".join(
            f"{kind} {', '.join(f'{outcome} {n}' for outcome, n in sorted(counts.items()))}"
            for kind, counts in sorted(self.requests.items())
        )
        overall = ", ".join(f"{outcome} {n}" for outcome, n in sorted(outcomes.items()))
        return [
            f"requests {self.total} in {self.seconds:.0f}s: {overall}",
            f"by kind: {by_kind}",
            f"faults: {self.kills} kills, {self.hangs} hangs ({self.skipped_faults} skipped: no request "
            f"on the GPU worker); GPU worker restarts {self.gpu_restarts}; failovers {self.failovers} "
            f"({self.answered_after_failover} answered after one)",
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": {kind: dict(counts) for kind, counts in self.requests.items()},
            "failovers": self.failovers,
            "answered_after_failover": self.answered_after_failover,
            "kills": self.kills,
            "hangs": self.hangs,
            "skipped_faults": self.skipped_faults,
            "gpu_restarts": self.gpu_restarts,
            "seconds": round(self.seconds, 1),
        }
