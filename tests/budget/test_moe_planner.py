"""Mixture-of-Experts planning on a real (tiny, random) MoE GGUF's tensor table: the expert tensors read from
the file, the dense-first expert split at several budgets, the speed estimate that weighs it against a layer
split, the RAM both workers take, and the llama-server command line it leads to."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.tiny_moe import TinyMoe, write_tiny_moe
from tray_app.budget import model_info, speed
from tray_app.budget.device import DeviceMemory
from tray_app.budget.experts import NO_SPLIT, ExpertSplit, partial_splits
from tray_app.budget.footprint import (
    estimate_compute_bytes,
    gpu_weights_bytes,
    host_weights_bytes,
    kv_cache_bytes,
)
from tray_app.budget.model_info import ModelInfo, inspect_model
from tray_app.budget.plan import ComputeSettings, Plan, PlanRequest
from tray_app.budget.planner import plan_cpu, plan_gpu
from tray_app.budget.ram_check import both_workers
from tray_app.engine.argv import expert_split_args, llama_server_argv
from tray_app.engine.profile import WorkerProfile

from .conftest import GIB, MIB, gpu

SHAPE = TinyMoe()
N_CTX = 1024
# One slot, no reserve: the budgets below are the model's own sizes, nothing else.
REQUEST = PlanRequest(n_ctx=N_CTX, n_parallel=1, reserve_percent=0.0, reserve_min_bytes=0, flash_attn=True)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_moe(tmp_path_factory.mktemp("moe") / "tiny-moe.gguf")


@pytest.fixture(scope="module")
def tiny(tiny_path: Path) -> ModelInfo:
    return inspect_model(tiny_path, use_cache=False)


def _dense_need(model: ModelInfo, request: PlanRequest = REQUEST) -> int:
    """Every layer's dense tensors, the output layer, the whole KV cache and compute: an expert split's floor
    (experts in RAM add nothing to the GPU's compute buffer, as llama.cpp's Vulkan build printed)."""
    settings = ComputeSettings(N_CTX, 1, "f16", "f16", True, request.n_ubatch)
    dense = sum(model.layer_bytes) - sum(model.expert_layer_bytes) + model.output_layer_bytes
    kv = kv_cache_bytes(model, N_CTX, request)
    return dense + kv + estimate_compute_bytes(model, settings)


def test_the_expert_tensors_are_read_from_the_file(tiny: ModelInfo, tiny_path: Path) -> None:
    assert (tiny.architecture, tiny.n_layers, tiny.n_expert, tiny.n_expert_used) == ("qwen3moe", 8, 8, 2)
    assert tiny.is_moe and tiny.active_expert_share == 0.25
    assert tiny.expert_layer_bytes == (SHAPE.expert_layer_bytes,) * SHAPE.n_layers
    assert tiny.expert_tensor_max_bytes == SHAPE.expert_tensor_bytes
    stems = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
    assert {tuple(sorted(block)) for block in tiny.expert_tensors} == {
        tuple(sorted((stem, SHAPE.expert_tensor_bytes) for stem in stems))
    }
    assert all(size - SHAPE.expert_layer_bytes == SHAPE.dense_layer_bytes for size in tiny.layer_bytes)
    assert tiny.file_bytes < 4 * MIB  # small enough to write in every test run
    # The copy cached in the data dir keeps the expert table.
    assert inspect_model(tiny_path) == tiny
    model_info._memo.clear()
    assert inspect_model(tiny_path) == tiny
    assert tiny.to_dict()["expert_layer_bytes"] == list(tiny.expert_layer_bytes)
    assert len(tiny.to_dict()["expert_tensors"]) == SHAPE.n_layers


def test_a_dense_model_has_no_experts(model_path: Path) -> None:
    smollm2 = inspect_model(model_path)
    assert not smollm2.is_moe and smollm2.expert_layer_bytes == () and smollm2.active_expert_share == 1.0


def test_shared_experts_and_the_router_are_dense() -> None:
    """Only what llama.cpp's --n-cpu-moe pattern names is an expert (LLM_FFN_EXPS_REGEX)."""
    sizes = {
        "blk.0.ffn_gate_exps.weight": 1,
        "blk.0.ffn_up_exps.weight": 2,
        "blk.0.ffn_down_exps.weight": 4,
        "blk.0.ffn_down_exps.bias": 8,  # gpt-oss has expert biases: matched as well
        "blk.1.ffn_gate_up_exps.weight": 16,
        "blk.1.ffn_up_chexps.weight": 32,
        "blk.0.ffn_up_shexp.weight": 100,
        "blk.0.ffn_gate_inp.weight": 200,
        "blk.0.ffn_gate_inp_shexp.weight": 400,
        "blk.1.exp_probs_b.bias": 800,
        "output.weight": 1000,
    }
    tensors = [SimpleNamespace(name=name, n_bytes=size) for name, size in sizes.items()]
    table = model_info._tensor_bytes(tensors, n_layers=2)
    assert table.expert_bytes == [1 + 2 + 4 + 8, 16 + 32]
    assert table.layer_bytes == [1 + 2 + 4 + 8 + 100 + 200 + 400, 16 + 32 + 800]
    assert table.expert_tensor_max == 32 and table.others == {"output.weight": 1000}
    # Placed one by one under the name an override matches: a weight and its bias together.
    assert table.expert_groups == [
        {"ffn_gate_exps": 1, "ffn_up_exps": 2, "ffn_down_exps": 4 + 8},
        {"ffn_gate_up_exps": 16, "ffn_up_chexps": 32},
    ]


