"""The budget bar drawn from a status dict: segments, legend, caps, and the pixels themselves."""

from __future__ import annotations

from typing import Any

from PySide6.QtGui import QColor
from pytestqt.qtbot import QtBot

from tray_app.budget.sizes import format_size
from tray_app.ui.budget_bar import SEGMENTS, BudgetBar, plan_segments


def test_segments_follow_the_plan_and_add_up_to_the_device(status: dict[str, Any]) -> None:
    segments = plan_segments(status["plan"])
    assert [s.key for s in segments] == ["weights", "kv", "compute", "reserve", "other", "free"]
    assert sum(s.bytes for s in segments) == status["plan"]["total_bytes"]
    # The logits buffer lives in host memory, so it is not drawn as device memory.
    assert segments[2].bytes == status["plan"]["compute_bytes"]


def test_legend_shows_every_size_and_the_caps(qtbot: QtBot, status: dict[str, Any]) -> None:
    bar = BudgetBar()
    qtbot.addWidget(bar)
    bar.set_status(status)
    for key, plan_key in [("weights", "weights_bytes"), ("kv", "kv_bytes"), ("free", "free_bytes")]:
        assert format_size(status["plan"][plan_key]) in bar.legend_labels[key].text()
    assert "simulated" in bar.device.text()
    assert "4.00 GiB" in bar.device.text()
    assert "Context 4,096 per request" in bar.caps.text()
    assert "2 parallel" in bar.caps.text()
    assert "31/31 layers on GPU" in bar.caps.text()


def test_painted_bar_has_each_colour_where_its_share_is(qtbot: QtBot, status: dict[str, Any]) -> None:
    bar = BudgetBar()
    qtbot.addWidget(bar)
    bar.resize(600, 200)
    bar.set_status(status)
    bar.show()
    qtbot.waitExposed(bar)
    canvas = bar.canvas
    image = canvas.grab().toImage()
    widths = canvas.segment_widths(canvas.width() - 1)
    colours = {key: QColor(colour) for key, _label, colour, _keys in SEGMENTS}
    left = 0.5
    for segment, width in zip(canvas.segments, widths, strict=True):
        if width >= 6:  # sample the middle of every segment wide enough to sample
            pixel = image.pixelColor(int(left + width / 2), image.height() // 2)
            expected = colours[segment.key]
            if segment.key == "reserve":  # hatched grey: grey whether on a hatch line or between them
                assert (
                    max(pixel.red(), pixel.green(), pixel.blue())
                    - min(pixel.red(), pixel.green(), pixel.blue())
                    < 24
                )
                assert pixel.red() >= expected.red() - 2
            else:
                assert (pixel.red(), pixel.green(), pixel.blue()) == (
                    expected.red(),
                    expected.green(),
                    expected.blue(),
                )
        left += width


def test_a_new_status_replaces_the_old_split(qtbot: QtBot, status: dict[str, Any]) -> None:
    bar = BudgetBar()
    qtbot.addWidget(bar)
    bar.set_status(status)
    changed = dict(status["plan"], kv_bytes=status["plan"]["kv_bytes"] * 2)
    bar.set_status({**status, "plan": changed})
    assert format_size(changed["kv_bytes"]) in bar.legend_labels["kv"].text()


def test_no_plan_yet_shows_placeholders(qtbot: QtBot) -> None:
    bar = BudgetBar()
    qtbot.addWidget(bar)
    bar.set_status({})
    assert bar.device.text() == "no plan yet"
    assert bar.legend_labels["weights"].text() == "Weights —"
