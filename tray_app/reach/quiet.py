"""Quiet hours: a daily window of local time ("22:00-07:00", may cross midnight) when a channel holds its
messages; what came in meanwhile goes out as one message when the window ends."""

from __future__ import annotations

from datetime import datetime, timedelta

from tray_app.config.notify import quiet_window


def is_quiet(window: str, now: datetime) -> bool:
    parsed = quiet_window(window) if window else None
    if parsed is None:
        return False
    start, end = parsed
    minute = now.hour * 60 + now.minute
    if start == end:
        return False  # an empty window, not a whole day
    if start < end:
        return start <= minute < end
    return minute >= start or minute < end  # across midnight


def seconds_until_end(window: str, now: datetime) -> float:
    """Seconds from `now` until the window ends (0 when not quiet now)."""
    parsed = quiet_window(window) if window else None
    if parsed is None or not is_quiet(window, now):
        return 0.0
    end = now.replace(hour=parsed[1] // 60, minute=parsed[1] % 60, second=0, microsecond=0)
    if end <= now:
        end += timedelta(days=1)
    return (end - now).total_seconds()
