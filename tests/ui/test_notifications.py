"""Tray messages: one per burst, the most important first, approval messages open the approvals window."""

from __future__ import annotations

import time
from typing import Any

from pytestqt.qtbot import QtBot

from tray_app.ui.notifications import Notice, NotificationCenter, coalesce


def fallback(job: str, reason: str = "oom_decode", to: str | None = None) -> dict[str, Any]:
    """As an older service sends it without `to` (the CPU), else with it."""
    event = {"type": "fallback_started", "job_id": job, "reason": reason, "at": time.time()}
    return event if to is None else {**event, "to": to}


def approval(job: str, seconds: float = 42.0) -> dict[str, Any]:
    return {
        "type": "approval_needed",
        "job_id": job,
        "estimated_seconds": seconds,
        "model": "qwen3-14b",
        "prompt_tokens": 5210,
        "at": time.time(),
    }


def test_single_fallback_says_why() -> None:
    notice = coalesce([fallback("job-1")])
    assert notice == Notice(
        "Moved to the CPU",
        "Job job-1 continues on the CPU: the GPU ran out of memory while generating (oom_decode).",
        "warning",
        False,
    )


def test_a_move_to_a_peer_names_the_peer_and_never_the_cpu() -> None:
    notice = coalesce([fallback("job-1", to="peer:gaming-pc")])
    assert notice == Notice(
        "Moved to gaming-pc",
        "Job job-1 continues on gaming-pc, another machine's GPU: the GPU ran out of memory while generating "
        "(oom_decode).",
        "warning",
        False,
    )
    said_cpu = coalesce([fallback("job-1", to="cpu")])
    assert said_cpu is not None and said_cpu.title == "Moved to the CPU"


def test_a_burst_counts_moves_to_the_cpu_and_to_peers_apart() -> None:
    events = [fallback("c1"), fallback("p1", to="peer:gaming-pc"), fallback("p2", to="peer:nas")]
    notice = coalesce(events)
    assert notice is not None and notice.title == "Moved to the CPU"  # the first one's
    assert notice.body.splitlines() == ["1 job moved to the CPU", "2 jobs moved to another machine"]
    only_peers = coalesce(events[1:])
    assert only_peers is not None
    assert (only_peers.title, only_peers.body) == ("Moved to gaming-pc", "2 jobs moved to another machine")


def test_single_approval_gives_estimate_model_and_size_and_opens_approvals() -> None:
    notice = coalesce([approval("job-2")])
    assert notice is not None
    assert notice.title == "Approval needed"
    assert "about 42 s on the CPU" in notice.body
    assert "qwen3-14b, a prompt of 5,210 tokens" in notice.body
    assert notice.opens_approvals


def test_mixed_burst_is_one_summary_led_by_approvals() -> None:
    events = [fallback(f"f{i}") for i in range(12)]
    events += [approval("a1"), approval("a2")]
    events += [{"type": "fallback_refused", "job_id": "r1", "reason": "cpu_too_slow", "at": time.time()}]
    events += [{"type": "worker_restarted", "role": "gpu", "pid": 1, "attempt": 1, "reason": "oom", "at": 0}]
    events += [{"type": "queue", "depth": 3, "limit": 32}]  # not a notable event: ignored
    notice = coalesce(events)
    assert notice is not None
    assert notice.title == "Approval needed"
    assert notice.level == "critical"
    assert notice.opens_approvals
    assert notice.body.splitlines() == [
        "2 jobs wait for approval — click to review",
        "1 fallback refused (cpu_too_slow)",
        "12 jobs moved to the CPU",
        "1 worker restart (GPU)",
    ]


def test_burst_of_twenty_gives_one_message(qtbot: QtBot) -> None:
    shown: list[Notice] = []
    center = NotificationCenter(shown.append, gather_ms=150, cooldown_ms=1000)
    for index in range(20):
        center.add(fallback(f"job-{index}"))
    qtbot.waitUntil(lambda: len(shown) == 1, timeout=3000)
    assert shown[0].body == "20 jobs moved to the CPU"
    # Nothing else was pending: no second message follows the first.
    qtbot.wait(400)
    assert len(shown) == 1


def test_events_during_cooldown_wait_and_come_as_one(qtbot: QtBot) -> None:
    shown: list[Notice] = []
    center = NotificationCenter(shown.append, gather_ms=50, cooldown_ms=600)
    center.add(fallback("first"))
    qtbot.waitUntil(lambda: len(shown) == 1, timeout=2000)
    started = time.monotonic()
    center.add(fallback("second"))
    center.add(fallback("third"))
    qtbot.waitUntil(lambda: len(shown) == 2, timeout=3000)
    assert time.monotonic() - started >= 0.4  # held back by the cooldown, not shown at once
    assert shown[1].body == "2 jobs moved to the CPU"


def test_replayed_and_stale_events_are_not_news(qtbot: QtBot) -> None:
    shown: list[Notice] = []
    center = NotificationCenter(shown.append, gather_ms=50, cooldown_ms=50)
    event = fallback("job-1")
    center.add(event)
    center.add(dict(event))  # the same event again, e.g. after the stream reconnected
    center.add({**fallback("old"), "at": time.time() - 3600})
    qtbot.waitUntil(lambda: len(shown) == 1, timeout=2000)
    qtbot.wait(200)
    assert len(shown) == 1
    assert shown[0].body.startswith("Job job-1 continues on the CPU")


def test_clicking_an_approval_message_asks_for_the_approvals_window(qtbot: QtBot) -> None:
    center = NotificationCenter(lambda _notice: None, gather_ms=10, cooldown_ms=10)
    center.add(fallback("job-1"))
    center.flush()
    with qtbot.assertNotEmitted(center.approvals_requested, wait=50):
        center.message_clicked()
    center.add(approval("job-2"))
    center.flush()
    with qtbot.waitSignal(center.approvals_requested, timeout=1000):
        center.message_clicked()


def test_a_journal_failure_is_a_critical_notice() -> None:
    event = {"type": "journal_failed", "at": 100.0, "reason": "the journal could not commit: disk I/O error"}
    notice = coalesce([event])
    assert notice is not None and notice.level == "critical"
    assert notice.title == "Failsoft cannot store jobs" and "disk I/O error" in notice.body
    both = coalesce([fallback("job-1"), event])
    assert both is not None and both.title == "Failsoft cannot store jobs" and both.level == "critical"
