"""The VRAM budget as one stacked bar: weights, KV cache, compute, reserve, other processes and free, with a
legend of sizes and the caps the plan leads to. Fed with /failsoft/status dicts and `budget` events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QPainter, QPainterPath, QPaintEvent, QPen
from PySide6.QtWidgets import QGridLayout, QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from tray_app.budget.sizes import format_size


@dataclass(frozen=True)
class Segment:
    key: str
    label: str
    color: str
    bytes: int


# (key, legend label, colour, plan keys summed into it). The output (logits) buffer lives in host memory, so
# it is not part of the device's split.
SEGMENTS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("weights", "Weights", "#3b5bdb", ("weights_bytes",)),
    ("kv", "KV cache", "#0c8599", ("kv_bytes",)),
    ("compute", "Compute", "#e8590c", ("compute_bytes",)),
    ("reserve", "Reserve", "#868e96", ("reserve_bytes",)),
    ("other", "Other processes", "#c2255c", ("other_bytes",)),
    ("free", "Free", "#dee2e6", ("free_bytes",)),
)


def plan_segments(plan: dict[str, Any]) -> list[Segment]:
    """The bar's segments from a plan dict (sizes in bytes); missing keys count as zero."""
    segments = []
    for key, label, color, plan_keys in SEGMENTS:
        total = sum(int(plan.get(name) or 0) for name in plan_keys)
        segments.append(Segment(key, label, color, max(total, 0)))
    return segments


def caps_text(plan: dict[str, Any], caps: dict[str, Any]) -> str:
    """ "Context 8,192 tokens per request · 1 parallel · 30/30 layers on GPU"."""
    n_ctx = caps.get("n_ctx", plan.get("n_ctx"))
    parallel = caps.get("n_parallel", plan.get("n_parallel")) or 1
    per_seq = caps.get("n_ctx_per_seq") or (n_ctx // parallel if n_ctx else 0)
    parts = []
    if per_seq:
        parts.append(f"Context {per_seq:,} per request")
    else:
        parts.append("No GPU context")
    parts.append(f"{parallel} parallel")
    layers, n_layers = plan.get("n_gpu_layers"), plan.get("n_layers")
    if layers is not None and n_layers:
        parts.append(f"{min(int(layers), int(n_layers))}/{n_layers} layers on GPU")
    return " · ".join(parts)


class BarCanvas(QWidget):
    """The painted bar itself."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.segments: list[Segment] = []
        self.setMinimumHeight(20)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(320, 22)

    def set_segments(self, segments: list[Segment]) -> None:
        self.segments = segments
        self.setToolTip("\n".join(f"{s.label}: {format_size(s.bytes)}" for s in segments if s.bytes))
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

        legend = QGridLayout()
        legend.setHorizontalSpacing(14)
        legend.setVerticalSpacing(3)
        self.legend_labels: dict[str, QLabel] = {}
        for index, (key, label, color, _keys) in enumerate(SEGMENTS):
            swatch = QLabel()
            swatch.setFixedSize(10, 10)
            border = "#adb5bd" if key == "free" else color
            swatch.setStyleSheet(f"background: {color}; border: 1px solid {border}; border-radius: 2px;")
            text = QLabel(f"{label} —")
            text.setObjectName(f"legend-{key}")
            self.legend_labels[key] = text
            cell = QHBoxLayout()
            cell.setSpacing(5)
            cell.addWidget(swatch)
            cell.addWidget(text)
            cell.addStretch(1)
            legend.addLayout(cell, index // 3, index % 3)
        layout.addLayout(legend)

        self.caps = QLabel("")
        self.caps.setWordWrap(True)
        self.reason = QLabel("")
        self.reason.setWordWrap(True)
        self.reason.setStyleSheet("color: #6c757d;")
        layout.addWidget(self.caps)
        layout.addWidget(self.reason)
        self.segments: list[Segment] = []
        self.set_status({})

    def set_status(self, status: dict[str, Any]) -> None:
        """Show the GPU plan and caps of an /failsoft/status dict."""
        plan = status.get("plan") or {}
        caps = status.get("caps") or {}
        self._show(plan, caps, bool(status.get("simulated") or plan.get("simulated")))

    def _show(self, plan: dict[str, Any], caps: dict[str, Any], simulated: bool) -> None:
        self.segments = plan_segments(plan)
        self.canvas.set_segments(self.segments)
        for segment in self.segments:
            self.legend_labels[segment.key].setText(
                f"{segment.label} <b>{format_size(segment.bytes)}</b>" if plan else f"{segment.label} —"
            )
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
