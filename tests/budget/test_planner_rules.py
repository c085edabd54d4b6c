"""Pure planner rules: KV formula, padding, reserve, the gpu/split/cpu verdicts and the caps."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tray_app.budget.footprint import (
    CTX_PAD,
    estimate_compute_bytes,
    gpu_weights_bytes,
    host_weights_bytes,
    kv_cache_bytes,
    padded_context,
    reserve_bytes,
)
from tray_app.budget.model_info import ModelInfo
from tray_app.budget.plan import PLAN_PARTS, ComputeSettings, PlanError, PlanRequest
from tray_app.budget.planner import plan_cpu, plan_gpu

from .conftest import GIB, MIB, gpu

SMOLLM2_LIKE = ModelInfo(
    path="smollm2.gguf",
    architecture="llama",
    n_layers=30,
    n_embd=576,
    n_head=9,
    n_head_kv=(3,) * 30,
    head_dim_k=64,
    head_dim_v=64,
    n_ctx_train=8192,
    n_vocab=49152,
    n_ff=1536,
    file_bytes=98362432,
    layer_bytes=(2216448,) * 30,
    non_layer_bytes=30083328,
    input_bytes=30081024,
    output_layer_bytes=30083328,
    tied_embeddings=True,
)


def _sum_of_parts(plan: object) -> int:
    return sum(getattr(plan, key) for key in PLAN_PARTS)


@pytest.mark.parametrize(
    ("cache_k", "cache_v", "flash", "n_ctx", "expected"),
    [
        # 30 layers x 3 KV heads x 64 dims: 2048 tokens of f16 K and V are exactly llama.cpp's 45.00 MiB.
        ("f16", "f16", False, 2048, 45 * MIB),
        ("f16", "f16", True, 4096, 90 * MIB),
        # q8_0 packs 32 values in 34 bytes, q4_0 in 18.
        ("q8_0", "q8_0", True, 2048, 2048 * 30 * 2 * (192 // 32) * 34),
        ("q4_0", "q4_0", True, 2048, 2048 * 30 * 2 * (192 // 32) * 18),
        ("q8_0", "f16", False, 1024, 1024 * 30 * ((192 // 32) * 34 + 192 * 2)),
    ],
)
def test_kv_cache_formula(cache_k: str, cache_v: str, flash: bool, n_ctx: int, expected: int) -> None:
    request = PlanRequest(cache_type_k=cache_k, cache_type_v=cache_v, flash_attn=flash)  # type: ignore[arg-type]
    assert kv_cache_bytes(SMOLLM2_LIKE, n_ctx, request) == expected


def test_kv_cache_skips_layers_without_attention_and_pads_v_without_flash_attention() -> None:
    mixed = replace(SMOLLM2_LIKE, n_layers=3, n_head_kv=(0, 2, 4), layer_bytes=(1, 1, 1))
    flash = PlanRequest(flash_attn=True)
    # layer 0 has no cache; layer 1 stores 2 heads, layer 2 four (K and V both f16)
    assert kv_cache_bytes(mixed, 256, flash) == 256 * (2 * 64 * 2 * 2 + 4 * 64 * 2 * 2)
    # without flash attention llama.cpp pads every V row to the widest layer
    assert kv_cache_bytes(mixed, 256, PlanRequest()) == 256 * (2 * 64 * 2 + 4 * 64 * 2 + 2 * 4 * 64 * 2)


@pytest.mark.parametrize(
    ("n_ctx", "n_parallel", "expected"),
    [
        (2048, 1, (2048, 2048)),
        (2000, 1, (2048, 2048)),
        (1000, 3, (1536, 512)),
        (2048, 2, (2048, 1024)),
        (1, 1, (256, 256)),
    ],
)
def test_context_is_padded_like_llama_cpp(n_ctx: int, n_parallel: int, expected: tuple[int, int]) -> None:
    assert padded_context(n_ctx, n_parallel) == expected


@pytest.mark.parametrize(
    ("total", "percent", "floor", "expected"),
    [(24 * GIB, 10, 256 * MIB, int(2.4 * GIB)), (1 * GIB, 10, 256 * MIB, 256 * MIB), (8 * GIB, 0, 0, 0)],
)
def test_reserve_is_the_larger_of_percent_and_floor(
    total: int, percent: float, floor: int, expected: int
) -> None:
    assert reserve_bytes(total, percent, floor) == expected


def test_gpu_weights_count_the_output_layer_then_the_last_blocks(model_8b: ModelInfo) -> None:
    # llama.cpp: i_gpu_start = n_layer + 1 - n_gpu_layers, the output layer being layer n_layer
    assert gpu_weights_bytes(model_8b, 0) == 0
    assert gpu_weights_bytes(model_8b, 1) == 260 * MIB
    assert gpu_weights_bytes(model_8b, 5) == 4 * 200 * MIB + 260 * MIB
    assert gpu_weights_bytes(model_8b, 32) == 31 * 200 * MIB + 260 * MIB
    assert gpu_weights_bytes(model_8b, 33) == 32 * 200 * MIB + 260 * MIB


def test_host_keeps_the_input_layer_and_a_tied_embedding(model_8b: ModelInfo) -> None:
    assert host_weights_bytes(model_8b, 33) == 260 * MIB  # the token embedding; the output matrix moved
    assert host_weights_bytes(model_8b, 32) == 200 * MIB + 260 * MIB  # block 0 stays
    assert host_weights_bytes(model_8b, 1) == 32 * 200 * MIB + 260 * MIB
    assert host_weights_bytes(model_8b, 0) == model_8b.weights_bytes
    # SmolLM2 ties its output to the embedding: llama.cpp copies it to the GPU and keeps the original
    assert host_weights_bytes(SMOLLM2_LIKE, 31) == SMOLLM2_LIKE.input_bytes
    assert gpu_weights_bytes(SMOLLM2_LIKE, 31) == SMOLLM2_LIKE.weights_bytes


def test_large_gpu_keeps_everything_and_caps_context_at_max_ctx(model_8b: ModelInfo) -> None:
    plan = plan_gpu(gpu(24 * GIB), model_8b, PlanRequest())
    assert (plan.verdict, plan.n_gpu_layers, plan.n_layers, plan.n_ctx) == ("gpu", 33, 33, 8192)
    assert plan.fits and plan.simulated
    assert plan.reserve_bytes == int(2.4 * GIB)
    assert "all 33 layers" in plan.reason and "max_ctx 8192" in plan.reason
    assert plan.kv_bytes == kv_cache_bytes(model_8b, 8192, PlanRequest())
    assert _sum_of_parts(plan) == plan.total_bytes


def test_tighter_gpu_keeps_all_layers_with_the_largest_context_that_fits(model_8b: ModelInfo) -> None:
    device = gpu(8 * GIB)
    plan = plan_gpu(device, model_8b, PlanRequest())
    assert plan.verdict == "gpu" and plan.fits
    assert 2048 <= plan.n_ctx < 8192 and plan.n_ctx % CTX_PAD == 0
    assert "limited by memory" in plan.reason
    # one step more context would break the reserve
    bigger = plan_gpu(device, model_8b, PlanRequest(n_ctx=plan.n_ctx + CTX_PAD))
    assert bigger.verdict == "split"
    assert plan.free_bytes < bigger.weights_bytes + bigger.kv_bytes + bigger.compute_bytes
    assert _sum_of_parts(plan) == plan.total_bytes


def test_small_gpu_gets_a_split_with_the_most_layers_that_fit(model_8b: ModelInfo) -> None:
    device = gpu(7 * GIB)
    plan = plan_gpu(device, model_8b, PlanRequest())
    assert plan.verdict == "split" and plan.fits
    assert 0 < plan.n_gpu_layers < plan.n_layers
    assert f"{plan.n_gpu_layers} of 33 layers fit" in plan.reason
    # one more layer would not fit at that context
    more = plan.n_gpu_layers + 1
    kv_more = kv_cache_bytes(model_8b, plan.n_ctx, PlanRequest(), range(32 - more, 32))
    assert gpu_weights_bytes(model_8b, more) + kv_more + plan.compute_bytes > 7 * GIB - plan.reserve_bytes
    # what is not on the GPU is accounted to system RAM
    assert plan.host_weights_bytes + plan.weights_bytes == model_8b.weights_bytes
    assert plan.host_kv_bytes + plan.kv_bytes == kv_cache_bytes(model_8b, plan.n_ctx, PlanRequest())
    assert plan.weights_bytes + plan.kv_bytes + plan.compute_bytes <= 7 * GIB - plan.reserve_bytes
    assert _sum_of_parts(plan) == plan.total_bytes


def test_requested_context_too_big_for_all_layers_splits(model_8b: ModelInfo) -> None:
    plan = plan_gpu(gpu(8 * GIB), model_8b, PlanRequest(n_ctx=16384))
    assert plan.verdict == "split" and plan.n_ctx == 16384
    assert "more than" in plan.reason
    usage = plan.weights_bytes + plan.kv_bytes + plan.compute_bytes
    assert usage <= plan.total_bytes - plan.reserve_bytes
    per_layer = 200 * MIB + kv_cache_bytes(model_8b, 16384, PlanRequest(), range(1))
    assert usage + per_layer > plan.total_bytes - plan.reserve_bytes


def test_tiny_gpu_runs_on_the_cpu(model_8b: ModelInfo) -> None:
    plan = plan_gpu(gpu(512 * MIB), model_8b, PlanRequest())
    assert (plan.verdict, plan.n_gpu_layers, plan.weights_bytes, plan.kv_bytes) == ("cpu", 0, 0, 0)
    assert "not even one layer fits" in plan.reason
    assert plan.host_weights_bytes == model_8b.weights_bytes
    assert _sum_of_parts(plan) == plan.total_bytes


def test_other_processes_shrink_the_budget(model_8b: ModelInfo) -> None:
    alone = plan_gpu(gpu(8 * GIB), model_8b, PlanRequest())
    crowded = plan_gpu(gpu(8 * GIB, others=1 * GIB), model_8b, PlanRequest())
    assert crowded.other_bytes == 1 * GIB
    assert (alone.verdict, crowded.verdict) == ("gpu", "split")
    assert "1.00 GiB used by others" in crowded.reason
    assert _sum_of_parts(crowded) == crowded.total_bytes


def test_no_gpu_plans_nothing_on_a_gpu_and_says_how_to_simulate(model_8b: ModelInfo) -> None:
    absent = replace(
        gpu(0, simulated=False), kind="none", name="no GPU", reason="no NVIDIA GPU: driver not found"
    )
    plan = plan_gpu(absent, model_8b, PlanRequest())
    assert (plan.verdict, plan.n_gpu_layers, plan.total_bytes, plan.simulated) == ("cpu", 0, 0, False)
    assert "no NVIDIA GPU: driver not found" in plan.reason and "--simulate-vram" in plan.reason


def test_concurrency_is_reduced_until_each_sequence_keeps_a_padded_share() -> None:
    plan = plan_gpu(gpu(4 * GIB), SMOLLM2_LIKE, PlanRequest(max_ctx=512, n_parallel=4))
    assert (plan.verdict, plan.n_parallel, plan.n_ctx, plan.n_ctx_per_seq) == ("gpu", 2, 512, 256)
    assert "only 2 of 4 sequences fit" in plan.reason


def test_context_is_capped_by_the_trained_context_per_sequence() -> None:
    plan = plan_gpu(gpu(16 * GIB), SMOLLM2_LIKE, PlanRequest(max_ctx=65536, n_parallel=2))
    assert (plan.n_ctx, plan.n_ctx_per_seq) == (16384, 8192)
    assert "trained context 8192" in plan.reason


def test_quantised_v_cache_needs_flash_attention(model_8b: ModelInfo) -> None:
    with pytest.raises(PlanError, match=r"quantised V cache.*needs flash attention"):
        plan_gpu(gpu(8 * GIB), model_8b, PlanRequest(cache_type_k="q8_0", cache_type_v="q8_0"))
    # a quantised K cache alone is fine without it
    plan = plan_gpu(gpu(8 * GIB), model_8b, PlanRequest(cache_type_k="q8_0"))
    assert plan.cache_type_k == "q8_0" and not plan.flash_attn


def test_quantised_cache_buys_context(model_8b: ModelInfo) -> None:
    f16 = plan_gpu(gpu(8 * GIB), model_8b, PlanRequest(flash_attn=True))
    q4 = plan_gpu(
        gpu(8 * GIB), model_8b, PlanRequest(cache_type_k="q4_0", cache_type_v="q4_0", flash_attn=True)
    )
    assert q4.n_ctx > f16.n_ctx
    assert q4.kv_bytes < kv_cache_bytes(model_8b, q4.n_ctx, PlanRequest(flash_attn=True))


@pytest.mark.parametrize("bad", [PlanRequest(n_parallel=0), PlanRequest(n_ctx=0), PlanRequest(n_ubatch=0)])
def test_bad_requests_are_refused_with_a_reason(model_8b: ModelInfo, bad: PlanRequest) -> None:
    with pytest.raises(PlanError, match="must be"):
        plan_gpu(gpu(8 * GIB), model_8b, bad)


def test_measured_compute_replaces_the_estimate(model_8b: ModelInfo) -> None:
    asked: list[ComputeSettings] = []

    def measured(settings: ComputeSettings) -> int | None:
        asked.append(settings)
        return 123 * MIB if settings.n_ctx == 4096 else None

    plan = plan_gpu(gpu(24 * GIB), model_8b, PlanRequest(n_ctx=4096), measured)
    assert (plan.compute_bytes, plan.compute_source) == (123 * MIB, "measured")
    assert asked[0] == ComputeSettings(4096, 1, "f16", "f16", False, 512)
    estimated = plan_gpu(gpu(24 * GIB), model_8b, PlanRequest(n_ctx=2048), measured)
    assert estimated.compute_source == "estimate"
    assert estimated.compute_bytes == estimate_compute_bytes(
        model_8b, ComputeSettings(2048, 1, "f16", "f16", False, 512)
    )


def test_compute_estimate_grows_with_context_only_without_flash_attention(model_8b: ModelInfo) -> None:
    def estimate(n_ctx: int, flash: bool) -> int:
        return estimate_compute_bytes(model_8b, ComputeSettings(n_ctx, 1, "f16", "f16", flash, 512))

    assert estimate(32768, False) > 2 * estimate(8192, False)
    assert estimate(32768, True) < 1.2 * estimate(8192, True)


def test_compute_estimate_counts_logits_per_slot_for_chat_and_per_token_for_embeddings(
    model_8b: ModelInfo,
) -> None:
    """llama-server reserves one logit row per slot for a chat worker and one per batch token for an
    embeddings worker: a 128k vocabulary makes that 2 MiB against 250 MiB at a 512-token ubatch."""
    chat = ComputeSettings(8192, 4, "f16", "f16", True, 512)
    embeddings = replace(chat, embeddings=True)
    assert estimate_compute_bytes(model_8b, embeddings) >= 512 * model_8b.n_vocab * 4
    assert estimate_compute_bytes(model_8b, chat) < 512 * model_8b.n_vocab * 4 / 2
    plans = [
        plan_gpu(
            gpu(24 * GIB), model_8b, PlanRequest(n_ctx=8192, n_parallel=4, flash_attn=True, embeddings=e)
        )
        for e in (False, True)
    ]
    assert [p.compute_bytes for p in plans] == [
        estimate_compute_bytes(model_8b, chat),
        estimate_compute_bytes(model_8b, embeddings),
    ]


def test_cpu_worker_is_sized_against_ram_with_its_own_reserve(model_8b: ModelInfo) -> None:
    ram = replace(gpu(32 * GIB, others=4 * GIB, simulated=False), kind="ram", name="system RAM")
    plan = plan_cpu(ram, model_8b, PlanRequest(reserve_percent=20, reserve_min_bytes=1 * GIB))
    assert plan.verdict == "cpu" and plan.fits and plan.n_gpu_layers == 0
    assert plan.weights_bytes == model_8b.weights_bytes  # every weight lives in RAM
    assert plan.n_ctx == 8192 and plan.reserve_bytes == int(6.4 * GIB)
    assert plan.host_weights_bytes == 0 and plan.host_kv_bytes == 0
    assert _sum_of_parts(plan) + plan.output_bytes == plan.total_bytes  # the logits buffer lives in RAM
    assert plan.used_bytes == plan.weights_bytes + plan.kv_bytes + plan.compute_bytes + plan.output_bytes


def test_the_cpu_workers_prompt_cache_comes_out_of_what_its_plan_leaves_free(model_8b: ModelInfo) -> None:
    """Room for eight prompts of a slot's whole context (the mirror's conversations), at most half the free
    RAM, in whole MiB (llama-server's --cache-ram)."""
    ram = replace(gpu(32 * GIB, others=4 * GIB, simulated=False), kind="ram", name="system RAM")
    plan = plan_cpu(ram, model_8b, PlanRequest(reserve_percent=20, reserve_min_bytes=1 * GIB))
    eight_slots = plan.kv_bytes // plan.n_parallel * 8
    assert plan.prompt_cache_bytes == min(eight_slots, plan.free_bytes // 2) // MIB * MIB > 0
    tight = replace(gpu(8 * GIB + 512 * MIB, others=0, simulated=False), kind="ram", name="system RAM")
    small = plan_cpu(tight, model_8b, PlanRequest(n_ctx=8192, reserve_percent=0, reserve_min_bytes=0))
    assert small.prompt_cache_bytes <= small.free_bytes // 2


def test_cpu_worker_that_does_not_fit_says_so(model_8b: ModelInfo) -> None:
    ram = replace(gpu(8 * GIB, others=2 * GIB, simulated=False), kind="ram", name="system RAM")
    plan = plan_cpu(ram, model_8b, PlanRequest(reserve_percent=20, reserve_min_bytes=1 * GIB))
    assert not plan.fits
    assert "needs" in plan.reason and "more than" in plan.reason
