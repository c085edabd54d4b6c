"""`make moe-check`'s comparisons on sample llama-server logs: the plan's bytes per device against the printed
buffers (weights and KV cache exactly, compute within 5 %), the override lines against `--n-cpu-moe`, and a
placement read from the log weighed with the planner's own tokens/s estimate."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging"))

import moe_compare  # noqa: E402
from gpu_check_moe import judge_moe  # noqa: E402
from moe_check import fit_argv  # noqa: E402

from tests.support.tiny_moe import TinyMoe, write_tiny_moe  # noqa: E402
from tray_app.budget import speed  # noqa: E402
from tray_app.budget.experts import ExpertSplit  # noqa: E402
from tray_app.budget.model_info import inspect_model  # noqa: E402

MIB = 1024 * 1024


def override_lines(blocks: range, kinds: tuple[str, ...] = ("gate", "up", "down")) -> str:
    return "".join(
        f"0.00.200.000 D tensor blk.{block}.ffn_{kind}_exps.weight (2 MiB f16) "
        "buffer type overridden to CPU\n"
        for block in blocks
        for kind in kinds
    )


def override_names(blocks: range) -> set[str]:
    return {f"blk.{block}.ffn_{kind}_exps.weight" for block in blocks for kind in ("gate", "up", "down")}


def load_log(
    *, overrides: str, offloaded: str, device_model: str, cpu_model: str, kv: str, compute: str
) -> str:
    return (
        "0.00.177.525 I llama_model_loader: loaded meta data with 24 key-value pairs and 99 tensors\n"
        "0.00.178.207 I load_tensors: loading model tensors, this can take a while... (load_mode = none)\n"
        + overrides
        + "0.00.210.000 I load_tensors: offloading 8 repeating layers to GPU\n"
        + f"0.00.210.001 I load_tensors: offloaded {offloaded} layers to GPU\n"
        + f"0.00.221.496 I load_tensors:      Vulkan0 model buffer size =    {device_model} MiB\n"
        + f"0.00.221.497 I load_tensors:          CPU model buffer size =    {cpu_model} MiB\n"
        + "0.00.735.844 I llama_context: Vulkan_Host  output buffer size =     0.00 MiB\n"
        + f"0.00.736.105 I llama_kv_cache:    Vulkan0 KV buffer size =     {kv} MiB\n"
        + f"0.00.768.190 I sched_reserve:    Vulkan0 compute buffer size =    {compute} MiB\n"
        + "0.00.768.191 I sched_reserve: Vulkan_Host compute buffer size =     2.52 MiB\n"
        + "0.01.182.967 I srv  llama_server: model loaded\n"
    )


# An expert split of the 8-block model: all 9 layers on Vulkan0, the experts of blocks 0-3 in RAM.
PLAN = {
    "n_gpu_layers": 9,
    "n_layers": 9,
    "n_cpu_moe": 4,
    "weights_bytes": round(27.21 * MIB),
    "host_weights_bytes": round(24.13 * MIB),
    "kv_bytes": 8 * MIB,
    "host_kv_bytes": 0,
    "compute_bytes": round(10.92 * MIB),
}
SPLIT = {"offloaded": "9/9", "device_model": "27.21", "cpu_model": "24.13", "kv": "8.00", "compute": "10.50"}


def test_a_load_as_planned_holds() -> None:
    log = load_log(overrides=override_lines(range(4)), **SPLIT)
    compared = moe_compare.compare_plan(PLAN, log, "Vulkan0")
    assert compared["problems"] == []
    assert compared["offloaded"] == [9, 9]
    assert compared["overrides_to_cpu"] == compared["overrides_planned"] == 12
    assert compared["buffers"]["weights"]["printed_mib"] == 27.21
    assert compared["host_compute_mib"] == 2.52  # the pinned host buffer is not the device's


def test_weights_must_be_equal_at_the_printed_precision_and_compute_within_five_percent() -> None:
    off = load_log(
        overrides=override_lines(range(4)), **{**SPLIT, "device_model": "27.23", "compute": "10.35"}
    )
    problems = moe_compare.compare_plan(PLAN, off, "Vulkan0")["problems"]
    assert problems == [
        "weights: planned 27.21 MiB, llama.cpp printed 27.23 MiB (must be equal)",
        "compute: planned 10.92 MiB, llama.cpp printed 10.35 MiB (tolerance 5%)",
    ]


def test_the_override_lines_must_name_exactly_the_planned_experts() -> None:
    log = load_log(overrides=override_lines(range(3)) + override_lines(range(5, 6), ("up",)), **SPLIT)
    problems = moe_compare.compare_plan(PLAN, log, "Vulkan0")["problems"]
    assert len(problems) == 1 and problems[0].startswith(
        "override lines: missing ['blk.3.ffn_down_exps.weight'"
    )
    assert "unexpected ['blk.5.ffn_up_exps.weight']" in problems[0]


def test_only_the_last_load_counts() -> None:
    """--fit loads the model once without memory first and prints the same lines; the real load is last."""
    dry_run = load_log(overrides=override_lines(range(8)), **{**SPLIT, "device_model": "3.21"})
    log = dry_run + load_log(overrides=override_lines(range(4)), **SPLIT)
    assert moe_compare.compare_plan(PLAN, log, "Vulkan0")["problems"] == []


def test_a_load_without_gpu_offload_is_named() -> None:
    log = load_log(overrides=override_lines(range(4)), **SPLIT).replace("offloaded 9/9 layers to GPU", "")
    assert moe_compare.compare_plan(PLAN, log, "Vulkan0")["problems"] == [
        "offloaded layers: planned 9, llama.cpp printed None"
    ]


def test_expected_overrides_follow_n_cpu_moe() -> None:
    assert moe_compare.expected_overrides(8, 0) == set()
    assert moe_compare.expected_overrides(8, 1) == {
        "blk.0.ffn_gate_exps.weight",
        "blk.0.ffn_up_exps.weight",
        "blk.0.ffn_down_exps.weight",
    }
    assert len(moe_compare.expected_overrides(8, 20)) == 24
    assert moe_compare.expected_overrides(8, 1, ("ffn_down_exps",)) == moe_compare.expected_overrides(
        8, 1
    ) | {"blk.1.ffn_down_exps.weight"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    model = write_tiny_moe(tmp_path_factory.mktemp("moe") / "tiny-moe.gguf", TinyMoe())
    import gguf

    return model, {tensor.name: int(tensor.n_bytes) for tensor in gguf.GGUFReader(model).tensors}


@pytest.mark.parametrize(
    ("n_gpu_layers", "n_cpu_moe", "partial"), [(9, 0, ()), (9, 3, ()), (9, 8, ()), (9, 3, ("down",))]
)
def test_the_estimate_over_a_printed_placement_is_the_planners(
    tiny: tuple[Path, dict[str, int]], n_gpu_layers: int, n_cpu_moe: int, partial: tuple[str, ...]
) -> None:
    """The same placement, once as llama.cpp printed it and once as the planner describes it, reads the same
    bytes per token: --fit's placement is ranked on the planner's own scale."""
    model_path, tensors = tiny
    model = inspect_model(model_path, use_cache=False)
    kv_device, kv_host = 3 * MIB, MIB
    log = (
        load_log(
            overrides=override_lines(range(n_cpu_moe))
            + override_lines(range(n_cpu_moe, n_cpu_moe + 1), partial),
            offloaded=f"{n_gpu_layers}/9",
            device_model="1.00",
            cpu_model="1.00",
            kv="3.00",
            compute="1.00",
        )
        + "llama_kv_cache:        CPU KV buffer size =     1.00 MiB\n"
    )
    placed = moe_compare.placement_from_log(log, "Vulkan0")
    assert (placed.kv_device_bytes, placed.kv_host_bytes) == (kv_device, kv_host)
    ours = moe_compare.reads_per_token(placed, tensors, model.active_expert_share, 4)
    split = ExpertSplit(n_cpu_moe, tuple(f"ffn_{kind}_exps" for kind in partial))
    planner = speed.reads_per_token(model, n_gpu_layers, split, kv_device, kv_host, 4)
    assert ours == (planner.gpu_bytes, planner.cpu_bytes)


def test_a_partial_offload_puts_the_output_layer_on_the_device_first() -> None:
    """llama.cpp's `-ngl N` below all layers: the output layer, then the last N - 1 blocks."""
    placed = moe_compare.Placement(5, 9, frozenset(), 0, 0, 0)
    assert placed.first_device_block == 4
    assert placed.on_device("output.weight") and placed.on_device("blk.4.attn_q.weight")
    assert not placed.on_device("blk.3.attn_q.weight") and not placed.on_device("token_embd.weight")
    assert moe_compare.Placement(0, 9, frozenset(), 0, 0, 0).experts_on_cpu(8) == list(range(8))


