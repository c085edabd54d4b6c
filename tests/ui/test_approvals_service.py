"""Approvals against a real service whose policy is `fallback = "approval"`: a job the GPU profile cannot take
waits in the window, and approving it there runs it to completion on the CPU."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PySide6.QtCore import Qt
from pytestqt.exceptions import TimeoutError
from pytestqt.qtbot import QtBot

from tests.support.service import ServiceHandle, running_service
from tray_app import config
from tray_app.ui.approvals import PROMPT_COLUMN, format_duration
from tray_app.ui.controller import TrayApp

pytestmark = pytest.mark.integration

GPU_CONTEXT = 256  # the planner's smallest: a request for more tokens than this needs the CPU worker
MAX_TOKENS = 24
# About 300 tokens of notes: with MAX_TOKENS a request exceeds the GPU profile. The notes come first so that
# the CPU worker reuses the same prompt prefix from one test to the next.
NOTES = " ".join(f"Note {index}: the harbour lights were checked at dusk." for index in range(30))


TIMEOUT_MS = 180_000  # the first CPU run after start can be slow on a busy 2-core machine


def long_prompt(question: str) -> str:
    return f"{NOTES}\n\n{question}"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceHandle]:
    settings = {
        # One thread per worker: on a busy 2-core machine, two OpenMP threads per worker thrash badly.
        "cpu": {"threads": 1},
        "budget": {"max_ctx": GPU_CONTEXT},
        "failover": {"fallback": "approval", "cpu_tokens_per_second": 50.0},
    }
    with running_service(tmp_path_factory.mktemp("approval-service"), settings=settings) as handle:
        yield handle


def submit(service: ServiceHandle, question: str) -> str:
    """A background job too large for the GPU profile: it waits for approval."""
    body = {"messages": [{"role": "user", "content": long_prompt(question)}], "max_tokens": MAX_TOKENS}
    response = httpx.post(f"{service.base_url}/v1/jobs", json=body, timeout=30)
    assert response.status_code == 202, response.text
    assert response.json()["state"] == "awaiting_approval"
    job_id: str = response.json()["id"]
    return job_id


def job(service: ServiceHandle, job_id: str) -> dict[str, Any]:
    response = httpx.get(f"{service.base_url}/v1/jobs/{job_id}", timeout=10, headers=service.headers())
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data


def wait_state(qtbot: QtBot, service: ServiceHandle, job_id: str, state: str) -> dict[str, Any]:
    """Wait for a job to reach `state`; on timeout, say where it is and what the service logged."""
    try:
        qtbot.waitUntil(lambda: job(service, job_id)["state"] == state, timeout=TIMEOUT_MS)
    except TimeoutError as error:
        raise AssertionError(f"{error}: {job(service, job_id)}\n{service.output()[-4000:]}") from None
    return job(service, job_id)


def row_of(app: TrayApp, job_id: str) -> int:
    assert app.approvals is not None
    ids = [pending.job_id for pending in app.approvals.jobs]
    return ids.index(job_id) if job_id in ids else -1


def test_approve_from_the_window_and_the_job_completes(
    qtbot: QtBot, service: ServiceHandle, tray_app_for: Any
) -> None:
    app: TrayApp = tray_app_for(service)
    job_id = submit(service, "Explain in two sentences why the sky is blue.")
    # The tray learns it from the event stream: a message, and the count in the menu.
    qtbot.waitUntil(
        lambda: any(n.title == "Approval needed" for n in app.notifications.shown), timeout=15_000
    )
    qtbot.waitUntil(lambda: "(1 waiting)" in app.tray.approvals_action.text(), timeout=15_000)
    app.notifications.message_clicked()  # clicking the message opens the window
    window = app.approvals
    assert window is not None and window.isVisible()
    qtbot.waitUntil(lambda: row_of(app, job_id) >= 0, timeout=15_000)
    row = row_of(app, job_id)
    estimate = job(service, job_id)["estimated_seconds"]
    assert estimate > 0
    assert window.table.item(row, 1).text() == format_duration(estimate)
    assert window.table.item(row, 2).text() == "—"  # one model: no smaller one to offer instead
    assert window.table.item(row, PROMPT_COLUMN).text().startswith("Note 0: the harbour lights")
    assert window.table.item(row, PROMPT_COLUMN).toolTip().startswith("Note 0: the harbour lights")
    assert window.heading.text() == "1 job waits for approval"
    window.table.selectRow(row)
    qtbot.mouseClick(window.approve_button, Qt.MouseButton.LeftButton)
    finished = wait_state(qtbot, service, job_id, "completed")
    assert finished["worker"] == "cpu"
    assert finished["result"]["choices"][0]["message"]["content"]
    qtbot.waitUntil(lambda: row_of(app, job_id) < 0, timeout=10_000)
    assert window.message.text() == f"Approved job {job_id}."
    qtbot.waitUntil(lambda: "(none waiting)" in app.tray.approvals_action.text(), timeout=10_000)


def test_reject_from_the_window(qtbot: QtBot, service: ServiceHandle, tray_app_for: Any) -> None:
    app: TrayApp = tray_app_for(service)
    job_id = submit(service, "Write a poem about rain.")
    app.show_approvals()
    window = app.approvals
    assert window is not None
    qtbot.waitUntil(lambda: row_of(app, job_id) >= 0, timeout=15_000)
    window.table.selectRow(row_of(app, job_id))
    qtbot.mouseClick(window.reject_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: job(service, job_id)["state"] == "rejected", timeout=15_000)
    qtbot.waitUntil(lambda: row_of(app, job_id) < 0, timeout=10_000)


def test_chat_answer_waits_queued_then_streams_from_the_cpu(
    qtbot: QtBot, service: ServiceHandle, tray_app_for: Any
) -> None:
    app: TrayApp = tray_app_for(service)
    app.show_chat()
    chat = app.chat
    assert chat is not None
    chat.max_tokens.setValue(MAX_TOKENS)
    chat.input.setPlainText(long_prompt("Describe a quiet harbour town at dawn."))
    qtbot.mouseClick(chat.send_button, Qt.MouseButton.LeftButton)
    answer = chat.answers[-1]
    qtbot.waitUntil(lambda: "Waiting for approval" in answer.phase.text(), timeout=15_000)
    assert answer.progress.isVisibleTo(answer) and answer.progress.maximum() == 0  # busy: no estimate yet
    app.show_approvals()
    window = app.approvals
    assert window is not None
    qtbot.waitUntil(lambda: len(window.jobs) == 1, timeout=15_000)
    with qtbot.waitSignal(chat.answer_finished, timeout=TIMEOUT_MS) as finished:
        qtbot.mouseClick(window.approve_all_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: "Running on the CPU" in answer.phase.text(), timeout=TIMEOUT_MS)
    assert finished.args[0] == "cpu"
    assert answer.badge.text().startswith("CPU, approved by you")
    assert answer.text.text()


def test_auto_approve_threshold_is_saved_and_used(
    qtbot: QtBot, service: ServiceHandle, tray_app_for: Any
) -> None:
    app: TrayApp = tray_app_for(service)
    app.show_approvals()
    window = app.approvals
    assert window is not None
    window.threshold.setValue(60)
    qtbot.mouseClick(window.save_threshold, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "uses the new threshold" in window.message.text(), timeout=15_000)
    assert config.load(service.config_path).failover.auto_approve_seconds == 60.0
    assert service.status()["policy"]["auto_approve_seconds"] == 60.0
    body = {
        "messages": [{"role": "user", "content": long_prompt("Count to five.")}],
        "max_tokens": MAX_TOKENS,
    }
    response = httpx.post(f"{service.base_url}/v1/jobs", json=body, timeout=30)
    assert response.status_code == 202 and response.json()["state"] != "awaiting_approval"
    job_id = response.json()["id"]
    wait_state(qtbot, service, job_id, "completed")


def test_settings_apply_live_values_and_name_what_needs_a_restart(
    qtbot: QtBot, service: ServiceHandle, tray_app_for: Any
) -> None:
    app: TrayApp = tray_app_for(service)
    app.show_settings()
    dialog = app.settings
    assert dialog is not None
    qtbot.waitUntil(dialog.save_button.isEnabled, timeout=10_000)  # the service's values are in
    dialog.deadline.setValue(75)
    assert dialog.save()
    qtbot.waitUntil(lambda: service.status()["policy"]["deadline"] == 75.0, timeout=10_000)
    assert dialog.restart_banner.isHidden()
    dialog.n_parallel.setValue(2)
    assert dialog.save()
    qtbot.waitUntil(lambda: not dialog.restart_banner.isHidden(), timeout=10_000)
    assert "concurrency" in dialog.restart_text.text()
    assert config.load(service.config_path).budget.n_parallel == 2
