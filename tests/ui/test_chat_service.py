"""The chat window against a real service with real workers: streamed tokens, the badge, stop, failover."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from tests.support.service import ServiceHandle, running_service
from tray_app.ui.chat import ChatWindow

pytestmark = pytest.mark.integration

ANSWER_TIMEOUT_MS = 180_000


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceHandle]:
    # A fixed CPU speed estimate keeps the replay decision independent of how busy this machine is.
    # One thread per worker: on a busy 2-core machine, two OpenMP threads per worker thrash badly.
    settings = {"cpu": {"threads": 1}, "failover": {"cpu_tokens_per_second": 50.0}}
    with running_service(
        tmp_path_factory.mktemp("chat-service"), enable_faults=True, settings=settings
    ) as handle:
        yield handle


def ask(qtbot: QtBot, chat: ChatWindow, text: str, max_tokens: int = 40) -> tuple[str, list[str]]:
    """Type a question, press Send, wait for the answer; returns the badge kind and the streamed pieces."""
    pieces: list[str] = []
    chat.max_tokens.setValue(max_tokens)
    chat.input.setPlainText(text)
    with qtbot.waitSignal(chat.answer_finished, timeout=ANSWER_TIMEOUT_MS) as finished:
        qtbot.mouseClick(chat.send_button, Qt.MouseButton.LeftButton)
        assert chat.current is not None
        chat.current.stream.delta.connect(pieces.append)
    return str(finished.args[0]), pieces


def job(service: ServiceHandle, job_id: str) -> dict[str, Any]:
    response = httpx.get(f"{service.base_url}/v1/jobs/{job_id}", timeout=10, headers=service.headers())
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data


def test_streamed_answer_with_gpu_badge(qtbot: QtBot, service: ServiceHandle, tray_app_for: Any) -> None:
    app = tray_app_for(service)
    app.show_chat()
    chat = app.chat
    kind, pieces = ask(qtbot, chat, "Name three colours of the rainbow.")
    answer = chat.answers[-1]
    assert kind == "gpu"
    assert len(pieces) > 3  # token by token, not one block at the end
    assert answer.text.text() == "".join(pieces)
    assert answer.badge.text().startswith("GPU (simulated) · ")
    assert answer.badge.text().endswith(" tok/s")
    assert chat.history == [
        {"role": "user", "content": "Name three colours of the rainbow."},
        {"role": "assistant", "content": answer.text.text()},
    ]
    assert chat.send_button.isEnabled() and not chat.stop_button.isEnabled()
    # The service's own token counts, against the GPU's context per request from its caps.
    per_request = service.status()["caps"]["n_ctx_per_seq"]
    used = re.fullmatch(
        rf"This chat so far: ([\d,]+) tokens of the GPU's {per_request:,} per request",
        chat.context_line.text(),
    )
    assert used is not None, chat.context_line.text()
    assert int(used[1].replace(",", "")) > len(pieces)  # the question's prompt and the answer


def test_stop_cancels_the_job_and_the_next_question_works(
    qtbot: QtBot, service: ServiceHandle, tray_app_for: Any
) -> None:
    app = tray_app_for(service)
    app.show_chat()
    chat = app.chat
    chat.max_tokens.setValue(2000)
    chat.input.setPlainText("Write a very long story about a lighthouse keeper and the sea.")
    qtbot.mouseClick(chat.send_button, Qt.MouseButton.LeftButton)
    exchange = chat.current
    assert exchange is not None
    qtbot.waitUntil(lambda: exchange.tokens >= 3, timeout=ANSWER_TIMEOUT_MS)
    assert chat.stop_button.isEnabled()
    with qtbot.waitSignal(chat.answer_finished, timeout=10_000) as finished:
        qtbot.mouseClick(chat.stop_button, Qt.MouseButton.LeftButton)
    assert finished.args[0] == "stopped"
    assert chat.answers[-1].badge.text().startswith("Stopped by you after ")
    assert exchange.job_id
    qtbot.waitUntil(lambda: job(service, exchange.job_id)["state"] == "cancelled", timeout=10_000)
    assert chat.history == []  # a half answer is not sent back as context
    kind, _pieces = ask(qtbot, chat, "Say hello.", max_tokens=8)
    assert kind == "gpu"


def test_gpu_failure_mid_answer_shows_failed_over_badge(
    qtbot: QtBot, service: ServiceHandle, tray_app_for: Any
) -> None:
    app = tray_app_for(service)
    app.show_chat()
    armed = httpx.post(
        f"{service.base_url}/failsoft/debug/faults",
        json={"kind": "abort", "after_tokens": 4},
        timeout=30,
        headers=service.headers(),
    )
    assert armed.status_code == 200, armed.text
    kind, pieces = ask(qtbot, app.chat, "List the planets of the solar system.", max_tokens=40)
    answer = app.chat.answers[-1]
    assert kind == "failover", answer.badge.text()
    assert answer.badge.text().startswith("Failed over to CPU: GPU worker crashed · ")
    assert "(crash_abort)" in answer.badge.toolTip()
    assert answer.text.text() == "".join(pieces)
    # The tray saw it too: a "moved to the CPU" message, and the GPU worker comes back.
    qtbot.waitUntil(
        lambda: any(n.title == "Moved to the CPU" for n in app.notifications.shown), timeout=15_000
    )
    service.wait_workers_ready()


def test_offscreen_service_unreachable_is_down(qtbot: QtBot, tmp_path: Path) -> None:
    from tests.support.service import free_port
    from tray_app.ui.controller import TrayApp

    app = TrayApp(f"http://127.0.0.1:{free_port()}", "", tmp_path / "config.toml", attached=True)
    app.start()
    try:
        qtbot.waitUntil(lambda: app.model.last_error != "", timeout=10_000)
        assert app.model.summary().level == "down"
        assert app.tray.header.headline.text() == "Service not reachable"
        # Offscreen there is no system tray: the same state shows in a small window instead.
        assert app.status_window is not None and app.status_window.isVisible()
        assert app.status_window.headline.text() == "Service not reachable"
        assert not app.tray.workers["gpu"].isEnabled()
    finally:
        app.stop()


def test_restart_from_the_worker_menu(qtbot: QtBot, service: ServiceHandle, tray_app_for: Any) -> None:
    app = tray_app_for(service)
    gpu_menu = app.tray.workers["gpu"]
    assert gpu_menu.title().startswith("GPU worker: ready")
    levels: list[str] = []
    app.model.changed.connect(lambda: levels.append(app.model.summary().level))
    old_pid = service.status()["workers"]["gpu"]["pid"]
    gpu_menu.restart.trigger()
    qtbot.waitUntil(lambda: "degraded" in levels, timeout=15_000)  # restarting: amber, CPU serving
    qtbot.waitUntil(
        lambda: gpu_menu.title().startswith("GPU worker: ready") and levels[-1] == "serving", timeout=60_000
    )
    assert service.status()["workers"]["gpu"]["pid"] != old_pid
    assert f"pid {old_pid}" not in gpu_menu.title()


def test_attached_tray_leaves_the_service_running_when_it_quits(
    service: ServiceHandle, tmp_path: Path
) -> None:
    state_file = tmp_path / "automation" / "ui-state.json"
    env = {
        **os.environ,
        "QT_QPA_PLATFORM": "offscreen",
        "FAILSOFT_UI_AUTOMATION": str(state_file.parent),
        "FAILSOFT_CONFIG": str(service.config_path),
        "FAILSOFT_ADMIN_TOKEN": service.admin_token,
    }
    tray = subprocess.Popen(
        [sys.executable, "-m", "tray_app", "--attach", service.base_url],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        state: dict[str, Any] = {}
        while time.monotonic() < deadline and not (state.get("reachable") and state.get("events_connected")):
            assert tray.poll() is None, tray.stderr.read().decode() if tray.stderr else ""
            if state_file.exists():
                state = json.loads(state_file.read_text(encoding="utf-8"))
            time.sleep(0.1)
        assert state.get("level") == "serving", state
        tray.send_signal(signal.SIGTERM)
        assert tray.wait(timeout=30) == 0
    finally:
        if tray.poll() is None:
            tray.kill()
            tray.wait()
    assert service.status()["workers"]["gpu"]["state"] == "ready"  # attached: the service keeps running
