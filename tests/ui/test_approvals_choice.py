"""The approvals window's choice: the big model on the CPU in about N s, or its smaller stand-in on the GPU
now, offered only for the jobs the service offers a stand-in for."""

from __future__ import annotations

from typing import Any

from pytestqt.qtbot import QtBot

from tests.ui.local_server import LocalService
from tray_app.ui.api_client import ServiceClient
from tray_app.ui.approvals import ApprovalsWindow
from tray_app.ui.qt_events import QtEventBridge
from tray_app.view.pending import pending_jobs

JOBS: dict[str, Any] = {
    "object": "list",
    "data": [
        {
            "id": "job-offered",
            "state": "awaiting_approval",
            "model": "gemma3-270m",
            "stand_in_offer": "SmolLM2-135M-Instruct.Q4_1.gguf",
            "estimated_seconds": 95.0,
            "preview": "Write a long story",
            "created_at": 1.0,
        },
        {
            "id": "job-plain",
            "state": "awaiting_approval",
            "model": "gemma3-270m",
            "stand_in_offer": None,
            "estimated_seconds": 40.0,
            "preview": "Summarise this",
            "created_at": 2.0,
        },
    ],
}


def test_the_choice_is_put_in_words() -> None:
    offered, plain = pending_jobs(JOBS)
    assert offered.choice() == (
        "SmolLM2-135M-Instruct.Q4_1.gguf on the GPU now, or gemma3-270m on the CPU in about 1 min 35 s?"
    )
    assert plain.stand_in is None and plain.choice() == "gemma3-270m on the CPU in about 40 s"


def test_smaller_model_now_is_offered_only_where_the_service_offers_it(
    qtbot: QtBot, local_service: LocalService
) -> None:
    local_service.answer("GET", "/failsoft/jobs?state=awaiting_approval", 200, JOBS)
    local_service.answer(
        "POST", "/failsoft/jobs/job-offered/stand-in", 200, {"object": "job", "id": "job-offered"}
    )
    local_service.answer(
        "GET", "/failsoft/config", 200, {"config": {"failover": {"auto_approve_seconds": 0}}}
    )
    window = ApprovalsWindow(ServiceClient(local_service.base_url, "key"), QtEventBridge())
    qtbot.addWidget(window)
    window.refresh()
    qtbot.waitUntil(lambda: len(window.jobs) == 2)
    assert window.table.item(0, 2).text() == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert window.table.item(1, 2).text() == "—"
    window.table.selectRow(1)
    assert not window.stand_in_button.isEnabled()
    window.table.selectRow(0)
    assert window.stand_in_button.isEnabled()
    assert "on the GPU now, or gemma3-270m on the CPU" in window.stand_in_button.toolTip()
    window.stand_in_button.click()
    qtbot.waitUntil(lambda: bool(local_service.calls("POST", "/failsoft/jobs/job-offered/stand-in")))
    assert local_service.calls("POST", "/failsoft/jobs/job-plain/stand-in") == []
