"""The health answer for each mix of chat worker states (through real processes: test_api and
test_auth_and_inprocess)."""

from __future__ import annotations

import pytest

from tray_app.server.health import health_answer


@pytest.mark.parametrize(
    ("gpu", "cpu", "status", "word"),
    [
        ("ready", "ready", 200, "ok"),
        ("restarting", "ready", 200, "ok"),  # the CPU answers meanwhile
        ("failed", "ready", 200, "ok"),
        ("ready", "stopped", 200, "ok"),
        ("stopped", "stopped", 200, "ok"),  # unloaded models: the next request starts them
        ("absent", "stopped", 200, "ok"),
        ("starting", "starting", 503, "loading"),
        ("restarting", "stopped", 503, "loading"),
        ("unhealthy", "failed", 503, "loading"),
        ("failed", "failed", 503, "unavailable"),
        ("absent", "stopping", 503, "unavailable"),
    ],
)
def test_health_follows_whether_a_worker_can_answer(gpu: str, cpu: str, status: int, word: str) -> None:
    code, body = health_answer({"gpu": gpu, "cpu": cpu}, simulated=False)
    assert (code, body["status"]) == (status, word)
    assert body["workers"] == {"gpu": gpu, "cpu": cpu} and body["simulated"] is False
    if code == 503:
        assert body["error"]["type"] == "unavailable_error" and body["error"]["code"] == 503


def test_an_unavailable_answer_names_each_workers_state() -> None:
    _code, body = health_answer({"gpu": "failed", "cpu": "absent"}, simulated=True)
    assert body["error"]["message"] == "no worker can answer (gpu failed, cpu absent)"
    assert body["simulated"] is True
