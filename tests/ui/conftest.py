"""Qt widgets run on the offscreen platform here; the real-tray test starts its own X server."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.service import ServiceHandle
from tests.support.status_samples import make_status
from tests.ui.local_server import LocalService
from tray_app.contract.status import ServiceStatus
from tray_app.ui.controller import TrayApp

# Before any QApplication exists (pytest-qt creates it on first use).
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture
def status() -> ServiceStatus:
    return make_status()


@pytest.fixture
def local_service() -> Iterator[LocalService]:
    service = LocalService()
    yield service
    service.close()


@pytest.fixture
def tray_app_for(qtbot: Any) -> Iterator[Callable[[ServiceHandle], TrayApp]]:
    """A TrayApp wired to a real service, stopped after the test (no tray icon offscreen: the same code)."""
    apps: list[TrayApp] = []

    def make(service: ServiceHandle) -> TrayApp:
        app = TrayApp(
            service.base_url, service.api_key, service.config_path, attached=True, admin=service.admin_token
        )
        app.start()
        apps.append(app)
        qtbot.waitUntil(lambda: app.events.connected and app.model.reachable, timeout=15_000)
        return app

    yield make
    for app in apps:
        app.stop()
        app.deleteLater()  # let Qt tear down the network manager and its replies in order
    qtbot.wait(50)
