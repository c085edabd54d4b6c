"""The VRAM budget as one stacked bar: the main model's weights, KV cache and compute, a share per other
model loaded on the GPU, reserve, other processes and free, with a legend of sizes and the caps the plan
leads to, and under it a small bar per RPC box that holds some of the layers. Fed with /failsoft/status dicts
and `budget` events."""

from __future__ import annotations

import html

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QPainter, QPainterPath, QPaintEvent, QPen
from PySide6.QtWidgets import QGridLayout, QHBoxLayout, QLabel, QLayout, QSizePolicy, QVBoxLayout, QWidget

from tray_app.contract.sizes import format_size
from tray_app.contract.status import ServiceStatus
from tray_app.view.budget_split import (
    SEGMENTS,
    RemoteBar,
    Segment,
    box_problems,
    caps_text,
    plan_segments,
    remote_bars,
    segment_tip,
    status_segments,
)

LEGEND_COLUMNS = 3


def _legend_cell(color: str, border: str, text: QLabel) -> QHBoxLayout:
    swatch = QLabel()
    swatch.setFixedSize(10, 10)
    swatch.setStyleSheet(f"background: {color}; border: 1px solid {border}; border-radius: 2px;")
    cell = QHBoxLayout()
    cell.setSpacing(5)
    cell.addWidget(swatch)
    cell.addWidget(text)
    cell.addStretch(1)
    return cell


def _clear(layout: QLayout) -> None:
    while (item := layout.takeAt(0)) is not None:
        if (widget := item.widget()) is not None:
            widget.deleteLater()
        elif (inner := item.layout()) is not None:
            _clear(inner)
            inner.deleteLater()


class BarCanvas(QWidget):
    """The painted bar itself."""

    def __init__(self, parent: QWidget | None = None, height: int = 22) -> None:
        super().__init__(parent)
        self.segments: list[Segment] = []
        self.bar_height = height
        self.setMinimumHeight(min(height, 20))
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(320, self.bar_height)

    def set_segments(self, segments: list[Segment]) -> None:
        self.segments = segments
        self.setToolTip("\n".join(segment_tip(s) for s in segments if s.bytes))
        self.update()

    def segment_widths(self, width: float) -> list[float]:
        total = sum(s.bytes for s in self.segments)
        if total <= 0:
            return [0.0 for _ in self.segments]
        # Anything present stays visible (at least 2 px), even a few MiB on a 24 GiB card.
        raw = [max(width * s.bytes / total, 2.0) if s.bytes else 0.0 for s in self.segments]
        scale = width / sum(raw)
        return [w * scale for w in raw]

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        outline = QPainterPath()
        outline.addRoundedRect(rect, 5, 5)
        painter.setClipPath(outline)
        painter.fillRect(rect, QColor("#f1f3f5"))
        x = rect.left()
        for segment, width in zip(self.segments, self.segment_widths(rect.width()), strict=True):
            if width <= 0:
                continue
            block = QRectF(x, rect.top(), width, rect.height())
            painter.fillRect(block, QColor(segment.color))
            if segment.key == "reserve":
                # Hatched: memory kept back on purpose, not used.
                painter.fillRect(block, QBrush(QColor(255, 255, 255, 110), Qt.BrushStyle.BDiagPattern))
            x += width
        painter.setClipping(False)
        painter.setPen(QPen(QColor("#adb5bd"), 1))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawPath(outline)
        painter.end()


class RemoteBars(QWidget):
    """The RPC boxes the GPU worker spans: a label and a small bar per box's share (its usable memory, split
    as the GPU's is), and a line per configured box that holds none; hidden when there are no boxes."""

    BAR_HEIGHT = 12

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("RemoteBars")
        self.rows = QVBoxLayout(self)
        self.rows.setContentsMargins(0, 2, 0, 0)
        self.rows.setSpacing(3)
        self.labels: dict[str, QLabel] = {}
        self.canvases: dict[str, BarCanvas] = {}
        self.problem_labels: list[QLabel] = []
        self._shown: tuple[list[str], int] = ([], 0)
        self.setVisible(False)

    def set_status(self, status: ServiceStatus | None) -> None:
        bars, problems = (remote_bars(status), box_problems(status)) if status else ([], [])
        self._rebuild([bar.key for bar in bars], len(problems))
        for bar in bars:
            self.labels[bar.key].setText(self._label_text(bar))
            self.canvases[bar.key].set_segments(list(bar.segments))
        for label, problem in zip(self.problem_labels, problems, strict=True):
            label.setText(problem)
        self.setVisible(bool(bars or problems))

    @staticmethod
    def _label_text(bar: RemoteBar) -> str:
        return f"{html.escape(bar.label)} · {html.escape(bar.layers)} · <b>{html.escape(bar.usage)}</b>"

    def _rebuild(self, keys: list[str], problems: int) -> None:
        """Only when the boxes in use change, not on every status (the tray menu would flicker)."""
        if (keys, problems) == self._shown:
            return
        self._shown = (keys, problems)
        _clear(self.rows)
        self.labels, self.canvases, self.problem_labels = {}, {}, []
        for key in keys:
            self.labels[key] = self._row_label(f"remote-{key}", "")
            self.canvases[key] = BarCanvas(height=self.BAR_HEIGHT)
            self.rows.addWidget(self.labels[key])
            self.rows.addWidget(self.canvases[key])
        for index in range(problems):
            label = self._row_label(f"remote-problem-{index}", "color: #c92a2a;")
            label.setTextFormat(Qt.TextFormat.PlainText)  # the box's own words, not markup
            self.problem_labels.append(label)
            self.rows.addWidget(label)

    @staticmethod
    def _row_label(name: str, style: str) -> QLabel:
        label = QLabel("")
        label.setObjectName(name)
        label.setWordWrap(True)
        label.setStyleSheet(f"font-size: 11px; {style}")
        return label


