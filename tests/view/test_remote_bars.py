"""The RPC boxes beside the VRAM split: a bar per box holding layers, a line per box that holds none."""

from __future__ import annotations

from typing import Any

from tests.support.status_samples import MiB, make_status
from tray_app.budget.remote import RemoteShare
from tray_app.contract.status import ServiceStatus
from tray_app.view.budget_split import SEGMENTS, box_problems, layers_words, remote_bars

NAS_SHARE: dict[str, Any] = {
    "peer": "nas",
    "endpoint": "192.168.1.30:50052",
    "device": "RPC0",
    "total_bytes": 8192 * MiB,
    "free_bytes": 6144 * MiB,
    "usable_bytes": 5632 * MiB,
    "first_layer": 26,
    "n_layers": 5,
    "output": True,
    "weights_bytes": 900 * MiB,
    "kv_bytes": 100 * MiB,
    "compute_bytes": 24 * MiB,
    "used_bytes": 1024 * MiB,
    "buffer_name": "RPC0[192.168.1.30:50052]",
    "which": "blocks 26-29 and the output layer",
}
NAS_BOX = {
    "peer": "nas",
    "endpoint": "192.168.1.30:50052",
    "description": "192.168.1.30:50052",
    "total_bytes": 8192 * MiB,
    "free_bytes": 6144 * MiB,
    "cap_bytes": 0,
    "problem": "",
}
DOWN = "the RPC server at 192.168.1.40:50052 does not answer: connection refused"
ATTIC_BOX = {**NAS_BOX, "peer": "attic", "endpoint": "192.168.1.40:50052", "total_bytes": 0, "problem": DOWN}


def with_rpc(boxes: list[dict[str, Any]], remote: list[dict[str, Any]], on_gpu: int = 26) -> ServiceStatus:
    status = make_status()
    status["plan"] = {**status["plan"], "n_gpu_layers": on_gpu}
    status["rpc"] = {"boxes": boxes, "remote": remote}
    return status


def test_a_share_is_a_bar_of_its_usable_memory_in_the_gpu_bar_colours() -> None:
    [bar] = remote_bars(with_rpc([NAS_BOX, ATTIC_BOX], [NAS_SHARE]))
    assert bar.key == "rpc:RPC0"
    assert bar.label == "RPC0 · nas (192.168.1.30:50052)"
    assert bar.layers == "5 of 31 layers (blocks 26-29 and the output layer)"
    colours = {key: colour for key, _label, colour, _keys in SEGMENTS}
    assert [(s.key, s.label, s.color) for s in bar.segments] == [
        ("weights", "Weights", colours["weights"]),
        ("kv", "KV cache", colours["kv"]),
        ("compute", "Compute", colours["compute"]),
        ("free", "Free", colours["free"]),
    ]
    assert [s.bytes for s in bar.segments] == [900 * MiB, 100 * MiB, 24 * MiB, (5632 - 1024) * MiB]
    assert sum(s.bytes for s in bar.segments) == bar.total_bytes == 5632 * MiB
    assert bar.usage == "1.00 GiB of 5.50 GiB usable"


def test_a_box_that_does_not_answer_is_a_line_that_says_why() -> None:
    status = with_rpc([NAS_BOX, ATTIC_BOX], [NAS_SHARE])
    assert box_problems(status) == [f"attic (192.168.1.40:50052): not used - {DOWN}"]


def test_a_box_that_answers_but_holds_nothing_says_where_the_layers_went() -> None:
    everything_here = with_rpc([NAS_BOX], [], on_gpu=31)
    assert box_problems(everything_here) == ["nas (192.168.1.30:50052): not used - the GPU holds every layer"]
    too_small = with_rpc([NAS_BOX], [], on_gpu=20)
    assert box_problems(too_small) == [
        "nas (192.168.1.30:50052): not used - no layer fits in its usable memory"
    ]
    second = {**NAS_BOX, "peer": "attic", "endpoint": "192.168.1.40:50052"}
    filled = with_rpc([NAS_BOX, second], [NAS_SHARE])
    assert box_problems(filled) == [
        "attic (192.168.1.40:50052): not used - the GPU and the other boxes hold every layer"
    ]


def share_of(first: int, count: int, output: bool) -> dict[str, Any]:
    """A share as the service sends it (budget.remote.RemoteShare.to_dict)."""
    sizes = dict.fromkeys(("total_bytes", "free_bytes", "usable_bytes", "weights_bytes", "kv_bytes"), 0)
    share = RemoteShare(
        "nas",
        "10.0.0.3:50052",
        "RPC0",
        **sizes,
        first_layer=first,
        n_layers=count,
        output=output,
        compute_bytes=0,
    )
    return share.to_dict()


def test_layers_are_named_as_the_plan_places_them() -> None:
    plan = {"n_layers": 31}
    assert layers_words(share_of(7, 1, False), plan) == "1 of 31 layers (block 7)"
    assert layers_words(share_of(30, 1, True), {}) == "1 layer (the output layer)"
    assert layers_words(share_of(3, 4, False), plan) == "4 of 31 layers (blocks 3-6)"
    assert layers_words(share_of(26, 5, True), plan) == "5 of 31 layers (blocks 26-29 and the output layer)"


def test_a_service_without_rpc_boxes_shows_none() -> None:
    status = make_status()
    assert "rpc" not in status
    assert remote_bars(status) == []
    assert box_problems(status) == []
    assert remote_bars(with_rpc([], [])) == [] and box_problems(with_rpc([], [])) == []
