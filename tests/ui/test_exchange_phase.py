"""The line under an answer in flight says where its job went: the CPU, or a peer (another machine's GPU),
never the CPU for a peer. Driven by the service's events, on a stream that sends nothing."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Signal
from pytestqt.qtbot import QtBot

from tray_app.ui.answer_view import AnswerView
from tray_app.ui.exchange import Exchange
from tray_app.view.answer import Badge


class QuietStream(QObject):
    """A ChatStream's signals, none of them sent: the test sends the service's events instead."""

    started = Signal(dict)
    delta = Signal(str)
    thinking = Signal(str)
    finished = Signal(dict)
    failed = Signal(str, dict)
    stopped = Signal()
    usage: dict[str, Any] = {}  # noqa: RUF012


class Window:
    client: Any = None
    simulated = False

    def scroll_to_end(self) -> None:
        pass

    def exchange_ended(self, exchange: Exchange, badge: Badge) -> None:
        pass


def exchange(qtbot: QtBot) -> Exchange:
    view = AnswerView()
    qtbot.addWidget(view)
    in_flight = Exchange(Window(), view, QuietStream(), max_tokens=64)  # type: ignore[arg-type]
    in_flight.job_id = "job-1"
    return in_flight


def test_a_fallback_to_the_cpu_says_the_cpu(qtbot: QtBot) -> None:
    in_flight = exchange(qtbot)
    in_flight.on_event({"type": "fallback_started", "job_id": "job-1", "reason": "oom_decode"})
    assert in_flight.view.phase.text() == (
        "The GPU failed (the GPU ran out of memory while generating (oom_decode)); continuing on the CPU…"
    )
    in_flight.on_event({"type": "job_state", "job_id": "job-1", "state": "running", "worker": "cpu"})
    assert in_flight.on_cpu
    assert in_flight.view.phase.text() == "Running on the CPU: 0 of at most 64 tokens"


def test_a_fallback_to_a_peer_names_the_peer_and_is_not_a_cpu_run(qtbot: QtBot) -> None:
    in_flight = exchange(qtbot)
    event = {"type": "fallback_started", "job_id": "job-1", "reason": "crash_abort", "to": "peer:gaming-pc"}
    in_flight.on_event(event)
    assert in_flight.view.phase.text() == (
        "The GPU failed (the GPU worker crashed (crash_abort)); "
        "continuing on gaming-pc (another machine's GPU)…"
    )
    in_flight.on_event(
        {"type": "job_state", "job_id": "job-1", "state": "running", "worker": "peer:gaming-pc"}
    )
    assert not in_flight.on_cpu
    assert in_flight.view.phase.text() == "Running on gaming-pc (another machine's GPU)…"
    assert "CPU" not in in_flight.view.phase.text()
