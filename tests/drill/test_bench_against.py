"""`failsoft bench --against URL`: the other server's address as a user gives it, the paired figures, and
how they are printed."""

from __future__ import annotations

from tray_app.bench.against import other_target
from tray_app.bench.report import against_lines
from tray_app.bench.throughput import Run, level_figures


def test_the_other_servers_address_is_taken_with_or_without_v1() -> None:
    for url in ("http://127.0.0.1:11434", "http://127.0.0.1:11434/", "http://127.0.0.1:11434/v1"):
        target = other_target(url, "llama3.2:1b")
        assert (target.base_url, target.model) == ("http://127.0.0.1:11434", "llama3.2:1b")
        assert target.headers == {"Connection": "close"}  # a closed event-stream connection is never reused
        assert target.cache_prompt is None  # each server keeps its own prompt cache, as it comes


def test_each_side_is_named_and_the_ratio_is_paired_by_round() -> None:
    other = [
        Run(tokens=100, seconds=2.0, first_token=[0.05]),
        Run(tokens=100, seconds=1.0, first_token=[0.07]),
    ]
    failsoft = [
        Run(tokens=100, seconds=1.0, first_token=[0.04]),
        Run(tokens=100, seconds=1.0, first_token=[0.05]),
    ]
    figures = level_figures(4, other, failsoft, ("other", "failsoft"))
    assert (figures["other_tokens_per_second"], figures["failsoft_tokens_per_second"]) == (75.0, 100.0)
    # Round ratios 2.0 and 1.0: their median, not the ratio of the medians (100 / 75).
    assert figures["ratio"] == 1.5 and figures["ratio_interval"] is None  # two rounds: no interval
    assert (figures["other_ttft_p50_ms"], figures["failsoft_ttft_p50_ms"]) == (60.0, 45.0)
    lines = against_lines(
        {
            "failsoft": "http://127.0.0.1:8750",
            "against": "http://127.0.0.1:11434",
            "model": "llama3.2:1b",
            "rounds": 2,
            "requests_per_client": 4,
            "max_tokens": 64,
            "levels": [figures],
        }
    )
    assert lines[0].startswith("throughput: http://127.0.0.1:11434 (model 'llama3.2:1b') -> Failsoft at")
    assert lines[1] == "  4 clients      75.0 ->    100.0 tokens/s  x1.500   TTFT p50 60.00 ms -> 45.00 ms"