@pytest.mark.parametrize("experts_on_gpu", [0, 3, 7])
def test_dense_first_keeps_the_experts_of_as_many_last_blocks_as_fit(
    tiny: ModelInfo, experts_on_gpu: int
) -> None:
    """Whole blocks' experts first; the room of one and a half tensors left over takes one more tensor."""
    tensor = SHAPE.expert_tensor_bytes
    budget = _dense_need(tiny) + experts_on_gpu * SHAPE.expert_layer_bytes + tensor * 3 // 2
    plan = plan_gpu(gpu(budget), tiny, REQUEST)
    n_cpu_moe = SHAPE.n_layers - experts_on_gpu - 1
    assert (plan.verdict, plan.n_gpu_layers, plan.n_cpu_moe, plan.n_ctx) == ("split", 9, n_cpu_moe, N_CTX)
    assert len(plan.cpu_expert_tensors) == 2  # of block n_cpu_moe's three: one came back to the GPU
    assert plan.fits and plan.used_bytes <= budget
    in_ram = n_cpu_moe * SHAPE.expert_layer_bytes + 2 * tensor
    assert plan.cpu_expert_bytes == in_ram
    split = plan.expert_split
    assert plan.weights_bytes == gpu_weights_bytes(tiny, 9) - in_ram == gpu_weights_bytes(tiny, 9, split)
    assert plan.host_weights_bytes == host_weights_bytes(tiny, 9) + in_ram
    assert plan.host_kv_bytes == 0 and not plan.whole_on_gpu
    kinds = " and ".join(stem.split("_")[1] for stem in plan.cpu_expert_tensors)
    assert (
        f"experts of {n_cpu_moe}/8 layers and block {n_cpu_moe}'s {kinds} experts on the CPU" in plan.reason
    )
    assert f"--n-cpu-moe {n_cpu_moe} --override-tensor" in plan.reason or n_cpu_moe == 0
    # One tensor fewer in RAM would not fit: the split keeps the fewest expert bytes there.
    assert budget - plan.used_bytes < tensor
    kinds = [(candidate.kind, candidate.chosen) for candidate in plan.candidates]
    assert kinds == [("layers", False), ("experts", True)]
    layers, experts = plan.candidates
    assert experts.tokens_per_second > layers.tokens_per_second and "expert split is chosen" in plan.reason


def test_a_budget_of_whole_blocks_needs_no_single_tensors(tiny: ModelInfo) -> None:
    budget = _dense_need(tiny) + 3 * SHAPE.expert_layer_bytes + SHAPE.expert_tensor_bytes // 2
    plan = plan_gpu(gpu(budget), tiny, REQUEST)
    assert (plan.n_cpu_moe, plan.cpu_expert_tensors) == (5, ())
    assert "--override-tensor" not in plan.reason and "(--n-cpu-moe 5)" in plan.reason


def test_single_tensors_come_back_to_the_gpu_fewest_bytes_in_ram_first(tiny: ModelInfo) -> None:
    """Of a block's expert tensors of unequal sizes (quantised differently, as gpt-oss's are), the subsets
    kept in RAM are tried smallest first, so the GPU keeps the most it can."""
    sizes = (("ffn_gate_exps", 300), ("ffn_up_exps", 200), ("ffn_down_exps", 500))
    model = replace(tiny, expert_tensors=(sizes,) * SHAPE.n_layers)
    tried = [(split.blocks, split.partial) for split in partial_splits(model, 3)]
    assert tried == [
        (2, ("ffn_up_exps",)),
        (2, ("ffn_gate_exps",)),
        (2, ("ffn_down_exps",)),
        (2, ("ffn_gate_exps", "ffn_up_exps")),
        (2, ("ffn_up_exps", "ffn_down_exps")),
        (2, ("ffn_gate_exps", "ffn_down_exps")),
    ]
    assert partial_splits(model, 0) == []


