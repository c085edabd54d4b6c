"""The badge under an answer: who served it, why, and how fast."""

from __future__ import annotations

import pytest

from tray_app.ui.chat import Badge, answer_badge


@pytest.mark.parametrize(
    ("failsoft", "simulated", "expected"),
    [
        (
            {"worker": "gpu", "attempts": 1, "fallback_reason": None},
            True,
            Badge("gpu", "GPU (simulated) · 40.0 tok/s"),
        ),
        ({"worker": "gpu", "attempts": 1, "fallback_reason": None}, False, Badge("gpu", "GPU · 40.0 tok/s")),
        (
            {"worker": "cpu", "attempts": 2, "fallback_reason": "oom_decode"},
            True,
            Badge("failover", "Failed over to CPU: GPU out of memory · 40.0 tok/s"),
        ),
        (
            {"worker": "cpu", "attempts": 1, "fallback_reason": "exceeds_gpu_profile"},
            True,
            Badge("cpu", "CPU: too large for the GPU profile · 40.0 tok/s"),
        ),
        (
            {"worker": "cpu", "attempts": 1, "fallback_reason": "approval_required"},
            True,
            Badge("cpu", "CPU, approved by you · 40.0 tok/s"),
        ),
    ],
)
def test_badge_names_worker_reason_and_speed(
    failsoft: dict[str, object], simulated: bool, expected: Badge
) -> None:
    badge = answer_badge(failsoft, tokens=80, seconds=2.0, simulated=simulated)
    assert (badge.kind, badge.text) == (expected.kind, expected.text)


def test_tooltip_spells_out_the_reason_code() -> None:
    badge = answer_badge({"worker": "cpu", "attempts": 2, "fallback_reason": "crash_abort"}, 10, 1.0)
    assert badge.detail == "Reason: the GPU worker crashed (crash_abort); attempts: 2"


def test_no_rate_from_a_single_token() -> None:
    assert answer_badge({"worker": "gpu", "attempts": 1}, tokens=1, seconds=0.5).text == "GPU"
