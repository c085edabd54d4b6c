"""FlowLayout: side by side while widgets fit, on the next row when they do not, never wider than a row."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QWidget
from pytestqt.qtbot import QtBot

from tray_app.ui.flow_layout import SPACING, FlowLayout


def _boxes(qtbot: QtBot, widths: list[int]) -> tuple[QWidget, FlowLayout, list[QLabel]]:
    host = QWidget()
    qtbot.addWidget(host)
    layout = FlowLayout(host)
    labels = []
    for width in widths:
        label = QLabel("")
        label.setFixedSize(width, 20)
        layout.addWidget(label)
        labels.append(label)
    return host, layout, labels


def test_items_share_a_row_while_they_fit(qtbot: QtBot) -> None:
    host, _, (a, b, c) = _boxes(qtbot, [100, 100, 100])
    host.resize(100 * 3 + 2 * SPACING, 100)
    host.show()
    assert [w.y() for w in (a, b, c)] == [0, 0, 0]
    assert [w.x() for w in (a, b, c)] == [0, 100 + SPACING, 2 * (100 + SPACING)]


def test_the_item_that_does_not_fit_starts_the_next_row(qtbot: QtBot) -> None:
    host, layout, (a, b, c) = _boxes(qtbot, [100, 100, 100])
    host.resize(250, 100)
    host.show()
    assert (a.pos().toTuple(), b.pos().toTuple()) == ((0, 0), (100 + SPACING, 0))
    assert c.pos().toTuple() == (0, 20 + SPACING)
    assert layout.heightForWidth(250) == 2 * 20 + SPACING
    assert layout.heightForWidth(100) == 3 * 20 + 2 * SPACING


def test_hidden_items_take_no_room(qtbot: QtBot) -> None:
    host, layout, (_, b, c) = _boxes(qtbot, [100, 100, 100])
    b.hide()
    host.resize(250, 100)
    host.show()
    assert c.pos().toTuple() == (100 + SPACING, 0)
    assert layout.heightForWidth(250) == 20


def test_an_item_wider_than_the_row_gets_the_row(qtbot: QtBot) -> None:
    host = QWidget()
    qtbot.addWidget(host)
    layout = FlowLayout(host)
    label = QLabel("several words that need more room than the row has")
    label.setWordWrap(True)
    layout.addWidget(label)
    assert label.sizeHint().width() > 80  # its one-line width: more than the row below has
    host.resize(80, 200)
    host.show()
    assert label.width() == 80
    assert label.height() == label.heightForWidth(80) > label.fontMetrics().height()
