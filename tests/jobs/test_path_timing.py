"""The router's record of its own time on streams' way to their first token."""

from __future__ import annotations

from tray_app.jobs.path_timing import FirstTokenPath, PathTimings


def path(received: float, to_worker: float, from_worker: float) -> FirstTokenPath:
    return FirstTokenPath(received=received, to_worker=to_worker, from_worker=from_worker)


def test_each_stream_gives_its_two_parts_in_milliseconds_and_their_medians() -> None:
    timings = PathTimings()
    timings.record(path(10.0, 10.0004, 10.0204), to_client=10.0206)  # 0.4 ms, then 0.2 ms
    timings.record(path(20.0, 20.0006, 20.0306), to_client=20.0310)  # 0.6 ms, then 0.4 ms
    timings.record(path(30.0, 30.0005, 30.0105), to_client=30.0108)  # 0.5 ms, then 0.3 ms

    snapshot = timings.snapshot()

    assert snapshot["recorded"] == snapshot["requests"] == 3
    assert [[round(a, 3), round(b, 3)] for a, b in snapshot["recent_ms"]] == [
        [0.4, 0.2],
        [0.6, 0.4],
        [0.5, 0.3],
    ]
    assert round(snapshot["to_worker_ms"] or 0, 3) == 0.5
    assert round(snapshot["to_client_ms"] or 0, 3) == 0.3
    assert round(snapshot["total_ms"] or 0, 3) == 0.8  # the median of the sums: 0.6, 1.0, 0.8


def test_only_the_recent_are_kept_while_the_count_goes_on() -> None:
    timings = PathTimings(keep=2)
    for start in (1.0, 2.0, 3.0):
        timings.record(path(start, start + 0.001, start + 0.011), to_client=start + 0.012)

    snapshot = timings.snapshot()

    assert snapshot["recorded"] == 3 and snapshot["requests"] == 2 and len(snapshot["recent_ms"]) == 2


def test_before_any_stream_there_is_nothing_to_take_a_median_of() -> None:
    snapshot = PathTimings().snapshot()

    assert snapshot["recorded"] == snapshot["requests"] == 0 and snapshot["recent_ms"] == []
    assert (
        snapshot["to_worker_ms"] is None and snapshot["to_client_ms"] is None and snapshot["total_ms"] is None
    )
