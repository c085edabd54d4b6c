"""The GPU path in the tray: a notification that names who took the memory and what Failsoft does, the
menu's give-back / take-back action, and the VRAM timeline window drawn from a history."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pyqtgraph as pg
import pytest
from pytestqt.qtbot import QtBot

from tests.support.status_samples import make_status
from tests.view.test_device_now import sample, watched
from tray_app.ui.api_client import ServiceClient
from tray_app.ui.notifications import Notice, coalesce
from tray_app.ui.qt_events import QtEventBridge
from tray_app.ui.status_model import StatusModel
from tray_app.ui.timeline_window import TimelineWindow
from tray_app.ui.tray import GIVE_GPU, TAKE_GPU, TrayIcon
from tray_app.view.timeline import timeline

MiB = 1024**2


def path_event(state: str, reason: str, action: str) -> dict[str, Any]:
    return {
        "type": "gpu_path",
        "state": state,
        "previous": "normal",
        "reason": reason,
        "action": action,
        "at": time.time(),
    }


def test_a_program_cutting_into_the_reserve_is_named_with_what_failsoft_does() -> None:
    notice = coalesce(
        [path_event("squeezed", "comfyui (python3, pid 7) holds 3.42 GiB", "nothing new starts on the GPU")]
    )
    assert notice == Notice(
        "Another program took GPU memory",
        "Comfyui (python3, pid 7) holds 3.42 GiB. Nothing new starts on the GPU.",
        "warning",
        False,
    )
    lost = coalesce([path_event("lost", "the device is gone", "work goes to the CPU")])
    assert lost is not None and lost.level == "critical"
    burst = coalesce(
        [
            {"type": "fallback_started", "job_id": "j1", "reason": "oom_decode"},
            path_event("yielded", "asked", ""),
        ]
    )
    assert burst is not None and "GPU: the GPU is given to another program: asked" in burst.body


@pytest.fixture
def tray(qtbot: QtBot) -> Iterator[TrayIcon]:
    client = ServiceClient("http://127.0.0.1:9")  # never called: the status is set by hand
    model = StatusModel(client, QtEventBridge())
    icon = TrayIcon(client, model, attached=False)
    yield icon
    model.stop()
    icon.icon.hide()


def test_the_menu_gives_the_gpu_away_and_takes_it_back(tray: TrayIcon) -> None:
    tray.model.reachable = True
    tray.model.status = make_status()  # an older service: no device watcher, nothing to give away
    tray.model.changed.emit()
    assert not tray.gpu_action.isEnabled()
    tray.model.status = watched([])
    tray.model.changed.emit()
    assert (tray.gpu_action.text(), tray.gpu_action.isEnabled()) == (GIVE_GPU, True)
    tray.model.status = watched([], gpu="stopped", path="yielded")
    tray.model.changed.emit()
    assert tray.gpu_action.text() == TAKE_GPU
    assert tray.timeline_action.text() == "VRAM &timeline…"


def test_the_timeline_window_draws_the_bands_the_reserve_and_the_markers(qtbot: QtBot) -> None:
    window = TimelineWindow(ServiceClient("http://127.0.0.1:9"))
    qtbot.addWidget(window)
    history = {
        "watching": True,
        "reserve_bytes": 410 * MiB,
        "samples": [sample(100.0 + i, (i % 3) * 512 * MiB) for i in range(10)],
        "markers": [{"at": 104.0, "kind": "path", "text": "GPU squeezed: comfyui"}],
    }
    line = timeline(history, make_status()["plan"])
    window.draw(line)
    items = window.plot.getPlotItem().items
    fills = [item for item in items if isinstance(item, pg.PlotDataItem)]
    lines = [item for item in items if isinstance(item, pg.InfiniteLine)]
    assert len(fills) == len(line.series)
    assert sorted(round(float(item.value()), 3) for item in lines) == [-5.0, round((4096 - 410) / 1024, 3)]
    assert "10 readings" in window.note.text() and "1 markers" in window.note.text()
    assert "comfyui (python3, pid 7)" in window.legend.text() and "Free" in window.legend.text()
    window.draw(timeline({"watching": False, "reason": "no NVIDIA GPU", "samples": []}, None))
    assert window.note.text() == "no NVIDIA GPU"