class BudgetBar(QWidget):
    """Title with the device, the stacked bar, a legend with sizes, and the caps."""

    def __init__(self, parent: QWidget | None = None, compact: bool = False) -> None:
        super().__init__(parent)
        self.setObjectName("BudgetBar")
        self.compact = compact
        if compact:  # inside the tray menu: a steady width, the planner's long reason as a tooltip
            self.setMinimumWidth(470)
        layout = QVBoxLayout(self)
        margin = 10 if compact else 4
        layout.setContentsMargins(margin + 4, margin, margin + 4, margin)
        layout.setSpacing(6)

        header = QHBoxLayout()
        self.title = QLabel("GPU memory")
        self.title.setStyleSheet("font-weight: 600;")
        self.device = QLabel("")
        self.device.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        header.addWidget(self.title)
        header.addStretch(1)
        header.addWidget(self.device)
        layout.addLayout(header)

        self.canvas = BarCanvas()
        layout.addWidget(self.canvas)

        legend = self._legend_grid()
        self.legend_labels: dict[str, QLabel] = {}
        for index, (key, label, color, _keys) in enumerate(SEGMENTS):
            text = QLabel(f"{label} —")
            text.setObjectName(f"legend-{key}")
            self.legend_labels[key] = text
            border = "#adb5bd" if key == "free" else color
            legend.addLayout(_legend_cell(color, border, text), *divmod(index, LEGEND_COLUMNS))
        layout.addLayout(legend)
        # The other models on the GPU, a row of their own that changes as they load and unload.
        self.model_legend = self._legend_grid()
        self.model_legend_labels: dict[str, QLabel] = {}
        self._model_legend_shown: list[tuple[str, str]] = []
        layout.addLayout(self.model_legend)
        self.remote = RemoteBars()
        layout.addWidget(self.remote)

        self.caps = QLabel("")
        self.caps.setWordWrap(True)
        self.reason = QLabel("")
        self.reason.setWordWrap(True)
        self.reason.setStyleSheet("color: #6c757d;")
        layout.addWidget(self.caps)
        layout.addWidget(self.reason)
        self.segments: list[Segment] = []
        self.set_status(None)

    @staticmethod
    def _legend_grid() -> QGridLayout:
        grid = QGridLayout()
        grid.setHorizontalSpacing(14)
        grid.setVerticalSpacing(3)
        return grid

    def set_status(self, status: ServiceStatus | None) -> None:
        """Show the GPU plan, the other models' shares and the caps of a /failsoft/status (None: none yet)."""
        plan = (status.get("plan") if status else None) or {}
        caps = (status.get("caps") if status else None) or {}
        simulated = bool((status.get("simulated") if status else False) or plan.get("simulated"))
        self.segments = status_segments(status) if status else plan_segments(plan)
        self.canvas.set_segments(self.segments)
        self.remote.set_status(status)
        guests = [segment for segment in self.segments if segment.key not in self.legend_labels]
        self._show_model_legend(guests)
        for segment in self.segments:
            label = self.legend_labels.get(segment.key) or self.model_legend_labels[segment.key]
            name = html.escape(segment.label)
            label.setText(f"{name} <b>{format_size(segment.bytes)}</b>" if plan else f"{name} —")
            label.setToolTip(segment_tip(segment) if segment.detail else "")
        total = int(plan.get("total_bytes") or sum(s.bytes for s in self.segments))
        device = format_size(total) if total else "no plan yet"
        if simulated:
            device += ' <span style="color:#6741d9; font-weight:600;">simulated</span>'
        self.device.setText(device)
        self.caps.setText(caps_text(plan, caps) if plan else "")
        reason = str(plan.get("reason") or "")
        self.reason.setText(reason)
        self.reason.setVisible(bool(reason) and not self.compact)
        self.canvas.setToolTip(reason + "\n\n" + self.canvas.toolTip() if reason else self.canvas.toolTip())

    def _show_model_legend(self, guests: list[Segment]) -> None:
        """Rebuilt only when the models on the GPU change, not on every status."""
        shown = [(guest.key, guest.color) for guest in guests]
        if shown == self._model_legend_shown:
            return
        self._model_legend_shown = shown
        _clear(self.model_legend)
        self.model_legend_labels = {}
        for index, guest in enumerate(guests):
            text = QLabel(html.escape(guest.label))
            text.setObjectName(f"legend-{guest.key}")
            self.model_legend_labels[guest.key] = text
            self.model_legend.addLayout(
                _legend_cell(guest.color, guest.color, text), *divmod(index, LEGEND_COLUMNS)
            )
