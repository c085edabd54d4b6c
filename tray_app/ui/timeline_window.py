"""The VRAM timeline: the last 15 minutes of the GPU's memory as stacked bands (the main model's weights,
KV cache and compute, the other models, each other program, free), the reserve line, and markers for
failovers, restarts, loads and the GPU path's changes. Drawn with pyqtgraph from `view.timeline`, fed by
`GET /failsoft/device/history` every few seconds while the window is open.

`python -m tray_app.ui.timeline_window URL` opens it alone against a running service.
"""

from __future__ import annotations

import html
import sys
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import QTimer
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QApplication, QLabel, QVBoxLayout, QWidget

from tray_app.contract.sizes import format_size
from tray_app.ui.api_client import ServiceClient
from tray_app.view.timeline import Timeline, stacked, timeline

GIB = 1024**3
REFRESH_MS = 2_000
MAX_MARKER_LABELS = 12  # the newest ones are labelled; older markers stay lines only


class TimelineWindow(QWidget):
    def __init__(self, client: ServiceClient, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self.setWindowTitle("Failsoft — VRAM timeline")
        self.resize(900, 480)
        pg.setConfigOptions(antialias=True, background="w", foreground="#343a40")
        self.plot = pg.PlotWidget()
        self.plot.setLabel("left", "GiB")
        self.plot.setLabel("bottom", "seconds before now")
        self.plot.showGrid(x=True, y=True, alpha=0.15)
        self.plot.setMouseEnabled(x=True, y=False)
        self.legend = QLabel()  # below the plot: the bands fill the plot up to the device's total
        self.legend.setWordWrap(True)
        self.note = QLabel()
        self.note.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.addWidget(self.plot, 1)
        layout.addWidget(self.legend)
        layout.addWidget(self.note)
        self.plan: dict[str, Any] = {}
        self.shown: Timeline | None = None
        self._timer = QTimer(self)
        self._timer.setInterval(REFRESH_MS)
        self._timer.timeout.connect(self.refresh)

    def showEvent(self, event: Any) -> None:
        super().showEvent(event)
        self.refresh()
        self._timer.start()

    def hideEvent(self, event: Any) -> None:
        self._timer.stop()
        super().hideEvent(event)

    def refresh(self) -> None:
        status = self.client.status()
        status.succeeded.connect(lambda data: self._take_plan(data))
        call = self.client.device_history()
        call.succeeded.connect(
            lambda data: self.draw(timeline(data, self.plan)) if isinstance(data, dict) else None
        )
        call.failed.connect(lambda message: self.note.setText(f"No history: {message}"))

    def _take_plan(self, data: object) -> None:
        if isinstance(data, dict) and isinstance(data.get("plan"), dict):
            self.plan = data["plan"]

    def draw(self, line: Timeline) -> None:
        self.shown = line
        self.plot.clear()
        self.legend.clear()  # the label's text
        if line.empty:
            self.note.setText(line.note)
            return
        self._draw_bands(line)
        if line.reserve_bytes and line.total_bytes:
            self._draw_reserve(line)
        self._draw_markers(line)
        self.plot.setYRange(0, line.total_bytes / GIB, padding=0.02)
        self.plot.setXRange(min(line.times), 0, padding=0.01)
        free = line.series[-1].values[-1] if line.series else 0.0
        self.note.setText(
            f"{len(line.times)} readings · {format_size(int(free))} free of {format_size(line.total_bytes)} "
            f"now · {len(line.markers)} markers (hover a line for what happened)"
        )

    def _draw_bands(self, line: Timeline) -> None:
        """The stacked bands, and their colours named in the legend under the plot."""
        # Each band's top edge filled down to zero, the highest first: the next one paints over its lower
        # part, so what shows of each is the band itself (no curve-to-curve fills to keep in step).
        bands = list(zip(line.series, stacked(line.series), strict=True))
        for band, top in reversed(bands):
            area = pg.PlotDataItem(
                line.times,
                [value / GIB for value in top],
                pen=pg.mkPen(QColor(band.color).darker(115), width=1),
                fillLevel=0.0,
                brush=pg.mkBrush(QColor(band.color)),
            )
            self.plot.addItem(area)
        self.legend.setText(
            " &nbsp; ".join(
                f'<span style="color:{band.color}">■</span> {html.escape(band.label)}' for band, _top in bands
            )
        )

    def _draw_reserve(self, line: Timeline) -> None:
        """A dashed line where the reserve begins, under the device's total."""
        edge = (line.total_bytes - line.reserve_bytes) / GIB
        reserve = pg.InfiniteLine(
            pos=edge,
            angle=0,
            pen=pg.mkPen("#212529", width=1.5, style=pg.QtCore.Qt.PenStyle.DashLine),
            label=f"reserve ({format_size(line.reserve_bytes)})",
            labelOpts={"position": 0.9, "color": "#212529", "fill": (255, 255, 255, 200)},
        )
        self.plot.addItem(reserve)

    def _draw_markers(self, line: Timeline) -> None:
        """A vertical line per marker, what happened as its tooltip; only the newest are labelled, so the
        labels stay readable."""
        labelled = line.markers[-MAX_MARKER_LABELS:]
        for marker in line.markers:
            mark = pg.InfiniteLine(
                pos=marker.at,
                angle=90,
                pen=pg.mkPen(marker.color, width=1.5),
                label=marker.kind if marker in labelled else None,
                labelOpts={
                    "position": 0.93,
                    "color": marker.color,
                    "rotateAxis": (1, 0),
                    "anchors": [(0, 0), (0, 0)],
                },
            )
            mark.setToolTip(marker.text)
            self.plot.addItem(mark)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    app = QApplication.instance() or QApplication([])
    window = TimelineWindow(ServiceClient(args[0] if args else "http://127.0.0.1:8080"))
    window.show()
    return int(app.exec())


if __name__ == "__main__":
    raise SystemExit(main())
