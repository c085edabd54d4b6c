"""The tray icon and its menu: state at a glance, the budget bar, worker control, the peers (read-only), the
model library, and the way into the approvals, chat and settings windows."""

from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6.QtCore import QObject, QUrl, Signal
from PySide6.QtGui import QAction, QCursor, QDesktopServices
from PySide6.QtWidgets import QHBoxLayout, QLabel, QMenu, QSystemTrayIcon, QVBoxLayout, QWidget, QWidgetAction

from tray_app import paths
from tray_app.contract.status import ServiceStatus, WorkerStatus
from tray_app.ui.api_client import ServiceClient
from tray_app.ui.budget_bar import BudgetBar
from tray_app.ui.icons import state_icon, state_pixmap, swatch_icon
from tray_app.ui.models_menu import ModelsMenu, model_failure
from tray_app.ui.notifications import Notice
from tray_app.ui.status_model import StatusModel
from tray_app.view.device_now import device_now, path_state
from tray_app.view.peers import PeerView, peer_views
from tray_app.view.state import caps_label, device_label, worker_line

GIVE_GPU = "Give the &GPU to other programs"
TAKE_GPU = "Take the &GPU back"

log = logging.getLogger(__name__)

WORKER_COLORS = {
    "ready": "#2f9e58",
    "starting": "#f0a202",
    "restarting": "#f0a202",
    "unhealthy": "#f0a202",
    "stopping": "#868e96",
    "stopped": "#868e96",
    "failed": "#d9403a",
}
PEER_COLORS = {"ready": "#2f9e58", "down": "#d9403a"}  # a peer not asked yet is grey
MESSAGE_ICONS = {
    "information": QSystemTrayIcon.MessageIcon.Information,
    "warning": QSystemTrayIcon.MessageIcon.Warning,
    "critical": QSystemTrayIcon.MessageIcon.Critical,
}
MESSAGE_MS = 8000


class WorkerMenu(QMenu):
    """One worker's submenu: its state as the title, restart/stop/start as actions."""

    def __init__(self, role: str, act: Callable[[str, str], None]) -> None:
        super().__init__()
        self.role = role
        self.failure = self.addAction("")
        self.failure.setEnabled(False)
        self.restart = self.addAction("Restart", lambda: act(role, "restart"))
        self.stop = self.addAction("Stop", lambda: act(role, "stop"))
        self.start = self.addAction("Start", lambda: act(role, "start"))

    def update_from(self, worker: WorkerStatus) -> None:
        state = str(worker.get("state") or "unknown")
        self.setTitle(worker_line(self.role, worker))
        self.setIcon(swatch_icon(WORKER_COLORS.get(state, "#adb5bd")))
        failure = worker.get("last_failure")
        text = failure.get("reason") or failure.get("kind") if isinstance(failure, dict) else failure
        self.failure.setText(f"Last failure: {text}" if text else "No failures")
        running = state in ("ready", "starting", "unhealthy", "restarting")
        self.restart.setEnabled(state not in ("stopping",))
        self.stop.setEnabled(running)
        self.start.setEnabled(state in ("stopped", "failed"))


