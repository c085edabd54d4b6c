"""The tray's event stream survives the service going away and coming back on the same address."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from pytestqt.qtbot import QtBot

from tests.support import service as service_support
from tray_app.ui.api_client import ServiceClient
from tray_app.ui.qt_events import QtEventBridge

pytestmark = pytest.mark.integration


def test_stream_retries_connects_delivers_events_and_notices_the_end(qtbot: QtBot, tmp_path: Path) -> None:
    port = service_support.free_port()
    client = ServiceClient(f"http://127.0.0.1:{port}")
    stream = client.events()
    bridge = QtEventBridge()
    stream.event_received.connect(bridge.dispatch)
    jobs: list[dict[str, Any]] = []
    bridge.job_state.connect(jobs.append)
    connections: list[bool] = []
    stream.connection_changed.connect(connections.append)
    stream.start()
    try:
        # Nothing listens yet: the stream keeps retrying instead of giving up.
        qtbot.waitUntil(lambda: stream._attempt >= 2, timeout=10_000)
        assert not stream.connected
        with service_support.running_service(
            tmp_path / "service", settings={"cpu": {"threads": 1}}, port=port
        ) as handle:
            qtbot.waitUntil(lambda: stream.connected, timeout=15_000)
            body = {"prompt": "Hello", "max_tokens": 1}
            response = httpx.post(f"{handle.base_url}/v1/completions", json=body, timeout=60)
            assert response.status_code == 200, response.text
            job_id = response.headers["X-Failsoft-Job"]
            qtbot.waitUntil(
                lambda: (job_id, "completed") in [(j["job_id"], j["state"]) for j in jobs], timeout=10_000
            )
            assert {"type", "job_id", "state", "worker", "reason", "at"} <= set(jobs[-1])
        qtbot.waitUntil(lambda: not stream.connected, timeout=15_000)
        assert connections[:2] == [True, False]
    finally:
        stream.stop()
