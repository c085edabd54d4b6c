"""The budget bar drawn from a status dict: segments, legend, caps, and the pixels themselves."""

from __future__ import annotations

from typing import Any

from PySide6.QtGui import QColor
from pytestqt.qtbot import QtBot

from tests.support.status_samples import MiB, make_library_status, make_status
from tests.view.test_remote_bars import ATTIC_BOX, DOWN, NAS_BOX, NAS_SHARE, with_rpc
from tray_app.budget.plan import PLAN_PARTS
from tray_app.contract.sizes import format_size
from tray_app.ui.budget_bar import BudgetBar
from tray_app.view.budget_split import MODEL_COLORS, SEGMENTS, plan_segments, status_segments


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


def test_another_model_on_the_gpu_is_its_own_segment_out_of_free() -> None:
    status = make_library_status()
    plan = status["plan"]
    segments = status_segments(status)
    assert [s.key for s in segments] == [
        "weights",
        "kv",
        "compute",
        "model:gemma3-270m",
        "reserve",
        "other",
        "free",
    ]
    assert sum(s.bytes for s in segments) == plan["total_bytes"]
    by_key = {s.key: s for s in segments}
    gemma = by_key["model:gemma3-270m"]
    assert (gemma.label, gemma.bytes) == ("gemma3-270m", 300 * MiB)
    assert gemma.detail == "Weights 200.00 MiB, KV cache 60.00 MiB, Compute 40.00 MiB"
    assert by_key["free"].bytes == plan["free_bytes"] - 300 * MiB
    # The main model keeps its own split; the model that is not loaded has no share.
    assert [by_key[k].bytes for k in ("weights", "kv", "compute")] == [
        plan["weights_bytes"],
        plan["kv_bytes"],
        plan["compute_bytes"],
    ]
    assert not any("phi" in s.key for s in segments)


def test_models_beyond_the_free_part_come_out_of_other_processes() -> None:
    status = make_library_status()
    status["plan"] = dict(status["plan"], free_bytes=100 * MiB)
    status["plan"]["total_bytes"] = sum(status["plan"][key] for key in PLAN_PARTS)
    segments = {s.key: s for s in status_segments(status)}
    assert segments["free"].bytes == 0
    assert segments["other"].bytes == status["plan"]["other_bytes"] - 200 * MiB
    assert sum(s.bytes for s in segments.values()) == status["plan"]["total_bytes"]


def test_bar_legend_and_tooltip_name_the_other_model(qtbot: QtBot) -> None:
    status = make_library_status()
    bar = BudgetBar()
    qtbot.addWidget(bar)
    bar.set_status(status)
    label = bar.model_legend_labels["model:gemma3-270m"]
    assert label.text() == "gemma3-270m <b>300.00 MiB</b>"
    assert (
        label.toolTip()
        == "gemma3-270m: 300.00 MiB (Weights 200.00 MiB, KV cache 60.00 MiB, Compute 40.00 MiB)"
    )
    assert label.toolTip() in bar.canvas.toolTip()
    assert format_size(status["plan"]["free_bytes"] - 300 * MiB) in bar.legend_labels["free"].text()
    # Unloaded: its legend entry goes, and free gets its share back.
    bar.set_status(make_status())
    assert bar.model_legend_labels == {}
    assert bar.model_legend.count() == 0
    assert format_size(status["plan"]["free_bytes"]) in bar.legend_labels["free"].text()


def test_painted_bar_shows_the_other_model_in_its_colour(qtbot: QtBot) -> None:
    bar = BudgetBar()
    qtbot.addWidget(bar)
    bar.resize(600, 200)
    bar.set_status(make_library_status())
    bar.show()
    qtbot.waitExposed(bar)
    canvas = bar.canvas
    image = canvas.grab().toImage()
    widths = canvas.segment_widths(canvas.width() - 1)
    index = [s.key for s in canvas.segments].index("model:gemma3-270m")
    middle = 0.5 + sum(widths[:index]) + widths[index] / 2
    assert widths[index] >= 6
    pixel = image.pixelColor(int(middle), image.height() // 2)
    assert pixel.name() == MODEL_COLORS[0]


def test_an_rpc_box_share_is_a_small_bar_under_the_gpu_bar_and_goes_when_it_does(qtbot: QtBot) -> None:
    bar = BudgetBar()
    qtbot.addWidget(bar)
    bar.set_status(make_status())
    assert bar.remote.isHidden() and bar.remote.labels == {}
    bar.set_status(with_rpc([NAS_BOX, ATTIC_BOX], [NAS_SHARE]))
    assert not bar.remote.isHidden()
    label, canvas = bar.remote.labels["rpc:RPC0"], bar.remote.canvases["rpc:RPC0"]
    assert label.text() == (
        "RPC0 · nas (192.168.1.30:50052) · 5 of 31 layers (blocks 26-29 and the output layer) · "
        "<b>1.00 GiB of 5.50 GiB usable</b>"
    )
    assert [(s.key, s.bytes) for s in canvas.segments] == [
        ("weights", 900 * MiB),
        ("kv", 100 * MiB),
        ("compute", 24 * MiB),
        ("free", (5632 - 1024) * MiB),
    ]
    assert canvas.sizeHint().height() < bar.canvas.sizeHint().height()  # smaller than the GPU's own
    assert [p.text() for p in bar.remote.problem_labels] == [f"attic (192.168.1.40:50052): not used - {DOWN}"]
    # The same boxes again: the rows are kept and their figures follow the status.
    busier = {**NAS_SHARE, "kv_bytes": 600 * MiB}
    bar.set_status(with_rpc([NAS_BOX, ATTIC_BOX], [busier]))
    assert bar.remote.canvases["rpc:RPC0"] is canvas
    assert "1.49 GiB of 5.50 GiB usable" in label.text()
    assert canvas.segments[1].bytes == 600 * MiB
    bar.set_status(make_status())  # an older service, or the boxes gone from the config
    assert bar.remote.isHidden()
    assert bar.remote.labels == {} and bar.remote.problem_labels == []
    assert bar.remote.rows.count() == 0


def test_painted_rpc_bar_shows_the_share_in_the_gpu_bar_colours(qtbot: QtBot) -> None:
    bar = BudgetBar()
    qtbot.addWidget(bar)
    bar.resize(600, 300)
    bar.set_status(with_rpc([NAS_BOX], [NAS_SHARE]))
    bar.show()
    qtbot.waitExposed(bar)
    canvas = bar.remote.canvases["rpc:RPC0"]
    image = canvas.grab().toImage()
    weights, _kv, _compute, free = canvas.segment_widths(canvas.width() - 1)
    colours = {key: colour for key, _label, colour, _keys in SEGMENTS}
    assert weights >= 6
    assert image.pixelColor(int(0.5 + weights / 2), image.height() // 2).name() == colours["weights"]
    right = canvas.width() - 1 - free / 2
    assert image.pixelColor(int(right), image.height() // 2).name() == colours["free"]
