"""`failsoft bench --mirror`'s arithmetic and text, from figures written here (fast tier: no service)."""

from __future__ import annotations

from typing import Any

from tray_app.bench.mirror import FOLLOW_UP_CASE, Pause, _pause_rows, sizes_that_fit
from tray_app.bench.mirror_report import mirror_lines
from tray_app.drill.conversation import conversation, next_turn


def pause(case: str, mirror: bool, seconds: float, tokens: int = 100) -> Pause:
    return Pause(case, mirror, tokens, gpu_seconds=2.0, pause_seconds=seconds, cached_tokens=tokens)


def figures(follow_up_seconds: float, tokens: int, four_clients: float) -> dict[str, Any]:
    pauses = [
        pause("about 100", True, 0.1),
        pause("about 100", True, 0.3),
        pause(FOLLOW_UP_CASE, True, follow_up_seconds, tokens),
        pause("about 100", False, 0.5),
        pause(FOLLOW_UP_CASE, False, 10.0, tokens),
    ]
    levels = [
        {"clients": clients, "off_tokens_per_second": 20.0, "on_tokens_per_second": 20.0 * ratio}
        | {"ratio": ratio, "mirror_read_tokens": 1000}
        for clients, ratio in ((1, 0.95), (4, four_clients))
    ]
    return {
        "simulated": True,
        "cores": 2,
        "pause": {"rounds": 2, "kill_after_tokens": 5, "cases": _pause_rows(pauses)},
        "throughput": {"rounds": 2, "requests_per_client": 2, "prompt_tokens": 400, "max_tokens": 8}
        | {"levels": levels},
    }


def test_each_pause_is_a_ratio_to_the_100_token_pause_with_the_mirror_in_the_same_state() -> None:
    rows = {(row["case"], row["mirror"]): row for row in figures(0.25, 1800, 0.95)["pause"]["cases"]}
    assert rows[(FOLLOW_UP_CASE, True)]["ratio_to_100"] == 1.25  # over the median 100-token pause, 0.2 s
    assert rows[(FOLLOW_UP_CASE, False)]["ratio_to_100"] == 20.0
    assert rows[("about 1,000", True)]["measured"] == 0 and rows[("about 1,000", True)]["pause_ms"] is None


def test_the_targets_are_printed_beside_their_figures() -> None:
    text = "\n".join(mirror_lines(figures(0.25, 1800, 0.95)))
    assert "x1.25 the 100-token pause (target: at most x1.5, at least 1,200 tokens): met" in text
    assert "x0.950 of its throughput off" in text and "shares the machine's 2 cores" in text
    assert "NOT met" not in text
    short = "\n".join(mirror_lines(figures(0.25, 900, 0.85)))  # a conversation too short; a GPU slowed
    assert short.count("NOT met") == 2


def test_the_sizes_fit_one_gpu_slot_and_the_conversation_grows_by_its_answer() -> None:
    assert sizes_that_fit(8192) == ([100, 1000, 2000], 2000)
    sizes, follow_up = sizes_that_fit(2048)
    assert max(sizes) <= 2048 - 40 and follow_up + 3 * 40 < 2048
    first = conversation(1000, seed=1)
    assert first != conversation(1000, seed=2) and len(first[0]["content"]) > 3000
    turn = next_turn(first, "An answer.")
    assert turn[:2] == first and turn[2] == {"role": "assistant", "content": "An answer."}
