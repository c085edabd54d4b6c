"""The router's own time on a streamed request's way to its first token, by its own clock.

What a client measures through the router also holds two more hops between processes and how soon the
machine runs each; on a machine of two idle virtual CPUs that is as much as the router's code itself. These
stamps keep only the code: from the request's arrival at the application (uvicorn has parsed it) to its write
to the worker, and from the arrival of the worker's first output to its write to the client. Only a job's
first attempt counts (a replay's way is the failover's, measured apart). `failsoft bench` prints the medians
beside the time it measures from outside; `GET /failsoft/timing` gives the recent figures.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from tray_app.contract.status import PathTiming

RECENT = 1024  # figures kept (one pair per streamed request)


@dataclass(slots=True)
class FirstTokenPath:
    """`time.perf_counter()` stamps of one request; 0.0 until reached."""

    received: float  # the application got the request
    to_worker: float = 0.0  # the request written to the worker
    from_worker: float = 0.0  # the bytes of the worker's first output arrived


class PathTimings:
    """The recent requests' figures, in milliseconds. Written by the streams' tasks, read by the control API:
    one event loop, so no lock."""

    def __init__(self, keep: int = RECENT) -> None:
        self._recent: deque[tuple[float, float]] = deque(maxlen=keep)
        self.recorded = 0  # ever, so a reader can take the ones recorded since it last looked

    def record(self, path: FirstTokenPath, to_client: float) -> None:
        """`path` complete, its first output written to the client at `to_client`."""
        self._recent.append(
            ((path.to_worker - path.received) * 1000.0, (to_client - path.from_worker) * 1000.0)
        )
        self.recorded += 1

    def snapshot(self) -> PathTiming:
        """What `GET /failsoft/timing` answers: the count recorded, the recent pairs and their medians."""
        return summary(self.recorded, [list(pair) for pair in self._recent])


def summary(recorded: int, pairs: list[list[float]]) -> PathTiming:
    """`pairs` (to worker, to client) with their medians, and of their sums: the router's own share of a
    first token."""
    if not pairs:
        return PathTiming(
            recorded=recorded, recent_ms=[], requests=0, to_worker_ms=None, to_client_ms=None, total_ms=None
        )
    return PathTiming(
        recorded=recorded,
        recent_ms=pairs,
        requests=len(pairs),
        to_worker_ms=statistics.median(pair[0] for pair in pairs),
        to_client_ms=statistics.median(pair[1] for pair in pairs),
        total_ms=statistics.median(pair[0] + pair[1] for pair in pairs),
    )
