"""Wires the tray together: HTTP client, event stream, status model, tray icon, notifications and windows."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSystemTrayIcon,
    QVBoxLayout,
    QWidget,
)

from tray_app.host.service_child import Change, ChildChange
from tray_app.ui.api_client import ServiceClient
from tray_app.ui.approvals import ApprovalsWindow
from tray_app.ui.budget_bar import BudgetBar
from tray_app.ui.chat import ChatWindow
from tray_app.ui.icons import app_icon
from tray_app.ui.notifications import SERVICE_RESTARTED, Notice, NotificationCenter
from tray_app.ui.qt_events import QtEventBridge
from tray_app.ui.settings import SettingsDialog
from tray_app.ui.status_model import StatusModel
from tray_app.ui.timeline_window import TimelineWindow
from tray_app.ui.tray import TrayIcon
from tray_app.view.service_run import Restart, RestartWatch

log = logging.getLogger(__name__)

TRAY_POLL_MS = 2000


class StatusWindow(QWidget):
    """Shown when the desktop has no system tray: the same state and the same menu, in a small window."""

    def __init__(self, tray: TrayIcon) -> None:
        super().__init__()
        self.setWindowTitle("Failsoft")
        self.setWindowIcon(app_icon())
        self.headline = QLabel()
        self.headline.setStyleSheet("font-size: 15px; font-weight: 600;")
        self.note = QLabel("This desktop shows no system tray, so Failsoft shows its status here.")
        self.note.setStyleSheet("color: #6c757d;")
        self.budget = BudgetBar()
        menu_button = QPushButton("Menu")
        menu_button.setMenu(tray.menu)
        row = QHBoxLayout()
        row.addWidget(self.headline, 1)
        row.addWidget(menu_button)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.budget)
        layout.addWidget(self.note)
        self._tray = tray
        tray.model.changed.connect(self.refresh)
        self.refresh()

    def refresh(self) -> None:
        self.headline.setText(self._tray.model.summary().headline)
        self.budget.set_status(self._tray.model.status)


class TrayApp(QObject):
    quit_requested = Signal()

    def __init__(
        self,
        base_url: str,
        api_key: str,
        config_path: Path,
        attached: bool,
        state_file: Path | None = None,
        admin: str = "",
    ) -> None:
        """`admin`: the service's control token ("": $FAILSOFT_ADMIN_TOKEN or this user's data folder's)."""
        super().__init__()
        self.config_path = config_path
        self.state_file = state_file
        self.client = ServiceClient(base_url, api_key, self, admin=admin)
        self.bridge = QtEventBridge(self)
        self.events = self.client.events()
        self.events.event_received.connect(self.bridge.dispatch)
        self.model = StatusModel(self.client, self.bridge, self)
        self.events.connection_changed.connect(self._stream_connection)
        self.tray = TrayIcon(self.client, self.model, attached, self)
        self.notifications = NotificationCenter(self._show_notice, parent=self)
        self.bridge.any_event.connect(self.notifications.add)
        self.tray.icon.messageClicked.connect(self.notifications.message_clicked)
        self.notifications.approvals_requested.connect(self.show_approvals)
        self.tray.open_approvals.connect(self.show_approvals)
        self.tray.open_chat.connect(self.show_chat)
        self.tray.open_settings.connect(self.show_settings)
        self.tray.open_timeline.connect(self.show_timeline)
        self.tray.quit_requested.connect(self.quit_requested.emit)
        self.approvals: ApprovalsWindow | None = None
        self.chat: ChatWindow | None = None
        self.settings: SettingsDialog | None = None
        self.timeline: TimelineWindow | None = None
        self.status_window: StatusWindow | None = None
        self._tray_poll = QTimer(self)
        self._tray_poll.setInterval(TRAY_POLL_MS)
        self._tray_poll.timeout.connect(self._show_tray_when_available)
        self.restarts = RestartWatch()  # the service's own restarts: told once each, and the line about them
        self.model.changed.connect(self._service_run)
        self.model.changed.connect(self.write_state)
        self.model.changed.connect(self._chat_limits)
        self.tray.menu.aboutToShow.connect(self.write_state)
        self.tray.menu.aboutToHide.connect(lambda: QTimer.singleShot(0, self.write_state))

    def _show_notice(self, notice: Notice) -> None:
        self.tray.show_notice(notice)
        QTimer.singleShot(300, self.write_state)

    def start(self) -> None:
        self.model.start()
        self.events.start()
        if QSystemTrayIcon.isSystemTrayAvailable():
            self.tray.show()
        else:
            log.warning("no system tray on this desktop; showing the status window until one appears")
            self.status_window = StatusWindow(self.tray)
            self.status_window.show()
            self._tray_poll.start()
        QTimer.singleShot(500, self.write_state)

    def stop(self) -> None:
        self._tray_poll.stop()
        self.events.stop()
        self.model.stop()
        self.tray.icon.hide()
        for window in (self.approvals, self.chat, self.settings, self.status_window):
            if window is not None:
                window.close()
                window.deleteLater()  # its timers must not call a client that is going away
        self.approvals = self.chat = self.settings = self.status_window = None

    def attach(self) -> None:
        """The tray shows a service it did not start: quitting it leaves that service running."""
        self.model.starting = False
        self.tray.set_attached(True)
        self.model.refresh()
        self.events.retry_now()

    def service_started(self) -> None:
        """The in-process service listens now: look at once instead of at the next retry."""
        self.model.refresh()
        self.events.retry_now()

    def service_child_changed(self, change: ChildChange) -> None:
        """The service the tray started (host/service_child.py): up, down and restarting, or ended."""
        if change.change is Change.READY:
            self._tell_restart(self.restarts.child_up(change.pid, self.model.status))
            self.service_started()
        elif change.change is Change.CRASHED and change.returncode is not None:
            self.restarts.child_down(change.returncode, change.restart_in, change.at)
            self.model.starting = True  # on its way back: "Starting the service…", not "not reachable"
            self.model.refresh()
        elif change.change is Change.ENDED:
            self.restarts.child_down(change.returncode or 0, None, change.at)
            self.model.refresh()
        else:
            return
        self.tray.set_service_line(self.restarts.line)
        self.write_state()

    def _service_run(self) -> None:
        """A status came: a restart of the service that it reports itself (after a crash of a tray's child,
        or of a systemd unit)."""
        self._tell_restart(self.restarts.status(self.model.status))
        self.tray.set_service_line(self.restarts.line)

    def _tell_restart(self, restart: Restart | None) -> None:
        if restart is not None:
            event = {"type": SERVICE_RESTARTED, "at": time.time(), "pid": restart.pid, "line": restart.line}
            self.notifications.add(event)

    def _show_tray_when_available(self) -> None:
        if QSystemTrayIcon.isSystemTrayAvailable():
            self._tray_poll.stop()
            self.tray.show()
            self.write_state()

    def _stream_connection(self, connected: bool) -> None:
        # Events may have been missed while the stream was down: take the whole picture again.
        self.model.schedule_refresh()
        self.write_state()

    # windows, created on first use
    def show_timeline(self) -> None:
        if self.timeline is None:
            self.timeline = TimelineWindow(self.client)
        self._raise(self.timeline)

    def show_approvals(self) -> None:
        if self.approvals is None:
            self.approvals = ApprovalsWindow(self.client, self.bridge)
            self.approvals.jobs_changed.connect(lambda _count: self.write_state())
        self._raise(self.approvals)

    def _chat_limits(self) -> None:
        if self.chat is not None:  # a reload may change the GPU's context per request
            self.chat.set_gpu_context(self._gpu_context())

    def show_chat(self) -> None:
        if self.chat is None:
            self.chat = ChatWindow(self.client, self.bridge)
            self.chat.answer_finished.connect(lambda _kind: self.write_state())
        self.chat.simulated = self.model.summary().simulated
        self.chat.set_gpu_context(self._gpu_context())
        self._raise(self.chat)
        self.chat.input.setFocus()

    def _gpu_context(self) -> int | None:
        status = self.model.status
        caps = (status.get("caps") if status else None) or {}
        return int(caps.get("n_ctx_per_seq") or 0) or None

    def show_settings(self) -> None:
        if self.settings is None:
            self.settings = SettingsDialog(self.client, self.config_path)
        self.settings.load()
        self._raise(self.settings)

    def _raise(self, window: QWidget) -> None:
        if not window.isVisible() and not window.property("placed"):
            # Where a window manager places windows this is a no-op; without one, windows open mid-screen.
            screen = window.screen().availableGeometry()
            window.move(screen.center() - window.rect().center())
            window.setProperty("placed", True)
        window.show()
        window.raise_()
        window.activateWindow()
        QTimer.singleShot(100, self.write_state)

    # for automated desktop tests
    def ui_state(self) -> dict[str, Any]:
        geometry = self.tray.icon.geometry()
        summary = self.model.summary()
        workers = (self.model.status.get("workers") if self.model.status else None) or {}
        windows = {}
        for name, window in (("approvals", self.approvals), ("chat", self.chat), ("settings", self.settings)):
            if window is not None and window.isVisible():
                frame = window.frameGeometry()
                windows[name] = [frame.x(), frame.y(), frame.width(), frame.height()]
        return {
            "tray_available": QSystemTrayIcon.isSystemTrayAvailable(),
            "tray_visible": self.tray.icon.isVisible(),
            "attached": self.tray.attached,
            "tray_geometry": [geometry.x(), geometry.y(), geometry.width(), geometry.height()],
            "level": summary.level,
            "headline": summary.headline,
            "tooltip": self.tray.icon.toolTip(),
            "service_line": self.restarts.line,  # "The service restarted after a crash at 14:02 (signal 11)"
            "simulated": summary.simulated,
            "reachable": self.model.reachable,
            "workers": {role: str(workers.get(role, {}).get("state")) for role in ("gpu", "cpu")},
            "peers": {name: menu.title() for name, menu in self.tray.peers.items()},  # "Peer nas: down: …"
            "events_connected": self.events.connected,
            "menu_visible": self.tray.menu.isVisible(),
            "windows": windows,
            "notices": [notice.title for notice in self.notifications.shown],
            "chat_badges": [answer.badge.text() for answer in self.chat.answers] if self.chat else [],
            "chat_models": [answer.model_badge.text() for answer in self.chat.answers] if self.chat else [],
            "models": {name: menu.title() for name, menu in self.tray.library.models.items()},
            "approvals_rows": len(self.approvals.jobs) if self.approvals else 0,
            "menu_geometry": self._menu_geometry(),
            "message_geometry": self._message_geometry(),
        }

    def _menu_geometry(self) -> list[int]:
        frame = self.tray.menu.frameGeometry()
        return [frame.x(), frame.y(), frame.width(), frame.height()] if self.tray.menu.isVisible() else []

    @staticmethod
    def _message_geometry() -> list[int]:
        """Where Qt's own tray message balloon is (shown when no notification daemon runs)."""
        for widget in QApplication.topLevelWidgets():
            if widget.metaObject().className() == "QBalloonTip" and widget.isVisible():
                frame = widget.frameGeometry()
                return [frame.x(), frame.y(), frame.width(), frame.height()]
        return []

    def write_state(self) -> None:
        if self.state_file is not None:
            write_state_file(self.state_file, self.ui_state())


def write_state_file(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(state, indent=2), encoding="utf-8")
    temporary.replace(path)
