"""Quiet hours: a daily window, also across midnight; the time until it ends."""

from __future__ import annotations

from datetime import datetime

import pytest

from tray_app.reach.quiet import is_quiet, seconds_until_end


def at(hour: int, minute: int = 0) -> datetime:
    return datetime(2025, 3, 1, hour, minute)


@pytest.mark.parametrize(
    ("window", "time", "quiet"),
    [
        ("22:00-07:00", at(23), True),
        ("22:00-07:00", at(3), True),
        ("22:00-07:00", at(7), False),
        ("22:00-07:00", at(21, 59), False),
        ("12:00-13:30", at(13, 29), True),
        ("12:00-13:30", at(13, 30), False),
        ("08:00-08:00", at(8), False),
        ("", at(3), False),
    ],
)
def test_is_quiet(window: str, time: datetime, quiet: bool) -> None:
    assert is_quiet(window, time) is quiet


def test_seconds_until_the_window_ends() -> None:
    assert seconds_until_end("22:00-07:00", at(23)) == 8 * 3600
    assert seconds_until_end("22:00-07:00", at(6, 30)) == 30 * 60
    assert seconds_until_end("22:00-07:00", at(12)) == 0
