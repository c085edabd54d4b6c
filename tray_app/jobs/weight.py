"""What a value holds in memory, estimated in bounded time: the registry weighs each finished job it keeps
(its body and its answer) against a byte budget. Exact sizes would cost as much as encoding the answer,
several hundred milliseconds on the event loop for one with log probabilities."""

from __future__ import annotations

import itertools
import sys
from typing import Any

SAMPLED = 32  # items of a long list or dict weighed; the rest count as their mean
NODES = 4096  # values weighed in all (each at its own size only once these are spent)


def approx_bytes(value: Any) -> int:
    """`value`'s size in memory: it and everything it holds (`sys.getsizeof`), walking every item of a list
    or dict of up to SAMPLED items and SAMPLED of a longer one (a list's evenly spaced), counted as its
    length times their mean. A long list of alike items (an answer's per-token log probabilities) is weighed
    well; one huge item among many small ones may be missed."""
    return _weigh(value, [NODES])


def _weigh(value: Any, budget: list[int]) -> int:
    own = sys.getsizeof(value)
    budget[0] -= 1
    if budget[0] <= 0 or not isinstance(value, list | tuple | dict) or not value:
        return own
    count = len(value)
    items: list[Any]
    if isinstance(value, dict):
        items = list(itertools.chain.from_iterable(itertools.islice(value.items(), SAMPLED)))
    elif count <= SAMPLED:
        items = list(value)
    else:
        items = [value[index * count // SAMPLED] for index in range(SAMPLED)]
    held = sum(_weigh(item, budget) for item in items)
    return own + held * count // min(count, SAMPLED)
