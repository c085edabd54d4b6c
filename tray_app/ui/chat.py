"""The chat window: a conversation with the service, tokens shown as they stream, a stop button, and under
each answer a badge saying who served it (GPU, CPU, or failed over, with the reason) and how fast, and one
naming the model and device that answered (and the model it stood in for)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QRect, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QResizeEvent, QShortcut, QTextCursor, QTextDocument
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from tray_app.contract.vocabulary import FINAL_JOB_STATES
from tray_app.ui.api_client import ApiCall, ChatStream, ServiceClient
from tray_app.ui.flow_layout import FlowLayout
from tray_app.ui.icons import app_icon
from tray_app.ui.notifications import reason_text
from tray_app.ui.qt_events import QtEventBridge
from tray_app.view.pending import job_list
from tray_app.view.state import device_name, format_duration, where_text

JOB_POLL_MS = 1000
MODEL_NAME_CHARS = 36  # a badge shows at most this much of a model's name; its tooltip has all of it
BADGE_COLORS = {
    "gpu": ("#2b8a3e", "#ebfbee"),
    "cpu": ("#1864ab", "#e7f5ff"),
    "failover": ("#a05a00", "#fff4e6"),
    "failed": ("#c92a2a", "#fff5f5"),
    "stopped": ("#495057", "#f1f3f5"),
    "stand_in": ("#a05a00", "#fff4e6"),  # a smaller model answered for the one asked
}


@dataclass(frozen=True)
class Badge:
    kind: str  # gpu, cpu, failover, failed, stopped
    text: str
    detail: str = ""  # the long form, shown as the badge's tooltip


# Why an answer came from the CPU, in a few words for the badge (the tooltip has the full sentence).
SHORT_REASONS = {
    "oom_decode": "GPU out of memory",
    "oom_load": "GPU out of memory at load",
    "crash_abort": "GPU worker crashed",
    "killed": "GPU worker killed",
    "hung": "GPU worker hung",
    "exited": "GPU worker exited",
    "exceeds_gpu_profile": "too large for the GPU profile",
    "gpu_unavailable": "GPU worker unavailable",
}


def tokens_per_second(tokens: int, seconds: float) -> float | None:
    if tokens < 2 or seconds <= 0:
        return None
    return tokens / seconds


def answered_on(failsoft: dict[str, Any]) -> str:
    """The device that answered: the service's `device`, else the worker's role ("cpu@gemma3-270m": cpu)."""
    return str(failsoft.get("device") or str(failsoft.get("worker") or "").partition("@")[0])


def answer_badge(failsoft: dict[str, Any], tokens: int, seconds: float, simulated: bool = False) -> Badge:
    """Who served the answer: a replay after a GPU failure is "failed over", a request the GPU profile could
    not take is "CPU" with its reason."""
    worker = answered_on(failsoft)
    reason = str(failsoft.get("fallback_reason") or "")
    attempts = int(failsoft.get("attempts") or 1)
    rate = tokens_per_second(tokens, seconds)
    speed = f" · {rate:.1f} tok/s" if rate is not None else ""
    short = SHORT_REASONS.get(reason, reason)
    detail = f"Reason: {reason_text(reason)}; attempts: {attempts}" if reason else f"Attempts: {attempts}"
    if worker == "cpu" and attempts > 1:
        return Badge("failover", f"Failed over to CPU: {short}{speed}", detail)
    if worker == "cpu" and reason == "approval_required":
        return Badge("cpu", f"CPU, approved by you{speed}", detail)
    if worker == "cpu":
        because = f": {short}" if reason else ""
        return Badge("cpu", f"CPU{because}{speed}", detail)
    if worker == "gpu":
        retried = f" · {attempts} attempts" if attempts > 1 else ""
        return Badge("gpu", f"GPU{' (simulated)' if simulated else ''}{retried}{speed}", detail)
    return Badge("gpu" if worker else "stopped", f"{worker or 'Unknown worker'}{speed}", detail)


def model_badge(failsoft: dict[str, Any]) -> Badge | None:
    """ "gemma3-270m on GPU · stand-in for qwen3-8b"; None from a service that does not name the model."""
    model = str(failsoft.get("model") or "")
    if not model:
        return None
    device = answered_on(failsoft)
    short = short_model_name(model)
    text = f"{short} on {device_name(device)}" if device else short
    detail = f"Answered by {model} {where_text(device)}" if device else f"Answered by {model}"
    stand_in_for = str(failsoft.get("stand_in_for") or "")
    if stand_in_for:
        return Badge(
            "stand_in",
            f"{text} · stand-in for {short_model_name(stand_in_for)}",
            f"{detail}, standing in for {stand_in_for}, which could not answer on the GPU",
        )
    return Badge(device if device in ("gpu", "cpu") else "stopped", text, detail)


def short_model_name(name: str, limit: int = MODEL_NAME_CHARS) -> str:
    """`name` cut in the middle to `limit` characters: a GGUF file name keeps its start (the model) and its
    end (the quantisation)."""
    if len(name) <= limit:
        return name
    tail = limit // 3
    return f"{name[: limit - tail - 1]}…{name[-tail:]}"


def with_header_model(failsoft: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    """The answer's `failsoft` object, with the model from the X-Failsoft-* headers when it names none (a job
    result read back after its stream ended). The header's device only counts when nothing else says where
    it ran: a failover after the headers moves the answer to the CPU."""
    info = dict(failsoft)
    if not info.get("model") and headers.get("x-failsoft-model"):
        info["model"] = headers["x-failsoft-model"]
        if not answered_on(info) and headers.get("x-failsoft-device"):
            info["device"] = headers["x-failsoft-device"]
    return info


def _completion_text(result: dict[str, Any]) -> tuple[str, str]:
    """A finished job's answer and its reasoning (a thinking model's; else "")."""
    choices = result.get("choices") or []
    if not choices:
        return "", ""
    choice = choices[0]
    message = choice.get("message") or {}
    text = str(message.get("content") or choice.get("text") or "")
    return text, str(message.get("reasoning_content") or "")


class AnswerText(QTextEdit):
    """An answer's text as it streams in: read-only, selectable, as tall as its lines. A token is added at
    the end of the document, which lays out only its last paragraph again; a label given the whole text
    for each token lays all of it out several times (60 ms a token after 3000 of them, measured): a long
    answer would freeze the tray, whose menu shares this thread."""

    def __init__(self) -> None:
        super().__init__()
        self.setReadOnly(True)
        self.setAcceptRichText(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setStyleSheet("QTextEdit { background: transparent; }")
        self.document().setDocumentMargin(0)
        self.document().documentLayout().documentSizeChanged.connect(self._fit_height)
        self._source: list[str] = []  # the answer as the model wrote it
        self._fit_height()

    def text(self) -> str:
        """The answer as the model wrote it (Markdown source, also once it is shown formatted)."""
        return "".join(self._source)

    def append_text(self, text: str) -> None:
        self._source.append(text)
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(text)

    def show_formatted(self) -> None:
        """The finished answer as Markdown, as chat clients show one: code blocks, lists, emphasis. HTML in
        it stays text. Once, at the end: parsing the whole answer again for every token is what made long
        answers freeze the tray."""
        features = (
            QTextDocument.MarkdownFeature.MarkdownDialectGitHub | QTextDocument.MarkdownFeature.MarkdownNoHTML
        )
        self.document().setMarkdown(self.text(), features)

    def resizeEvent(self, event: QResizeEvent) -> None:  # the width decides how many lines it wraps to
        super().resizeEvent(event)
        self._fit_height()

    def _fit_height(self, *_: object) -> None:
        margins = self.contentsMargins()
        height = math.ceil(self.document().size().height()) + margins.top() + margins.bottom()
        if height != self.height():
            self.setFixedHeight(height)


class AnswerView(QFrame):
    """One assistant answer: a thinking model's reasoning (shown while it thinks, folded away once the
    answer begins, a click shows it again), its text, a progress line while it waits or runs on the CPU, and
    its badge."""

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("answer")
        self.thought_toggle = QPushButton("Thinking…")
        self.thought_toggle.setCheckable(True)
        self.thought_toggle.setFlat(True)
        self.thought_toggle.setStyleSheet("color: #6c757d; text-align: left; padding: 0;")
        self.thought_toggle.toggled.connect(self._show_thought)
        self.thought_toggle.hide()
        self.thought = AnswerText()
        self.thought.setStyleSheet("QTextEdit { background: transparent; color: #6c757d; }")
        self.thought.hide()
        self.text = AnswerText()
        self.phase = QLabel("Waiting for the service…")
        self.phase.setStyleSheet("color: #6c757d; font-style: italic;")
        self.progress = QProgressBar()
        self.progress.setMaximumHeight(8)
        self.progress.setTextVisible(False)
        self.progress.hide()
        self.badge = BadgeLabel()
        self.badge.hide()
        self.badge_kind = ""
        self.model_badge = BadgeLabel()
        self.model_badge.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 10, 12, 10)
        layout.setSpacing(6)
        layout.addWidget(self.thought_toggle)
        layout.addWidget(self.thought)
        layout.addWidget(self.text)
        layout.addWidget(self.phase)
        layout.addWidget(self.progress)
        badges = FlowLayout()  # side by side while they fit, one under the other when they do not
        badges.addWidget(self.badge)
        badges.addWidget(self.model_badge)
        layout.addLayout(badges)
        self.setStyleSheet("#answer { background: #ffffff; border: 1px solid #dee2e6; border-radius: 10px; }")

    def append(self, text: str) -> None:
        if self.thought.text() and not self.text.text():
            self.thought_toggle.setChecked(False)  # the answer begins: its reasoning folds away
        self.text.append_text(text)

    def append_thinking(self, text: str) -> None:
        if not self.thought.text():
            self.thought_toggle.show()
            self.thought_toggle.setChecked(True)
        self.thought.append_text(text)

    def _show_thought(self, shown: bool) -> None:
        self.thought.setVisible(shown)
        words = len(self.thought.text().split())
        if shown:
            thinking = not self.text.text() and not self.badge_kind  # no answer yet, and not over
            self.thought_toggle.setText("Thinking…" if thinking else "Hide the reasoning")
        else:
            self.thought_toggle.setText(f"Reasoning ({words} words): show")

    def set_phase(self, text: str) -> None:
        self.phase.setText(text)
        self.phase.setVisible(bool(text))

    def set_progress(self, value: int | None, maximum: int = 100) -> None:
        """A fraction of `maximum`, or None for "busy, no estimate"."""
        if value is None:
            self.progress.setRange(0, 0)
        else:
            self.progress.setRange(0, maximum)
            self.progress.setValue(min(value, maximum))
        self.progress.show()

    def set_badge(self, badge: Badge, model: Badge | None = None) -> None:
        """The answer is over (answered, failed or stopped): its badges, and its text formatted."""
        self.badge_kind = badge.kind
        self.text.show_formatted()
        if self.thought.text():
            self._show_thought(self.thought_toggle.isChecked())  # "Thinking…" is over
        _paint_badge(self.badge, badge)
        if model is not None:
            _paint_badge(self.model_badge, model)
        self.set_phase("")
        self.progress.hide()


class BadgeLabel(QLabel):
    """A badge's label: on one line while its row has room (the size hint FlowLayout places it by), its
    words wrapped when even a row of its own is too narrow."""

    def __init__(self) -> None:
        super().__init__("")
        self.setWordWrap(True)
        self.setIndent(0)  # else a framed label indents by half an "x", which the hint below leaves out

    def sizeHint(self) -> QSize:
        flags = self.alignment().value | Qt.TextFlag.TextExpandTabs.value
        text = self.fontMetrics().boundingRect(QRect(0, 0, 2000, 2000), flags, self.text())
        margins = self.contentsMargins()
        width = text.width() + margins.left() + margins.right()
        return QSize(width, self.heightForWidth(width))


def _paint_badge(label: QLabel, badge: Badge) -> None:
    foreground, background = BADGE_COLORS[badge.kind]
    label.setText(badge.text)
    label.setToolTip(badge.detail)
    label.setStyleSheet(
        f"color: {foreground}; background: {background}; border: 1px solid {foreground};"
        " border-radius: 8px; padding: 2px 8px; font-size: 11px; font-weight: 600;"
    )
    label.show()


class Exchange:
    """One question and its answer while it is in flight: the stream, then (if it had to wait) the job."""

    def __init__(self, window: ChatWindow, view: AnswerView, stream: ChatStream, max_tokens: int) -> None:
        self.window = window
        self.view = view
        self.stream = stream
        self.max_tokens = max_tokens
        self.job_id = ""
        self.headers: dict[str, str] = {}
        self.on_cpu = False
        self.estimated_seconds = 0.0
        self.cpu_started: float | None = None
        self.first_token_at: float | None = None
        self.tokens = 0
        self.usage: dict[str, Any] = {}  # the answer's token counts (prompt and completion), once it ended
        self.done = False
        self.poll = QTimer(view)
        self.poll.setInterval(JOB_POLL_MS)
        self.poll.timeout.connect(self._poll_job)
        stream.started.connect(self._started)
        stream.delta.connect(self._delta)
        stream.thinking.connect(self._thinking)
        stream.finished.connect(self._finished)
        stream.failed.connect(self._failed)
        stream.stopped.connect(self._stopped)

    # the stream
    def _started(self, headers: dict[str, str]) -> None:
        self.job_id = headers.get("x-failsoft-job", self.job_id)
        self.headers = headers
        if not self.tokens:
            model, device = headers.get("x-failsoft-model"), headers.get("x-failsoft-device")
            on = f" with {model} on {device_name(device)}" if model and device else ""
            self.view.set_phase(f"Generating{on}…")

    def _delta(self, text: str) -> None:
        self._token(self.view.append, text)

    def _thinking(self, text: str) -> None:
        self._token(self.view.append_thinking, text)

    def _token(self, show: Callable[[str], None], text: str) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        self.tokens += 1
        show(text)
        if self.on_cpu:
            self._show_cpu_progress()
        else:
            self.view.set_phase("")
        self.window.scroll_to_end()

    def _finished(self, failsoft: dict[str, Any]) -> None:
        self.usage = self.stream.usage
        tokens = int(self.stream.usage.get("completion_tokens") or self.tokens)
        seconds = time.monotonic() - self.first_token_at if self.first_token_at is not None else 0.0
        info = with_header_model(failsoft, self.headers)
        self._end(answer_badge(info, tokens, seconds, self.window.simulated), model_badge(info))

    def _failed(self, message: str, error: dict[str, Any]) -> None:
        job_id = str(error.get("job_id") or "")
        if job_id and error.get("code") not in ("rejected", "cancelled"):
            # The service kept the job (waiting for approval, or a slow CPU run): follow it to the end.
            self.job_id = job_id
            self.view.set_phase(f"Queued as job {job_id}: {message}")
            self.view.set_progress(None)
            self.poll.start()
            return
        self._end(Badge("failed", f"Failed — {message}"))

    def _stopped(self) -> None:
        self._end(Badge("stopped", f"Stopped by you after {self.tokens} tokens"))

    def stop(self) -> None:
        if self.poll.isActive() and self.job_id:
            self.window.client.cancel_job(self.job_id)
            self.poll.stop()
            self._end(Badge("stopped", f"Job {self.job_id} cancelled"))
        else:
            self.stream.stop()

    # service events about this job
    def on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "approval_needed":
            self.estimated_seconds = float(event.get("estimated_seconds") or 0)
            self.view.set_phase(
                f"Queued for the CPU: about {format_duration(self.estimated_seconds)}. "
                "Waiting for approval in the Approvals window."
            )
            self.view.set_progress(None)
        elif kind == "fallback_started":
            self.view.set_phase(
                f"The GPU failed ({reason_text(str(event.get('reason') or ''))}); continuing on the CPU…"
            )
        elif kind == "job_state" and event.get("state") == "running" and event.get("worker") == "cpu":
            self.on_cpu = True
            self.cpu_started = time.monotonic()
            self._show_cpu_progress()
        elif kind == "job_state" and event.get("state") == "rejected":
            self.view.set_phase("Rejected in the Approvals window.")

    def _show_cpu_progress(self) -> None:
        if self.estimated_seconds and self.cpu_started is not None:
            elapsed = time.monotonic() - self.cpu_started
            self.view.set_progress(int(100 * elapsed / self.estimated_seconds))
            left = max(self.estimated_seconds - elapsed, 0)
            self.view.set_phase(
                f"Running on the CPU: {self.tokens} tokens, about {format_duration(left)} left"
            )
        else:
            self.view.set_progress(self.tokens, self.max_tokens)
            self.view.set_phase(f"Running on the CPU: {self.tokens} of at most {self.max_tokens} tokens")

    # a job that outlived its stream
    def _poll_job(self) -> None:
        call = self.window.client.job(self.job_id)
        call.succeeded.connect(self._job_answer)

    def _job_answer(self, job: object) -> None:
        if not isinstance(job, dict) or self.done:
            return
        state = str(job.get("state") or "")
        if state == "running" and job.get("worker") == "cpu" and not self.on_cpu:
            self.on_cpu = True
            self.cpu_started = time.monotonic()
            self.estimated_seconds = float(job.get("estimated_seconds") or 0)
        if self.on_cpu and state == "running":
            self._show_cpu_progress()
        if state not in FINAL_JOB_STATES:
            return
        self.poll.stop()
        result = job.get("result") or {}
        if state == "completed":
            text, reasoning = _completion_text(result)
            if reasoning:
                self.view.append_thinking(reasoning)
            self.view.append(text)
            self.usage = dict(result.get("usage") or {})
            tokens = int(self.usage.get("completion_tokens") or 0)
            seconds = time.monotonic() - self.cpu_started if self.cpu_started else 0.0
            info = result.get("failsoft") or {
                "worker": job.get("worker"),
                "attempts": job.get("attempts"),
                "fallback_reason": job.get("fallback_reason"),
            }
            info = with_header_model(info, self.headers)
            self._end(answer_badge(info, tokens, seconds, self.window.simulated), model_badge(info))
        else:
            message = str((job.get("error") or {}).get("message") or state)
            self._end(Badge("failed", f"Job {state} — {message}"))

    def _end(self, badge: Badge, model: Badge | None = None) -> None:
        if self.done:
            return
        self.done = True
        self.poll.stop()
        self.view.set_badge(badge, model)
        self.window.exchange_ended(self, badge)


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

        self.transcript = QWidget()
        self.transcript.setObjectName("transcript")
        self.transcript_layout = QVBoxLayout(self.transcript)
        self.transcript_layout.setContentsMargins(14, 14, 14, 14)
        self.transcript_layout.setSpacing(10)
        self.transcript_layout.addStretch(1)
        self.transcript_scroll = QScrollArea()
        self.transcript_scroll.setWidgetResizable(True)
        self.transcript_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.transcript_scroll.setWidget(self.transcript)
        self.transcript_scroll.setStyleSheet("QScrollArea, #transcript { background: #f8f9fa; }")

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

        controls = QHBoxLayout()
        controls.addWidget(self.new_button)
        controls.addWidget(self.max_tokens)
        controls.addStretch(1)
        controls.addWidget(self.stop_button)
        controls.addWidget(self.send_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 10)
        layout.setSpacing(8)
        layout.addWidget(self.transcript_scroll, 1)
        bottom = QVBoxLayout()
        bottom.setContentsMargins(12, 0, 12, 0)
        bottom.addWidget(self.context_line)
        bottom.addWidget(self.input)
        bottom.addLayout(controls)
        layout.addLayout(bottom)

        for signal in (bridge.approval_needed, bridge.fallback_started, bridge.job_state):
            signal.connect(self._on_event)
        self._show_context()

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
                    exchange.job_id = str(job.get("id") or job.get("job_id") or "")
                    if exchange.job_id == event.get("job_id"):
                        exchange.on_event(event)

        call.succeeded.connect(matched)

    def scroll_to_end(self) -> None:
        bar = self.transcript_scroll.verticalScrollBar()
        # The bar as the timer's context: a window closed before the timer fires drops the call with it.
        QTimer.singleShot(0, bar, lambda: bar.setValue(bar.maximum()))
