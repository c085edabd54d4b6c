"""The chat's widgets for one answer: its text as it streams (formatted once it ends), a thinking model's
reasoning folded away once the answer begins, a progress line, and its badges."""

from __future__ import annotations

import math

from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtGui import QResizeEvent, QTextCursor, QTextDocument
from PySide6.QtWidgets import QFrame, QLabel, QProgressBar, QPushButton, QSizePolicy, QTextEdit, QVBoxLayout

from tray_app.ui.flow_layout import FlowLayout
from tray_app.view.answer import Badge

BADGE_COLORS = {
    "gpu": ("#2b8a3e", "#ebfbee"),
    "cpu": ("#1864ab", "#e7f5ff"),
    "failover": ("#a05a00", "#fff4e6"),
    "failed": ("#c92a2a", "#fff5f5"),
    "stopped": ("#495057", "#f1f3f5"),
    "stand_in": ("#a05a00", "#fff4e6"),  # a smaller model answered for the one asked
}


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
