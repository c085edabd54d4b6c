"""The chat window: a conversation with the service, tokens shown as they stream, a stop button, and under
each answer a badge saying who served it (GPU, CPU, or failed over, with the reason) and how fast, and one
naming the model and device that answered (and the model it stood in for)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from tray_app.ui.answer_view import AnswerView
from tray_app.ui.api_client import ApiCall, ServiceClient
from tray_app.ui.exchange import Exchange
from tray_app.ui.icons import app_icon
from tray_app.ui.qt_events import QtEventBridge
from tray_app.view.answer import Badge
from tray_app.view.pending import job_list


class ChatWindow(QWidget):
    """The conversation, an input box, Send and Stop."""

    answer_finished = Signal(str)  # the badge kind

    def __init__(self, client: ServiceClient, bridge: QtEventBridge) -> None:
        super().__init__()
        self.client = client
        self.simulated = False
        self.gpu_context: int | None = None  # the GPU's context per request (the service's caps)
        self.conversation_tokens = 0  # what the last answer's request and answer took (its usage)
        self.history: list[dict[str, str]] = []
        self.current: Exchange | None = None
        self.answers: list[AnswerView] = []
        self.setWindowTitle("Failsoft — Chat")
        self.setWindowIcon(app_icon())
        self.resize(640, 620)
        self._build_transcript()
        self._build_input()
        self._lay_out()
        for signal in (bridge.approval_needed, bridge.fallback_started, bridge.job_state):
            signal.connect(self._on_event)
        self._show_context()

    def _build_transcript(self) -> None:
        """The bubbles, in a scroll area that never scrolls sideways (bubbles wrap to its width instead)."""
        self.transcript = QWidget()
        self.transcript.setObjectName("transcript")
        self.transcript_layout = QVBoxLayout(self.transcript)
        self.transcript_layout.setContentsMargins(14, 14, 14, 14)
        self.transcript_layout.setSpacing(10)
        self.transcript_layout.addStretch(1)  # under the bubbles: they stay at the top
        self.transcript_scroll = QScrollArea()
        self.transcript_scroll.setWidgetResizable(True)
        self.transcript_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.transcript_scroll.setWidget(self.transcript)
        self.transcript_scroll.setStyleSheet("QScrollArea, #transcript { background: #f8f9fa; }")

    def _build_input(self) -> None:
        """The question box, the answer's token limit, the buttons and the line on the conversation's size."""
        self.input = QPlainTextEdit()
        self.input.setPlaceholderText("Ask something… (Ctrl+Enter sends)")
        self.input.setMaximumHeight(90)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 32768)
        self.max_tokens.setValue(256)
        self.max_tokens.setPrefix("max ")
        self.max_tokens.setSuffix(" tokens")
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.new_button = QPushButton("New chat")
        self.new_button.setToolTip("Start over: the next question is sent without this conversation")
        self.context_line = QLabel()
        self.context_line.setWordWrap(True)
        self.send_button.clicked.connect(self.send)
        self.stop_button.clicked.connect(self.stop)
        self.new_button.clicked.connect(self.new_chat)
        self.max_tokens.valueChanged.connect(lambda _value: self._show_context())
        QShortcut(QKeySequence("Ctrl+Return"), self, self.send)

    def _lay_out(self) -> None:
        """The transcript takes the height; under it the context line, the question box and the buttons."""
        controls = QHBoxLayout()
        controls.addWidget(self.new_button)
        controls.addWidget(self.max_tokens)
        controls.addStretch(1)
        controls.addWidget(self.stop_button)
        controls.addWidget(self.send_button)
        bottom = QVBoxLayout()
        bottom.setContentsMargins(12, 0, 12, 0)
        bottom.addWidget(self.context_line)
        bottom.addWidget(self.input)
        bottom.addLayout(controls)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 10)
        layout.setSpacing(8)
        layout.addWidget(self.transcript_scroll, 1)
        layout.addLayout(bottom)

    def set_gpu_context(self, tokens: int | None) -> None:
        self.gpu_context = tokens or None
        self._show_context()

    def new_chat(self) -> None:
        """Start over: the transcript and the conversation sent with the next question are emptied."""
        if self.current is not None:
            return
        while self.transcript_layout.count() > 1:  # every bubble's row; the stretch at the end stays
            row = self.transcript_layout.takeAt(0)
            layout = row.layout() if row is not None else None
            while layout is not None and (item := layout.takeAt(0)) is not None:
                if (widget := item.widget()) is not None:
                    widget.deleteLater()
        self.history.clear()
        self.answers.clear()
        self.conversation_tokens = 0
        self._show_context()
        self.input.setFocus()

    def _show_context(self) -> None:
        """How much of a request's context the conversation takes, and when the next answer cannot fit the
        GPU's (the service then runs it on the CPU, or asks)."""
        used, limit, answer = self.conversation_tokens, self.gpu_context, self.max_tokens.value()
        if not used:
            self.context_line.hide()
            return
        text = f"This chat so far: {used:,} tokens"
        style = "color: #6c757d;"
        if limit is not None and used + answer > limit:
            text += (
                f", and with an answer of up to {answer:,} more it exceeds the GPU's {limit:,} tokens per "
                "request: the next answer runs on the CPU (or waits for your approval). New chat starts over."
            )
            style = "color: #a05a00;"
        elif limit is not None:
            text += f" of the GPU's {limit:,} per request"
        self.context_line.setText(text)
        self.context_line.setStyleSheet(style)
        self.context_line.show()

    def _add_bubble(self, widget: QWidget, mine: bool) -> None:
        # Its width comes from the row, never from its content: a long word or badge wraps or is cut inside
        # the bubble instead of pushing the transcript past the window's edge.
        policy = widget.sizePolicy()
        policy.setHorizontalPolicy(QSizePolicy.Policy.Ignored)
        widget.setSizePolicy(policy)
        row = QHBoxLayout()
        if mine:
            row.addStretch(1)
        row.addWidget(widget, 4)
        if not mine:
            row.addStretch(1)
        self.transcript_layout.insertLayout(self.transcript_layout.count() - 1, row)

    def send(self) -> None:
        text = self.input.toPlainText().strip()
        if not text or self.current is not None:
            return
        self.input.clear()
        question = QLabel(text)
        question.setWordWrap(True)
        question.setTextFormat(Qt.TextFormat.PlainText)
        question.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        question.setStyleSheet("background: #3b5bdb; color: white; border-radius: 10px; padding: 9px 12px;")
        self._add_bubble(question, mine=True)
        answer = AnswerView()
        self.answers.append(answer)
        self._add_bubble(answer, mine=False)
        self.history.append({"role": "user", "content": text})
        stream = self.client.chat(list(self.history), self.max_tokens.value())
        self.current = Exchange(self, answer, stream, self.max_tokens.value())
        self.send_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.new_button.setEnabled(False)
        self.scroll_to_end()

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()

    def exchange_ended(self, exchange: Exchange, badge: Badge) -> None:
        answer = exchange.view.text.text()
        if badge.kind in ("failed", "stopped") or not answer:
            self.history.pop()  # the question stays on screen; the next one is not asked after a half answer
        else:
            self.history.append({"role": "assistant", "content": answer})
            usage = exchange.usage
            self.conversation_tokens = int(usage.get("prompt_tokens") or 0) + int(
                usage.get("completion_tokens") or 0
            )
        self.current = None
        self.send_button.setEnabled(True)
        self.stop_button.setEnabled(False)
        self.new_button.setEnabled(True)
        self._show_context()
        self.scroll_to_end()
        self.answer_finished.emit(badge.kind)

    def _on_event(self, event: dict[str, Any]) -> None:
        exchange = self.current
        if exchange is None:
            return
        job_id = str(event.get("job_id") or "")
        if exchange.job_id and job_id == exchange.job_id:
            exchange.on_event(event)
        elif not exchange.job_id and event.get("type") == "approval_needed":
            self._match_job_by_request(exchange, event)

    def _match_job_by_request(self, exchange: Exchange, event: dict[str, Any]) -> None:
        """A request waiting for approval has no answer headers yet: find its job by our request id."""
        call: ApiCall = self.client.awaiting_approval()

        def matched(answer: object) -> None:
            for job in job_list(answer):
                if job.get("request_id") == exchange.stream.request_id:
                    exchange.job_id = str(job.get("id") or "")
                    if exchange.job_id == event.get("job_id"):
                        exchange.on_event(event)

        call.succeeded.connect(matched)

    def scroll_to_end(self) -> None:
        bar = self.transcript_scroll.verticalScrollBar()
        # The bar as the timer's context: a window closed before the timer fires drops the call with it.
        QTimer.singleShot(0, bar, lambda: bar.setValue(bar.maximum()))
