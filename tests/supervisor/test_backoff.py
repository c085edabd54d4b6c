"""Restart delays: at once after a stable run, exponential with a cap, never zero after a load OOM."""

from __future__ import annotations

from tray_app.supervisor.backoff import Backoff


def test_first_crash_after_a_stable_run_restarts_at_once_then_doubles_to_the_cap() -> None:
    backoff = Backoff(initial=1.0, cap=8.0, stable_after=30.0)
    delays = [backoff.note_failure(now=float(i), load_failure=False) for i in range(6)]
    assert delays == [0.0, 1.0, 2.0, 4.0, 8.0, 8.0]


def test_load_failures_always_wait_and_grow() -> None:
    backoff = Backoff(initial=1.0, cap=30.0, stable_after=30.0)
    delays = [backoff.note_failure(now=float(i), load_failure=True) for i in range(7)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert all(delay > 0 for delay in delays)


def test_a_stable_period_forgives_earlier_failures() -> None:
    backoff = Backoff(initial=1.0, cap=30.0, stable_after=30.0)
    for i in range(4):
        backoff.note_failure(now=float(i), load_failure=False)
    backoff.note_ready(now=100.0)
    assert backoff.note_failure(now=131.0, load_failure=False) == 0.0


def test_a_short_ready_period_does_not_reset_the_count() -> None:
    backoff = Backoff(initial=1.0, cap=30.0, stable_after=30.0)
    backoff.note_failure(now=0.0, load_failure=False)
    backoff.note_ready(now=1.0)
    assert backoff.note_failure(now=5.0, load_failure=False) == 1.0
