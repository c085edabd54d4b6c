"""Settings that need a worker restart: the dialog says so, and on confirmation the real service restarts
its workers with the new plan."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from tests.support.service import ServiceHandle, running_service
from tray_app.ui.controller import TrayApp
from tray_app.ui.settings import SettingsDialog

pytestmark = pytest.mark.integration


def test_restart_on_confirmation_applies_the_new_context_cap(
    qtbot: QtBot, tmp_path: Path, tray_app_for: Callable[[ServiceHandle], TrayApp]
) -> None:
    settings = {"cpu": {"threads": 1}, "budget": {"max_ctx": 512}}
    with running_service(tmp_path / "svc", settings=settings) as service:
        before = service.status()
        app = tray_app_for(service)
        dialog = SettingsDialog(app.client, service.config_path)
        qtbot.addWidget(dialog)
        qtbot.waitUntil(dialog.save_button.isEnabled, timeout=10_000)  # the service's values are in
        assert dialog.n_parallel.value() == 4 and dialog.max_ctx.value() == 512
        dialog.n_ctx.setValue(1024)
        assert dialog.save() is True  # sent: the service writes its own file and answers
        qtbot.waitUntil(lambda: not dialog.restart_banner.isHidden(), timeout=10_000)
        assert "context cap" in dialog.restart_text.text()

        dialog.restart_button.click()
        qtbot.waitUntil(dialog.restart_banner.isHidden, timeout=180_000)
        assert "restarting with the new settings" in dialog.message.text()
        after = service.wait_workers_ready()
        assert after["caps"]["n_ctx"] == 1024
        assert after["workers"]["gpu"]["health"]["n_ctx"] == 1024
        assert after["workers"]["gpu"]["pid"] != before["workers"]["gpu"]["pid"]
