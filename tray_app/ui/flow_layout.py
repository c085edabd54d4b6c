"""A layout that places its widgets in a row and starts a new row when the next one does not fit (Qt's own
flow-layout example, typed): the badges under a chat answer wrap instead of widening the window."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QSize, Qt
from PySide6.QtWidgets import QLayout, QLayoutItem, QWidget

SPACING = 6


class FlowLayout(QLayout):
    def __init__(self, parent: QWidget | None = None, spacing: int = SPACING) -> None:
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self._spacing = spacing
        self.setContentsMargins(0, 0, 0, 0)

    def addItem(self, item: QLayoutItem) -> None:
        self._items.append(item)

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int) -> QLayoutItem | None:
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> QLayoutItem | None:
        return self._items.pop(index) if 0 <= index < len(self._items) else None

    def expandingDirections(self) -> Qt.Orientation:
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        return self._place(QRect(0, 0, width, 0), move=False)

    def setGeometry(self, rect: QRect) -> None:
        super().setGeometry(rect)
        self._place(rect, move=True)

    def sizeHint(self) -> QSize:
        return self.minimumSize()

    def minimumSize(self) -> QSize:
        """The widest item: anything narrower than the row wraps, so that is all the layout needs."""
        size = QSize()
        for item in self._visible():
            size = size.expandedTo(item.minimumSize())
        margins = self.contentsMargins()
        return size + QSize(margins.left() + margins.right(), margins.top() + margins.bottom())

    def _visible(self) -> list[QLayoutItem]:
        return [item for item in self._items if not item.isEmpty()]  # a hidden widget's item is empty

    def _place(self, rect: QRect, *, move: bool) -> int:
        """Lay the items out in `rect` (only measure unless `move`); returns the height they take."""
        area = rect.marginsRemoved(self.contentsMargins())
        x, y, line_height = area.x(), area.y(), 0
        for item in self._visible():
            # Never wider than the row: an item that wraps its own text (a word-wrapped label) grows down.
            width = min(item.sizeHint().width(), area.width())
            height = item.heightForWidth(width) if item.hasHeightForWidth() else item.sizeHint().height()
            if x > area.x() and x + width > area.right() + 1:
                x, y, line_height = area.x(), y + line_height + self._spacing, 0
            if move:
                item.setGeometry(QRect(QPoint(x, y), QSize(width, height)))
            x += width + self._spacing
            line_height = max(line_height, height)
        margins = self.contentsMargins()
        return y + line_height - rect.y() + margins.bottom()
