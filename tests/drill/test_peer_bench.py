"""`failsoft bench --peer`: its arithmetic and text from figures written here (fast), and one real run of one
round on the smallest prompt (three services: a service, its peer, the same service alone), whose report has
the shape the docs' table reads, with no timed assertion."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tray_app import cli
from tray_app.bench import peer
from tray_app.bench.peer import SIDES, Pause, pause_rows, sizes_that_fit
from tray_app.bench.peer_report import peer_lines


def figures(pauses: list[Pause], sizes: list[int], rounds: int = 2) -> dict[str, Any]:
    return {
        "simulated": True,
        "cores": 2,
        "rounds": rounds,
        "kill_after_tokens": 5,
        "answer_tokens": 40,
        "n_ctx_per_seq": 2560,
        "sides": list(SIDES),
        "cases": pause_rows(pauses, sizes),
    }


def test_each_size_gives_the_peers_pause_over_the_cpus_without_and_with_the_mirror() -> None:
    pauses = [
        Pause("peer", 100, 97, 0.4, None),
        Pause("peer", 100, 97, 0.6, None),
        Pause("cpu", 100, 97, 1.0, 0),
        Pause("cpu+mirror", 100, 97, 0.25, 97),
        Pause("peer", 1000, 1001, 6.0, None),
        Pause("cpu+mirror", 1000, 1001, 0.2, 1001),
    ]
    small, large = figures(pauses, [100, 1000])["cases"]
    assert (small["peer_ms"], small["cpu_ms"], small["cpu_mirror_ms"]) == (500.0, 1000.0, 250.0)
    assert (small["peer_over_cpu"], small["peer_over_cpu_mirror"]) == (0.5, 2.0)
    assert small["measured"] == {"peer": 2, "cpu": 1, "cpu+mirror": 1} and small["prompt_tokens"] == 97
    assert small["mirror_cached_tokens"] == 97
    # A side with nothing measured has no pause and no ratio; the others stand.
    assert (
        large["cpu_ms"] is None and large["peer_over_cpu"] is None and large["peer_over_cpu_mirror"] == 30.0
    )


def test_the_table_has_a_row_per_size_and_says_what_was_not_measured() -> None:
    pauses = [Pause(side, 100, 97, 0.5, None) for side in SIDES for _ in range(2)]
    pauses += [Pause("peer", 1000, 1001, 6.0, None)]
    lines = peer_lines(figures(pauses, [100, 1000]))
    assert lines[0].startswith("failover pause by the next rung: the local GPU worker killed after its 5th")
    (small,) = [line for line in lines if line.startswith("  about 100 ")]
    assert "500 ms" in small and "x1.00" in small and "measured" not in small
    (large,) = [line for line in lines if line.startswith("  about 1,000 ")]
    assert "6,000 ms" in large and "(measured: peer 1/2, cpu 0/2, cpu+mirror 0/2)" in large
    assert "both GPUs simulated" in lines[-1] and "2 cores" in lines[-1]
    assert peer_lines(None) == []


def test_the_sizes_fit_one_gpu_slot_with_the_answer() -> None:
    assert sizes_that_fit((100, 1000, 2000), 2560) == [100, 1000, 2000]
    assert sizes_that_fit((100, 1000, 2000), 512) == [100, 372, 372]


def test_the_option_is_parsed() -> None:
    args = cli.build_parser().parse_args(["bench", "--peer", "--rounds", "6"])
    assert args.peer and args.rounds == 6


@pytest.mark.integration
def test_one_round_on_the_smallest_prompt_gives_every_side(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(peer, "SIZES", (100,))
    assert cli.main(["bench", "--peer", "--rounds", "1", "--simulate-vram", "4GiB", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    figures = results["peer"]
    assert (figures["rounds"], figures["simulated"], figures["sides"]) == (1, True, list(SIDES))
    (row,) = figures["cases"]
    assert row["size"] == 100 and 50 < row["prompt_tokens"] < 150
    assert row["measured"] == {side: 1 for side in SIDES}, row  # the peer, then this CPU, took each over
    for key in ("peer_ms", "cpu_ms", "cpu_mirror_ms", "peer_over_cpu", "peer_over_cpu_mirror"):
        assert isinstance(row[key], float) and row[key] > 0, (key, row)
    lines = peer_lines(figures)
    assert any(line.startswith("  about 100 ") for line in lines)
    (saved,) = (tmp_path / "data" / "reports").glob("bench-peer-*.json")
    assert json.loads(saved.read_text()) == results
