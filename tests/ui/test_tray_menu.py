"""The tray icon and menu drawn from status dicts (no service needed to check what they show)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from PySide6.QtGui import QColor
from pytestqt.qtbot import QtBot

from tests.support.status_samples import make_status
from tray_app.contract.status import ServiceStatus
from tray_app.ui.api_client import ServiceClient
from tray_app.ui.qt_events import QtEventBridge
from tray_app.ui.status_model import StatusModel
from tray_app.ui.tray import TrayIcon

STATE_COLOURS = {"serving": "#2f9e58", "degraded": "#f0a202", "down": "#d9403a"}


@pytest.fixture
def tray(qtbot: QtBot) -> Iterator[TrayIcon]:
    # The address is never called: these tests set the model's status by hand.
    client = ServiceClient("http://127.0.0.1:9")
    bridge = QtEventBridge()
    model = StatusModel(client, bridge)
    icon = TrayIcon(client, model, attached=False)
    yield icon
    model.stop()  # no reconciling fetch after the test
    icon.icon.hide()


def show(tray: TrayIcon, status: ServiceStatus | None, reachable: bool = True) -> None:
    tray.model.status = status
    tray.model.reachable = reachable
    tray.model.changed.emit()


def icon_centre_colour(tray: TrayIcon) -> QColor:
    image = tray.icon.icon().pixmap(64, 64).toImage()
    return image.pixelColor(14, 32)  # the chip's body, left of the glyph


@pytest.mark.parametrize(
    ("status", "level"),
    [
        (make_status(), "serving"),
        (make_status(gpu="restarting"), "degraded"),
        (make_status(gpu="failed", cpu="failed"), "down"),
    ],
)
def test_icon_colour_follows_the_state(tray: TrayIcon, status: ServiceStatus, level: str) -> None:
    show(tray, status)
    assert tray.level == level
    assert icon_centre_colour(tray).name() == STATE_COLOURS[level]


def test_simulated_device_adds_the_badge(tray: TrayIcon) -> None:
    show(tray, make_status(simulated=False))
    plain = tray.icon.icon().pixmap(64, 64).toImage()
    show(tray, make_status(simulated=True))
    badged = tray.icon.icon().pixmap(64, 64).toImage()
    assert plain.pixelColor(54, 54) != badged.pixelColor(54, 54)
    assert badged.pixelColor(52, 56).name() == "#6741d9"  # the purple "S" badge, lower right


def test_menu_shows_state_budget_workers_and_approvals(tray: TrayIcon) -> None:
    show(tray, make_status(gpu="restarting", pending=2))
    assert tray.header.headline.text() == "GPU worker restarting, CPU serving"
    assert "simulated 4.00 GiB" in tray.header.detail.text()
    assert tray.icon.toolTip().startswith("Failsoft: GPU worker restarting, CPU serving · simulated 4.00 GiB")
    assert "Weights" in tray.budget.legend_labels["weights"].text()
    gpu, cpu = tray.workers["gpu"], tray.workers["cpu"]
    assert gpu.title() == "GPU worker: restarting · pid 4242 · 180.00 MiB · 1 restart"
    assert cpu.title() == "CPU worker: ready · 1/4 slots busy · pid 4243 · 170.00 MiB"
    assert gpu.stop.isEnabled() and not gpu.start.isEnabled()
    assert tray.approvals_action.text() == "&Approvals (2 waiting)…"
    assert tray.quit_action.text() == "&Quit Failsoft"


def test_each_peer_is_a_read_only_line_under_the_workers(tray: TrayIcon) -> None:
    status = make_status()
    ready = {"name": "gaming-pc", "url": "http://192.168.1.20:8750", "state": "ready", "gpu_ready": True}
    down = {
        "name": "nas",
        "url": "http://192.168.1.30:8080",
        "state": "down",
        "last_failure": {"kind": "unreachable", "message": "refused"},
        "next_probe_in": 12.0,
    }
    status["peers"] = [{**ready, "priority": 0, "slots": 2, "models": ["qwen3-8b"]}, down]
    show(tray, status)
    assert [menu.title() for menu in tray.peers.values()] == [
        "Peer gaming-pc: ready (GPU)",
        "Peer nas: down: unreachable (next try in 12 s)",
    ]
    gaming_pc = tray.peers["gaming-pc"]
    lines = [action.text() for action in gaming_pc.actions()]
    assert lines == ["http://192.168.1.20:8750", "priority 0 · 2 slots · serves qwen3-8b"]
    assert not any(action.isEnabled() for action in gaming_pc.actions())  # nothing to do to a peer
    entries = [action.text() for action in tray.menu.actions()]
    assert entries.index(tray.workers["cpu"].title()) < entries.index(gaming_pc.title())
    assert entries.index(tray.peers["nas"].title()) < entries.index(tray.library.title())
    # A config reload that drops a peer drops its line; a service without peers has none.
    status["peers"] = [down]
    show(tray, status)
    assert list(tray.peers) == ["nas"]
    assert sum(1 for action in tray.menu.actions() if action.text().startswith("Peer ")) == 1
    show(tray, make_status())
    assert tray.peers == {}
    assert not any(action.text().startswith("Peer ") for action in tray.menu.actions())


def test_stopped_worker_can_be_started_not_stopped(tray: TrayIcon) -> None:
    status = make_status(cpu="stopped")
    status["workers"]["cpu"]["last_failure"] = {"kind": "killed", "reason": "killed by SIGKILL"}
    show(tray, status)
    cpu = tray.workers["cpu"]
    assert cpu.start.isEnabled() and not cpu.stop.isEnabled()
    assert cpu.failure.text() == "Last failure: killed by SIGKILL"


def test_unreachable_service_disables_worker_control(tray: TrayIcon) -> None:
    show(tray, None, reachable=False)
    assert tray.level == "down"
    assert tray.header.headline.text() == "Service not reachable"
    assert not tray.workers["gpu"].isEnabled()


def test_budget_event_updates_the_bar_before_the_next_status(tray: TrayIcon) -> None:
    show(tray, make_status())
    plan = dict(make_status()["plan"], kv_bytes=90 * 1024**2, n_ctx=4096, n_ctx_per_seq=2048)
    tray.model.apply_event({"type": "budget", "plan": {"gpu": plan, "cpu": {}, "device": {}}})
    assert "90.00 MiB" in tray.budget.legend_labels["kv"].text()
    assert "Context 2,048 per request" in tray.budget.caps.text()


def test_fallback_in_progress_shows_degraded_until_it_ends(tray: TrayIcon) -> None:
    show(tray, make_status())
    tray.model.apply_event({"type": "fallback_started", "job_id": "job-1", "reason": "oom_decode"})
    assert tray.level == "degraded"
    assert tray.header.headline.text() == "GPU serving, 1 job on CPU fallback"
    tray.model.apply_event(
        {"type": "fallback_completed", "job_id": "job-1", "reason": "oom_decode", "seconds": 2}
    )
    assert tray.level == "serving"
