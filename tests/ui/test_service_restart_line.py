"""The tray shows the service's own restart: a message once per crash, and the same line in the tooltip, the
menu and ui-state.json; while its child is down, that it is restarting."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from pytestqt.qtbot import QtBot

from tests.support.status_samples import make_status
from tray_app.contract.status import ServiceStatus
from tray_app.host.service_child import Change, ChildChange, ServiceChild, Start, Stop
from tray_app.host.service_probe import Probe
from tray_app.ui.controller import TrayApp
from tray_app.ui.notifications import SERVICE_RESTARTED, Notice, coalesce
from tray_app.ui.service_child_qt import QtServiceChild
from tray_app.view.service_run import clock

TITLE = "Failsoft service restarted"


@pytest.fixture
def tray_app(qtbot: QtBot, tmp_path: Path) -> Iterator[TrayApp]:
    # The address is never called: these tests hand the model its status and the child's changes.
    app = TrayApp("http://127.0.0.1:9", "", tmp_path / "config.toml", attached=False)
    app.notifications._gather_ms = app.notifications._cooldown_ms = 0
    yield app
    app.stop()
    app.deleteLater()
    qtbot.wait(20)


def show(app: TrayApp, status: ServiceStatus | None, reachable: bool = True) -> None:
    app.model.status = status
    app.model.reachable = reachable
    app.model.changed.emit()


def with_run(pid: int, at: float | None) -> ServiceStatus:
    note = None
    if at is not None:
        note = {
            "at": at,
            "signal": 11,
            "exit_code": None,
            "pid": 7,
            "stack_log": None,
            "restarted_by": "systemd",
        }
    status: dict[str, Any] = dict(make_status())
    status["service"] = {"pid": pid, "started_at": time.time(), "restarted_after_crash": note}
    return cast(ServiceStatus, status)


def test_a_restart_event_is_one_warning_with_the_line() -> None:
    line = "The service restarted after a crash at 14:02 (signal 11)"
    notice = coalesce([{"type": SERVICE_RESTARTED, "at": time.time(), "pid": 5, "line": line}])
    assert notice == Notice(TITLE, line + ".", "warning", False)


def test_a_restart_the_service_reports_is_shown_once(qtbot: QtBot, tray_app: TrayApp) -> None:
    at = time.time() - 20
    line = f"The service restarted after a crash at {clock(at)} (signal 11)"
    show(tray_app, with_run(10, at))
    qtbot.waitUntil(lambda: TITLE in tray_app.ui_state()["notices"], timeout=5_000)
    show(tray_app, with_run(10, at))  # the next poll: the same run
    qtbot.wait(50)
    state = tray_app.ui_state()
    assert state["notices"].count(TITLE) == 1
    assert state["service_line"] == line and line in state["tooltip"]
    assert tray_app.tray.service_action.isVisible() and tray_app.tray.service_action.text() == line


def test_the_trays_own_child_down_then_back(qtbot: QtBot, tray_app: TrayApp) -> None:
    show(tray_app, make_status())
    crashed_at = time.time()
    tray_app.service_child_changed(ChildChange(Change.CRASHED, 20, -9, restart_in=1.0, at=crashed_at))
    show(tray_app, tray_app.model.status, reachable=False)
    state = tray_app.ui_state()
    assert state["service_line"] == "The service stopped (signal 9); restarting…"
    assert state["headline"] == "Starting the service…" and "restarting…" in state["tooltip"]

    tray_app.service_child_changed(ChildChange(Change.READY, 21))
    qtbot.waitUntil(lambda: TITLE in tray_app.ui_state()["notices"], timeout=5_000)
    line = f"The service restarted after a crash at {clock(crashed_at)} (signal 9)"
    assert tray_app.ui_state()["service_line"] == line
    assert tray_app.notifications.last_notice == Notice(TITLE, line + ".", "warning", False)


@pytest.mark.parametrize(
    ("probe", "signal_name", "words"),
    [
        (Probe("failsoft", "Failsoft 0.1.0 at http://127.0.0.1:1"), "found_running", "Failsoft 0.1.0 at"),
        (Probe("nothing"), "failed", "the port is taken"),
    ],
)
def test_a_first_start_that_ends_at_once_is_a_service_found_or_a_reason(
    qtbot: QtBot, tmp_path: Path, probe: Probe, signal_name: str, words: str
) -> None:
    """A service started beside the tray (both at login) took the address first: the tray shows that one;
    otherwise the tray ends with the service's own words."""
    script = "import sys; print('failsoft serve: the port is taken', flush=True); sys.exit(1)"
    child = ServiceChild([sys.executable, "-c", script], tmp_path / "service.log", lambda: False)
    runner = QtServiceChild(child, lambda: probe)
    with qtbot.waitSignal(getattr(runner, signal_name), timeout=30_000) as told:
        assert runner.start() is Start.OK
    assert told.args is not None and str(told.args[0]).startswith(words)
    assert runner.stop() is Stop.NOT_RUNNING