def test_the_whole_model_fits_with_no_split(tiny: ModelInfo) -> None:
    plan = plan_gpu(gpu(_dense_need(tiny) + SHAPE.n_layers * SHAPE.expert_layer_bytes), tiny, REQUEST)
    assert (plan.verdict, plan.n_cpu_moe, plan.candidates) == ("gpu", 0, ())
    assert plan.whole_on_gpu and plan.cpu_read_bytes == 0


def test_no_expert_split_when_the_dense_part_does_not_fit(tiny: ModelInfo) -> None:
    plan = plan_gpu(gpu(_dense_need(tiny) - 64 * 1024), tiny, REQUEST)
    assert plan.n_cpu_moe == 0 and plan.verdict in ("split", "cpu")
    assert [candidate.kind for candidate in plan.candidates] == ["layers"]
    assert "no expert split" in plan.reason


def test_the_layer_split_wins_when_it_frees_more_for_less_traffic(tiny: ModelInfo) -> None:
    """At a long context over many slots, one block's KV cache (4 MiB) outweighs all blocks' experts: moving
    one whole block to the CPU frees more than moving every block's experts would, for less traffic per token
    (a token reads its sequence's share of that cache, not all of it)."""
    request = replace(REQUEST, n_ctx=32768, max_ctx=32768, n_parallel=8)
    whole = plan_gpu(gpu(64 * GIB), tiny, request)
    budget = whole.used_bytes - 7 * SHAPE.expert_layer_bytes - SHAPE.expert_layer_bytes // 2
    plan = plan_gpu(gpu(budget), tiny, request)
    layers, experts = plan.candidates
    assert layers.fits and experts.fits and layers.chosen
    assert (experts.n_cpu_moe, len(experts.cpu_expert_tensors)) == (7, 2)
    assert layers.speed_ctx == experts.speed_ctx == plan.n_ctx
    assert (plan.n_cpu_moe, plan.n_gpu_layers) == (0, layers.n_gpu_layers)
    assert layers.tokens_per_second > experts.tokens_per_second
    assert "the layer split is chosen" in plan.reason


def test_bytes_read_per_token_count_only_the_active_experts(tiny: ModelInfo) -> None:
    share = SHAPE.expert_layer_bytes // 4  # 2 of 8 experts
    dense = SHAPE.n_layers * SHAPE.dense_layer_bytes
    on_gpu = speed.reads_per_token(tiny, 9, NO_SPLIT, kv_gpu_bytes=0, kv_cpu_bytes=0, n_parallel=1)
    assert on_gpu == speed.Reads(dense + SHAPE.n_layers * share + tiny.output_layer_bytes, 0)
    split = speed.reads_per_token(tiny, 9, ExpertSplit(5), kv_gpu_bytes=0, kv_cpu_bytes=0, n_parallel=1)
    assert split == speed.Reads(on_gpu.gpu_bytes - 5 * share, 5 * share)
    one_more = ExpertSplit(5, ("ffn_down_exps",))
    finer = speed.reads_per_token(tiny, 9, one_more, kv_gpu_bytes=0, kv_cpu_bytes=0, n_parallel=1)
    assert finer.cpu_bytes == split.cpu_bytes + SHAPE.expert_tensor_bytes // 4
    assert finer.gpu_bytes + finer.cpu_bytes == on_gpu.gpu_bytes
    # A sequence's cache is read half full on average; four slots share the cache given.
    with_cache = speed.reads_per_token(tiny, 9, NO_SPLIT, kv_gpu_bytes=8000, kv_cpu_bytes=0, n_parallel=4)
    assert with_cache.gpu_bytes == on_gpu.gpu_bytes + 1000
    assert speed.active_weights_bytes(tiny) == on_gpu.gpu_bytes
    assert on_gpu.tokens_per_second(1e9, 1e9) == pytest.approx(1e9 / on_gpu.gpu_bytes)


