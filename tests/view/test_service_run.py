"""The tray's line about the service's own restarts: from the status's `service.restarted_after_crash` (a
systemd unit's restart too) and from the tray's own child while it is down, each crash told once."""

from __future__ import annotations

import time
from typing import Any, cast

from tests.support.status_samples import make_status
from tray_app.contract.status import CrashNote, ServiceStatus
from tray_app.view.service_run import Restart, RestartWatch, clock, crash_line, down_line


def with_run(pid: int, note: CrashNote | None) -> ServiceStatus:
    status: dict[str, Any] = dict(make_status())
    status["service"] = {"pid": pid, "started_at": time.time(), "restarted_after_crash": note}
    return cast(ServiceStatus, status)


def note(at: float, signal: int | None = 11, exit_code: int | None = None) -> CrashNote:
    return {
        "at": at,
        "signal": signal,
        "exit_code": exit_code,
        "pid": 100,
        "stack_log": None,
        "restarted_by": "systemd",
    }


def test_the_lines_name_the_time_and_how_it_ended() -> None:
    at = time.mktime((2025, 3, 4, 14, 2, 0, 0, 0, -1))
    assert crash_line(note(at)) == "The service restarted after a crash at 14:02 (signal 11)"
    assert crash_line(note(at, None, 3)) == "The service restarted after a crash at 14:02 (exit status 3)"
    assert down_line(-9, 1.0) == "The service stopped (signal 9); restarting…"
    assert down_line(1, 30.0) == "The service stopped (exit status 1); restarting in 30 s…"


def test_a_restart_the_service_reports_is_told_once_per_new_run() -> None:
    watch = RestartWatch()
    assert watch.status(make_status()) is None and watch.line == ""  # a service that does not report runs
    assert watch.status(with_run(200, None)) is None and watch.line == ""  # a first run, no crash before
    at = time.time() - 30
    told = watch.status(with_run(201, note(at)))
    assert told == Restart(201, f"The service restarted after a crash at {clock(at)} (signal 11)")
    assert watch.status(with_run(201, note(at))) is None  # the same run again: not news
    assert watch.line == told.line
    assert watch.status(with_run(202, note(at + 20, 6))) is not None  # it crashed again


def test_the_trays_own_child_is_told_while_down_and_once_when_back() -> None:
    watch = RestartWatch()
    at = time.time()
    watch.child_down(-9, 1.0, at)
    assert watch.line == "The service stopped (signal 9); restarting…"
    # The last status is still the old run's: the tray tells the crash from its own knowledge.
    back = watch.child_up(301, with_run(300, None))
    assert back == Restart(301, f"The service restarted after a crash at {clock(at)} (signal 9)")
    # The new run reports the same crash (crash_record): not told twice; its own words are shown.
    earlier = at - 60
    assert watch.status(with_run(301, note(earlier, 9))) is None
    assert watch.line == f"The service restarted after a crash at {clock(earlier)} (signal 9)"


def test_a_child_that_comes_back_reporting_its_crash_is_told_in_the_services_words() -> None:
    watch = RestartWatch()
    at = time.time()
    watch.child_down(-11, 2.0, at)
    assert watch.status(with_run(401, note(at, 11))) is None  # seen before the tray knew it is up
    told = watch.child_up(401, with_run(401, note(at, 11)))
    assert told is not None and told.line == crash_line(note(at, 11))
    assert watch.status(with_run(401, note(at, 11))) is None
