"""The bench's interval for a median: the right ranks, the promised coverage, and how it is printed."""

from __future__ import annotations

import math
import random

from tray_app.bench.intervals import median_interval
from tray_app.bench.report import router_lines, throughput_lines
from tray_app.bench.throughput import Run, level_figures, round_ratios


def test_the_ranks_are_the_sign_tests() -> None:
    # For 60 values the 95 % pair is the 22nd smallest and the 22nd largest (the 39th smallest).
    assert median_interval([float(n) for n in range(60, 0, -1)]) == (22.0, 39.0)
    assert median_interval([3.0, 1.0, 6.0, 2.0, 5.0, 4.0]) == (1.0, 6.0)  # six values: only the extremes


def test_too_few_values_have_no_interval() -> None:
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    assert median_interval([]) is None


def test_it_holds_the_true_median_as_often_as_it_promises() -> None:
    """Lopsided draws (exponential, median ln 2), 40 at a time: the 14th pair's exact coverage is 96.2 %;
    a rank one off either way would give 91.9 % or 98.3 %."""
    draws = random.Random(7)
    trials = 3000
    held = 0
    for _ in range(trials):
        interval = median_interval([draws.expovariate(1.0) for _ in range(40)])
        assert interval is not None
        held += interval[0] <= math.log(2) <= interval[1]
    assert 0.948 <= held / trials <= 0.976


def figures(interval: list[float] | None) -> dict[str, object]:
    row = {
        "p50_ms": 20.0,
        "p99_ms": 25.0,
        "ttft_p50_ms": 18.0,
        "stream_total_p50_ms": 19.0,
        "gap_mean_ms": 0.0,
    }
    return {
        "rounds": 60,
        "max_tokens": 1,
        "direct": row,
        "router": row,
        "added_ms": dict.fromkeys(row, 1.0),
        "ratio": dict.fromkeys(row, 1.05),
        "added_interval_ms": {"ttft_p50_ms": interval, "p50_ms": None, "stream_total_p50_ms": None},
        "router_own_ms": 1.0,
        "router_cpu_ms_per_request": None,
    }


def test_the_report_shows_the_interval_beside_its_median() -> None:
    (ttft,) = [line for line in router_lines(figures([0.81, 1.42])) if "first token" in line]
    assert ttft.endswith("+1.00 ms  x1.050  (95 %: +0.81 to +1.42 ms)")
    assert not any("95 %" in line for line in router_lines(figures(None)))


def test_throughput_is_compared_round_by_round() -> None:
    direct = [Run(tokens=100, seconds=1.0), Run(tokens=100, seconds=2.0)]
    routed = [Run(tokens=100, seconds=1.25), Run(tokens=100, seconds=2.0)]
    assert round_ratios(direct, routed) == [0.8, 1.0]  # a slow round is compared with its own pair
    row = {
        "clients": 4,
        "direct_tokens_per_second": 80.0,
        "router_tokens_per_second": 78.0,
        "ratio": 0.975,
        "ratio_interval": [0.951, 1.004],
        "direct_ttft_p50_ms": 440.0,
        "router_ttft_p50_ms": 450.0,
        "ttft_added_p50_ms": 10.0,
        "ttft_added_interval_ms": [4.5, 12.25],
    }
    printed = throughput_lines({"requests_per_client": 2, "max_tokens": 64, "rounds": 10, "levels": [row]})
    assert "x0.975 (95 %: x0.951 to x1.004)" in printed[1]
    assert "(added +10.00 ms, 95 %: +4.50 to +12.25 ms: the median of the rounds' differences)" in printed[1]


def test_the_added_time_to_first_token_is_paired_by_round() -> None:
    # Each round's worker TTFT drifts by 100 ms; the router adds 1 ms to each of them, 6 ms in one round.
    direct = [Run(tokens=64, seconds=1.0, first_token=[0.1 * n, 0.1 * n + 0.002]) for n in range(1, 9)]
    routed = [
        Run(tokens=64, seconds=1.0, first_token=[t + (0.006 if n == 3 else 0.001) for t in d.first_token])
        for n, d in enumerate(direct)
    ]
    row = level_figures(1, direct, routed, ("direct", "router"))
    assert row["ttft_added_p50_ms"] == 1.0
    assert row["ttft_added_interval_ms"] == [1.0, 6.0]  # eight rounds: the 95 % pair is the extremes
    too_few = level_figures(1, direct[:5], routed[:5], ("direct", "router"))
    assert too_few["ttft_added_p50_ms"] == 1.0 and too_few["ttft_added_interval_ms"] is None