def test_the_cpu_workers_speed_follows_the_active_parameters(tiny: ModelInfo) -> None:
    ram = DeviceMemory("system RAM", "ram", 64 * GIB, 64 * GIB, 0, simulated=False)
    moe = plan_cpu(ram, tiny, REQUEST)
    dense_twin = replace(tiny, n_expert=0, n_expert_used=0)
    dense = plan_cpu(ram, dense_twin, REQUEST)
    assert moe.cpu_read_bytes < dense.cpu_read_bytes and moe.tokens_per_second > 2 * dense.tokens_per_second
    assert "2 of 8 experts" in moe.reason and "experts" not in dense.reason
    slow_ram = plan_cpu(ram, tiny, replace(REQUEST, cpu_bandwidth=speed.CPU_BANDWIDTH / 2))
    assert slow_ram.tokens_per_second == pytest.approx(moe.tokens_per_second / 2, rel=1e-6)


def _ram_plans(tiny: ModelInfo) -> tuple[Plan, Plan]:
    split = plan_gpu(gpu(_dense_need(tiny) + SHAPE.expert_layer_bytes), tiny, REQUEST)
    ram = DeviceMemory("system RAM", "ram", 8 * GIB, 6 * GIB, 2 * GIB, simulated=False)
    return split, plan_cpu(ram, tiny, replace(REQUEST, reserve_min_bytes=GIB))


def test_both_workers_ram_shares_the_mapped_model_file(tiny: ModelInfo) -> None:
    split, cpu = _ram_plans(tiny)
    assert split.n_cpu_moe == 7
    shared = both_workers(split, cpu, weights_shared=True)
    assert shared.gpu_worker_bytes == split.host_kv_bytes + split.output_bytes
    assert shared.cpu_worker_bytes == cpu.used_bytes and shared.usable_bytes == 5 * GIB and shared.fits
    own = both_workers(split, cpu, weights_shared=False)
    assert own.gpu_worker_bytes == shared.gpu_worker_bytes + split.host_weights_bytes
    assert "counted once" in shared.words() and "fits" in own.words()
    tight = both_workers(split, replace(cpu, other_bytes=7 * GIB), weights_shared=True)
    assert not tight.fits and "DOES NOT FIT" in tight.words()


def test_the_command_line_keeps_the_planned_experts_in_ram(tiny: ModelInfo, tiny_path: Path) -> None:
    plan = plan_gpu(
        gpu(_dense_need(tiny) + 2 * SHAPE.expert_layer_bytes + SHAPE.expert_tensor_bytes), tiny, REQUEST
    )
    profile = WorkerProfile(
        role="gpu",
        model_path=tiny_path,
        n_ctx=plan.n_ctx,
        n_gpu_layers=plan.n_gpu_layers,
        n_threads=1,
        n_parallel=plan.n_parallel,
        flash_attn=plan.flash_attn,
        model_name="tiny-moe",
        n_cpu_moe=plan.n_cpu_moe,
        cpu_expert_tensors=plan.cpu_expert_tensors,
    )
    argv = llama_server_argv(Path("llama-server"), profile, port=1234)

    def value(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert (value("--n-gpu-layers"), value("--n-cpu-moe"), value("--fit")) == ("9", "5", "off")
    kept = plan.cpu_expert_tensors
    assert len(kept) == 2 and value("--override-tensor") == ",".join(rf"blk\.5\.{stem}=CPU" for stem in kept)
    assert value("--ctx-size") == str(N_CTX)
    plain = WorkerProfile(role="gpu", model_path=tiny_path, n_ctx=N_CTX, n_gpu_layers=9, n_threads=1)
    assert "--n-cpu-moe" not in llama_server_argv(Path("llama-server"), plain, port=1234)
    assert expert_split_args(0) == [] and expert_split_args(3) == ["--n-cpu-moe", "3"]
    assert expert_split_args(0, ("ffn_up_exps",)) == ["--override-tensor", r"blk\.0\.ffn_up_exps=CPU"]


def test_with_no_context_asked_the_expert_split_takes_the_largest_that_fits(tiny: ModelInfo) -> None:
    request = replace(REQUEST, n_ctx=None, min_ctx=N_CTX, max_ctx=4096)
    budget = _dense_need(tiny) + 2 * SHAPE.expert_layer_bytes
    plan = plan_gpu(gpu(budget), tiny, request)
    assert plan.n_cpu_moe > 0 and plan.fits and N_CTX <= plan.n_ctx <= 4096
    assert plan.used_bytes <= budget
    # The split was set at the floor; a context one step longer would not fit beside it.
    longer = plan_gpu(gpu(budget), tiny, replace(request, n_ctx=plan.n_ctx + 256))
    assert plan.n_ctx == 4096 or longer.n_cpu_moe > plan.n_cpu_moe or longer.n_gpu_layers < 9
