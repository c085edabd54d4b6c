"""Tray and window icons, drawn from the SVGs in resources/icons at every size the desktop asks for."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPixmap
from PySide6.QtSvg import QSvgRenderer

from tray_app.paths import RESOURCES_DIR

ICONS_DIR = RESOURCES_DIR / "icons"
SIZES = (16, 22, 24, 32, 48, 64, 128)


def icon_path(name: str) -> Path:
    path = ICONS_DIR / f"{name}.svg"
    if not path.is_file():
        raise FileNotFoundError(f"icon {name!r} missing: expected {path}")
    return path


def _render(renderer: QSvgRenderer, painter: QPainter, rect: QRectF) -> None:
    renderer.render(painter, rect)


def state_pixmap(level: str, simulated: bool, size: int) -> QPixmap:
    """The state chip; on a simulated device a purple "S" badge sits in the lower right corner."""
    pixmap = QPixmap(size, size)
    pixmap.fill(QColor(0, 0, 0, 0))
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    _render(QSvgRenderer(str(icon_path(f"state-{level}"))), painter, QRectF(0, 0, size, size))
    if simulated:
        badge = size * 0.56
        _render(
            QSvgRenderer(str(icon_path("simulated-badge"))),
            painter,
            QRectF(size - badge, size - badge, badge, badge),
        )
    painter.end()
    return pixmap


@cache
def state_icon(level: str, simulated: bool) -> QIcon:
    icon = QIcon()
    for size in SIZES:
        icon.addPixmap(state_pixmap(level, simulated, size))
    return icon


@cache
def app_icon() -> QIcon:
    return QIcon(str(icon_path("failsoft")))


def swatch_icon(color: str, size: int = 12) -> QIcon:
    pixmap = QPixmap(size, size)
    pixmap.fill(QColor(0, 0, 0, 0))
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(QColor(color))
    painter.drawEllipse(1, 1, size - 2, size - 2)
    painter.end()
    return QIcon(pixmap)
