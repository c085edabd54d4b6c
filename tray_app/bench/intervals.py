"""How far a bench median can be trusted: a confidence interval for a median that assumes nothing about the
distribution (on a shared machine the timings have long, lopsided tails)."""

from __future__ import annotations

from collections.abc import Sequence
from math import comb


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """The sign-test interval: the k-th smallest and k-th largest of `values`, with k the largest rank for
    which the pair holds the true median with at least `confidence`. It assumes only independent draws.
    None when there are too few values for any such pair (fewer than 6 at 95 %)."""
    count = len(values)
    tail = (1.0 - confidence) / 2
    rank = 0
    below = 0.0  # P(Binomial(count, 1/2) <= rank - 1): the chance the median lies below the rank-th value
    while rank < count:
        below += comb(count, rank) / 2**count
        if below > tail:
            break
        rank += 1
    if rank == 0:
        return None
    ordered = sorted(values)
    return ordered[rank - 1], ordered[count - rank]