class PeerMenu(QMenu):
    """One peer (another machine's server): its state as the title, where it is and what it is asked for
    inside. Read-only: a peer is another machine's, Failsoft only probes it."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: tuple[str, ...] = ()

    def update_from(self, view: PeerView) -> None:
        self.setTitle(f"Peer {view.name}: {view.state_text}")
        self.setIcon(swatch_icon(PEER_COLORS.get(view.state, "#adb5bd")))
        lines = (view.url, *view.details)
        if lines != self.lines:  # refilled only on a change: the status comes every 2 s, the menu may be open
            self.lines = lines
            self.clear()
            for line in lines:
                self.addAction(line).setEnabled(False)


class StatusHeader(QWidget):
    """The top of the menu: the state icon, the headline and one line of detail."""

    def __init__(self) -> None:
        super().__init__()
        self.icon = QLabel()
        self.icon.setFixedSize(32, 32)
        self.headline = QLabel("Connecting…")
        self.headline.setStyleSheet("font-size: 14px; font-weight: 600;")
        self.detail = QLabel("")
        self.detail.setStyleSheet("color: #6c757d;")
        text = QVBoxLayout()
        text.setSpacing(1)
        text.addWidget(self.headline)
        text.addWidget(self.detail)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(14, 10, 14, 4)
        layout.setSpacing(10)
        layout.addWidget(self.icon)
        layout.addLayout(text, 1)

    def show_state(self, level: str, simulated: bool, headline: str, detail: str) -> None:
        self.icon.setPixmap(state_pixmap(level, simulated, 32))
        self.headline.setText(headline)
        self.detail.setText(detail)


class TrayIcon(QObject):
    """Owns the QSystemTrayIcon and its menu; everything it shows comes from the StatusModel."""

    open_approvals = Signal()
    open_chat = Signal()
    open_settings = Signal()
    open_timeline = Signal()
    quit_requested = Signal()

    def __init__(
        self, client: ServiceClient, model: StatusModel, attached: bool, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self.client = client
        self.model = model
        self.attached = attached
        self.level = ""
        self.simulated: bool | None = None
        self.service_line = ""  # the service's own restart, or its being down (view/service_run.py)
        self.icon = QSystemTrayIcon(self)
        self.menu = QMenu()
        self._build_menu()
        self.icon.setContextMenu(self.menu)
        self.icon.activated.connect(self._activated)
        model.changed.connect(self.refresh)
        self.refresh()

    def _build_menu(self) -> None:
        menu = self.menu
        menu.setMinimumWidth(380)
        self.header = StatusHeader()
        header_action = QWidgetAction(menu)
        header_action.setDefaultWidget(self.header)
        menu.addAction(header_action)
        self.budget = BudgetBar(compact=True)
        budget_action = QWidgetAction(menu)
        budget_action.setDefaultWidget(self.budget)
        menu.addAction(budget_action)
        self.service_action = menu.addAction("")  # the service's own restart: shown only when there was one
        self.service_action.setEnabled(False)
        self.service_action.setVisible(False)
        menu.addSeparator()
        self.workers = {role: WorkerMenu(role, self.worker_action) for role in ("gpu", "cpu")}
        for worker_menu in self.workers.values():
            menu.addMenu(worker_menu)
        self.peers: dict[str, PeerMenu] = {}  # by name, in the status's order; placed above the library
        self.library = ModelsMenu(self.model_action)
        menu.addMenu(self.library)
        # Give the GPU to another program (a game, ComfyUI) and take it back: `failsoft yield` / `resume`.
        self.gpu_action = menu.addAction(GIVE_GPU, self.toggle_gpu)
        self.timeline_action = menu.addAction("VRAM &timeline…", self.open_timeline.emit)
        menu.addSeparator()
        self.approvals_action = menu.addAction("&Approvals…", self.open_approvals.emit)
        self.chat_action = menu.addAction("&Chat…", self.open_chat.emit)
        self.settings_action = menu.addAction("&Settings…", self.open_settings.emit)
        self.logs_action = menu.addAction("Open &logs folder", self.open_logs)
        menu.addSeparator()
        self.quit_action: QAction = menu.addAction("", self.quit_requested.emit)
        self.set_attached(self.attached)

    def set_attached(self, attached: bool) -> None:
        self.attached = attached
        self.quit_action.setText("&Quit tray (service keeps running)" if attached else "&Quit Failsoft")

    def show(self) -> None:
        self.icon.show()

    def set_service_line(self, line: str) -> None:
        if line != self.service_line:
            self.service_line = line
            self.refresh()

    def refresh(self) -> None:
        summary = self.model.summary()
        status = self.model.status  # None until the service first answered
        if (summary.level, summary.simulated) != (self.level, self.simulated):
            self.level, self.simulated = summary.level, summary.simulated
            self.icon.setIcon(state_icon(summary.level, summary.simulated))
        self.icon.setToolTip(
            f"{summary.tooltip}\n{self.service_line}" if self.service_line else summary.tooltip
        )
        self.service_action.setText(self.service_line)
        self.service_action.setVisible(bool(self.service_line))
        if self.model.reachable and status is not None:
            detail = f"{device_label(status)} · {caps_label(status)} · {self.client.base_url}"
        else:
            detail = self.model.last_error or f"No answer from {self.client.base_url}"
        self.header.show_state(summary.level, summary.simulated, summary.headline, detail)
        self.budget.set_status(status)
        workers = status.get("workers") if status else None
        for role, worker_menu in self.workers.items():
            worker_menu.update_from({"state": "unknown", **((workers or {}).get(role) or {})})
            worker_menu.setEnabled(self.model.reachable)
        self._show_peers(status)
        self.library.update_from(status, self.model.reachable)
        yielded = path_state(status) == "yielded" if status else False
        self.gpu_action.setText(TAKE_GPU if yielded else GIVE_GPU)
        self.gpu_action.setEnabled(
            self.model.reachable and bool(device_now(status).get("watching")) if status else False
        )
        approvals = status.get("approvals") if status else None
        pending = int((approvals or {}).get("pending") or 0)
        self.approvals_action.setText(
            f"&Approvals ({pending} waiting)…" if pending else "&Approvals (none waiting)…"
        )

    def _show_peers(self, status: ServiceStatus | None) -> None:
        """A line per peer under the workers; made again only when the peers themselves change (a config
        reload), so an open menu keeps its entries."""
        views = peer_views(status)
        if [view.name for view in views] != list(self.peers):
            for old in self.peers.values():
                self.menu.removeAction(old.menuAction())
                old.deleteLater()
            self.peers = {view.name: PeerMenu() for view in views}
            for peer_menu in self.peers.values():
                self.menu.insertMenu(self.library.menuAction(), peer_menu)
        for view in views:
            self.peers[view.name].update_from(view)
            self.peers[view.name].setEnabled(self.model.reachable)

    def worker_action(self, role: str, action: str) -> None:
        call = self.client.worker_action(role, action)
        call.succeeded.connect(lambda _answer: self.model.schedule_refresh())
        call.failed.connect(
            lambda message: self.show_notice(
                Notice(f"{role.upper()} worker: {action} failed", message, "critical", False)
            )
        )

    def toggle_gpu(self) -> None:
        """Yield (the GPU workers finish their jobs and stop) or resume; the events show the rest."""
        yielded = self.model.status is not None and path_state(self.model.status) == "yielded"
        action = "resume" if yielded else "yield"
        call = self.client.gpu_action(action)
        call.succeeded.connect(lambda _answer: self.model.schedule_refresh())
        call.failed.connect(
            lambda message: self.show_notice(Notice(f"GPU {action} failed", message, "critical", False))
        )

    def model_action(self, name: str, action: str) -> None:
        """`action` is load (on the device the service chooses) or unload."""
        call = self.client.load_model(name) if action == "load" else self.client.unload_model(name)
        self.library.pending.add(name)
        self.model.schedule_refresh()  # a load shows "loading" while it runs

        def done() -> None:
            self.library.pending.discard(name)
            self.refresh()
            self.model.schedule_refresh()

        def failed(message: str) -> None:
            done()
            self.show_notice(model_failure(name, action, message, call.error))

        call.succeeded.connect(lambda _answer: done())
        call.failed.connect(failed)
        self.refresh()

    def open_logs(self) -> None:
        folder = paths.log_dir()
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder))):
            # No file manager registered (a bare server desktop): at least say where the logs are.
            self.show_notice(Notice("Logs folder", f"The worker logs are in {folder}", "information", False))

    def show_notice(self, notice: Notice) -> None:
        self.icon.showMessage(notice.title, notice.body, MESSAGE_ICONS[notice.level], MESSAGE_MS)

    def _activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        # Most Linux trays give a left click to the application: show the same menu there.
        if reason == QSystemTrayIcon.ActivationReason.Trigger:
            self.menu.popup(QCursor.pos())