def test_a_partial_expert_layer_counts_tensor_by_tensor(tiny: tuple[Path, dict[str, int]]) -> None:
    """--fit may leave part of a block's experts on the CPU (its up and gate, say): those bytes only."""
    _model, tensors = tiny
    whole = moe_compare.Placement(9, 9, frozenset(), 0, 0, 0)
    part = moe_compare.Placement(
        9, 9, frozenset({"blk.7.ffn_up_exps.weight", "blk.7.ffn_gate_exps.weight"}), 0, 0, 0
    )
    device, host = moe_compare.reads_per_token(part, tensors, 0.25, 1)
    assert host == round(tensors["blk.7.ffn_up_exps.weight"] * 0.25) * 2
    assert device + host == sum(moe_compare.reads_per_token(whole, tensors, 0.25, 1))
    assert part.experts_on_cpu(8) == [7]
    assert part.words() == "9/9 layers, experts of 0/8 blocks + 2 tensors in RAM"
    three = moe_compare.Placement(
        9, 9, frozenset(override_names(range(2)) | {"blk.2.ffn_down_exps.weight"}), 0, 0, 0
    )
    assert three.words() == "9/9 layers, experts of 2/8 blocks + 1 tensor in RAM"
    assert (
        moe_compare.Placement(5, 9, frozenset(), 0, 0, 0).words()
        == "5/9 layers, experts of 4/8 blocks in RAM"
    )


