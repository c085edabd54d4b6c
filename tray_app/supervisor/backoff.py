"""Restart delays: exponential with a cap, forgiven after a stable period. Pure, with time passed in."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Backoff:
    """How long to wait before the next start after a failure.

    After a stable run the first restart is immediate (a crash in the middle of a good day should cost as
    little as possible), except after a load-time out-of-memory: loading again at once would fail the same
    way, so that always waits at least `initial`. Each further failure in a row doubles the wait, up to `cap`.
    A worker that stayed ready for `stable_after` seconds starts again from zero.
    """

    initial: float
    cap: float
    stable_after: float
    failures: int = 0  # failures in a row, since the last stable run
    ready_since: float | None = None

    def note_ready(self, now: float) -> None:
        self.ready_since = now

    def note_failure(self, now: float, load_failure: bool) -> float:
        """Count a failure at `now` and return the seconds to wait before the next start."""
        if self.ready_since is not None and now - self.ready_since >= self.stable_after:
            self.failures = 0
        self.ready_since = None
        self.failures += 1
        exponent = self.failures - 1 if load_failure else self.failures - 2
        if exponent < 0:
            return 0.0
        return min(self.cap, self.initial * 2.0**exponent)

    def reset(self) -> None:
        self.failures = 0
        self.ready_since = None