def test_failsoft_must_be_at_least_as_fast_as_fit() -> None:
    assert moe_compare.judge_speed(6553.0, 6553.0) == []
    assert moe_compare.judge_speed(6553.0, 5195.0) == []
    assert moe_compare.judge_speed(5195.0, 6553.0) == [
        "Failsoft's placement is estimated at 5195.0 tokens/s, --fit's at 6553.0"
    ]
    assert moe_compare.judge_speed(5195.0, None) == ["--fit placed nothing that could be read from its log"]


def test_fit_gets_the_same_command_line_without_a_placement() -> None:
    failsoft = [
        "--model",
        "m.gguf",
        "--ctx-size",
        "2048",
        "--n-gpu-layers",
        "9",
        "--fit",
        "off",
        "--n-cpu-moe",
        "4",
        "--override-tensor",
        r"blk\.4\.ffn_down_exps=CPU",
    ]
    assert fit_argv(failsoft, 23000) == [
        "--model",
        "m.gguf",
        "--ctx-size",
        "2048",
        "--fit",
        "on",
        "--fit-target",
        "23000",
    ]


def test_the_gpu_checks_moe_verdict_names_each_budgets_problems() -> None:
    results = [
        {"budget_mib": 48, "problems": []},
        {
            "budget_mib": 96,
            "problems": ["kv: planned 32.00 MiB, llama.cpp printed 16.00 MiB (must be equal)"],
        },
    ]
    assert judge_moe(results) == [
        "moe 96 MiB: kv: planned 32.00 MiB, llama.cpp printed 16.00 MiB (must be equal)"
    ]
    assert judge_moe([]) == ["moe: no budget was checked"]
