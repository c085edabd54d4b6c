"""The second real model, Gemma 3 270M Q4_K_M: its GGUF read and planned, with sliding-window attention.

Gemma 3 attends to the whole context on every sixth layer only (5, 11, 17 of its 18); the other 15 look at the
last 512 tokens, and llama.cpp gives them a cache of their own of 512 + one ubatch cells per sequence, padded
to 256 (llama_kv_cache_iswa). The figures below are what llama-server printed for this file.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support import models
from tray_app.budget import model_info
from tray_app.budget.footprint import gpu_weights_bytes, kv_cache_bytes
from tray_app.budget.model_info import ModelInfo, inspect_model
from tray_app.budget.plan import PlanRequest
from tray_app.budget.planner import plan_gpu
from tray_app.engine.llama_log import as_printed, capture_llama_log, parse_buffer_sizes

from .conftest import GIB, MIB, gpu

DATA = Path(__file__).parent / "data"
FULL_LAYERS = (5, 11, 17)
# One cache cell of one layer: K and V rows of one KV head of 256 values, f16.
CELL_BYTES = 2 * 256 * 2


@pytest.fixture(scope="module")
def info(gemma_model_path: Path) -> ModelInfo:
    return inspect_model(gemma_model_path, use_cache=False)


def expected_kv(n_ctx: int, n_parallel: int, n_ubatch: int = 512) -> int:
    """3 full layers of n_ctx cells, 15 sliding-window layers of min(n_ctx_seq, 512 + ubatch) per sequence."""
    window = min(n_ctx // n_parallel, -(-(512 + n_ubatch) // 256) * 256)
    return (3 * n_ctx + 15 * n_parallel * window) * CELL_BYTES


def test_model_info(info: ModelInfo, gemma_model_path: Path) -> None:
    assert (info.architecture, info.n_layers, info.n_embd, info.n_head) == ("gemma3", 18, 640, 4)
    assert info.n_head_kv == (1,) * 18
    assert (info.head_dim_k, info.head_dim_v) == (256, 256)
    assert (info.n_ctx_train, info.n_vocab, info.n_ff) == (32768, 262144, 2048)
    assert info.n_swa == 512
    assert info.swa_layers == tuple(layer not in FULL_LAYERS for layer in range(18))
    # the tied embedding (q8_0, 262144 x 640) is most of the file; the output layer is its copy and a norm
    assert info.tied_embeddings
    assert info.input_bytes == 262144 * 640 // 32 * 34
    assert info.output_layer_bytes == info.non_layer_bytes == info.input_bytes + 640 * 4
    assert len(info.layer_bytes) == 18 and min(info.layer_bytes) > 3 * MIB
    assert info.file_bytes == gemma_model_path.stat().st_size
    # tensors plus the header (a 262k-token vocabulary) and alignment make the file
    assert 0 < info.file_bytes - info.weights_bytes < 8 * MIB
    assert as_printed(info.weights_bytes) == "235.16"  # llama-server's CPU_Mapped model buffer
    assert info.to_dict()["swa_layers"] == list(info.swa_layers)


def test_model_info_cache_keeps_the_sliding_window(
    info: ModelInfo, gemma_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model_info, "_memo", {})
    inspect_model(gemma_model_path)  # read and stored in this test's data dir
    monkeypatch.setattr(model_info, "_memo", {})
    assert inspect_model(gemma_model_path) == info  # read back from that cache


@pytest.mark.parametrize(
    ("n_ctx", "n_parallel", "printed_mib"),
    [
        # llama-server -c N -np P: "KV buffer size" of the non-SWA cache + the SWA cache
        (4096, 1, 12 + 15),
        (4096, 4, 12 + 60),
        (16384, 1, 48 + 15),
        (16384, 4, 48 + 60),
    ],
)
def test_kv_cache_is_what_llama_server_printed(
    info: ModelInfo, n_ctx: int, n_parallel: int, printed_mib: int
) -> None:
    request = PlanRequest(n_parallel=n_parallel)
    assert kv_cache_bytes(info, n_ctx, request) == expected_kv(n_ctx, n_parallel) == printed_mib * MIB
    # without the sliding window every layer would hold n_ctx cells
    assert kv_cache_bytes(replace(info, swa_layers=()), n_ctx, request) == 18 * n_ctx * CELL_BYTES


def test_kv_cache_of_the_real_llama_server_log(info: ModelInfo) -> None:
    # llama-server -c 16384 -np 4 --flash-attn off --fit off -ub 512 on this file (two KV buffer lines).
    buffers = parse_buffer_sizes((DATA / "llama_server_load_gemma3_270m_c16384_np4.log").read_text())
    assert buffers.kv_bytes == kv_cache_bytes(info, 16384, PlanRequest(n_parallel=4)) == 108 * MIB
    assert as_printed(buffers.model_buffer("CPU_Mapped")) == as_printed(info.weights_bytes)


def test_the_window_grows_with_the_ubatch_and_never_exceeds_the_context(info: ModelInfo) -> None:
    assert kv_cache_bytes(info, 8192, PlanRequest(n_ubatch=1024)) == expected_kv(8192, 1, 1024)
    assert expected_kv(8192, 1, 1024) == (3 * 8192 + 15 * 1536) * CELL_BYTES
    # a sequence shorter than the window: every layer holds the whole sequence
    assert kv_cache_bytes(info, 1024, PlanRequest(n_parallel=4)) == 18 * 1024 * CELL_BYTES


@pytest.mark.parametrize("n_parallel", [1, 4])
def test_plan_on_a_simulated_4_gib_device(info: ModelInfo, n_parallel: int) -> None:
    plan = plan_gpu(gpu(4 * GIB), info, PlanRequest(n_parallel=n_parallel))
    assert (plan.verdict, plan.fits, plan.n_gpu_layers, plan.n_layers) == ("gpu", True, 19, 19)
    assert (plan.n_ctx, plan.n_parallel) == (8192, n_parallel)  # capped by max_ctx, not by memory
    # all 18 blocks plus the output layer, whose tied embedding is copied: every tensor byte of the file
    assert plan.weights_bytes == gpu_weights_bytes(info, 19) == info.weights_bytes
    assert plan.kv_bytes == expected_kv(8192, n_parallel)
    assert plan.kv_bytes == {1: 39, 4: 84}[n_parallel] * MIB
    assert plan.host_kv_bytes == 0
    assert 0 < plan.compute_bytes < GIB and plan.compute_source == "estimate"
    parts = plan.weights_bytes + plan.kv_bytes + plan.compute_bytes + plan.reserve_bytes + plan.other_bytes
    assert parts + plan.free_bytes == plan.total_bytes == 4 * GIB


def test_the_whole_trained_context_fits_on_4_gib_thanks_to_the_window(info: ModelInfo) -> None:
    plan = plan_gpu(gpu(4 * GIB), info, PlanRequest(n_parallel=4, max_ctx=4 * 32768))
    assert (plan.verdict, plan.n_ctx, plan.n_ctx_per_seq) == ("gpu", 4 * 32768, 32768)
    assert plan.kv_bytes == expected_kv(4 * 32768, 4) == (384 + 60) * MIB


def test_a_split_divides_the_cache_as_llama_cpp_does(info: ModelInfo) -> None:
    request = PlanRequest(n_ctx=16384, n_parallel=4)
    # llama-server's compute buffer at these settings was 51.76 MiB; a small device holds the output layer
    # (the 170 MiB tied embedding's copy) and a few blocks
    plan = plan_gpu(gpu(512 * MIB), info, request, lambda settings: 52 * MIB)
    assert plan.verdict == "split" and 1 < plan.n_gpu_layers < 18
    # llama.cpp offloads the output layer, then the last blocks
    on_gpu = range(18 - (plan.n_gpu_layers - 1), 18)
    full = sum(layer in FULL_LAYERS for layer in on_gpu)
    assert plan.kv_bytes == (full * 16384 + (len(on_gpu) - full) * 4 * 1024) * CELL_BYTES
    assert plan.kv_bytes + plan.host_kv_bytes == expected_kv(16384, 4)


# ------------------------------------------------------------------ against llama.cpp itself (in-process)


@pytest.fixture(scope="module")
def loaded(gemma_model_path: Path) -> Iterator[Any]:
    import llama_cpp

    llama_cpp.llama_backend_init()
    with capture_llama_log():
        model = llama_cpp.llama_model_load_from_file(
            str(gemma_model_path).encode(), llama_cpp.llama_model_default_params()
        )
    assert model is not None, "llama.cpp could not load the Gemma model"
    yield model
    llama_cpp.llama_model_free(model)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("n_ctx", "n_parallel", "cache", "flash"),
    [
        (4096, 1, "f16", False),
        (4096, 4, "f16", False),
        (16384, 1, "f16", True),
        (16384, 4, "f16", False),
        (16384, 4, "q8_0", True),
    ],
)
def test_kv_cache_equals_llama_cpp(
    loaded: Any, info: ModelInfo, n_ctx: int, n_parallel: int, cache: str, flash: bool
) -> None:
    import llama_cpp

    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_seq_max, params.n_batch, params.n_ubatch = n_ctx, n_parallel, 2048, 512
    params.type_k = params.type_v = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0}[cache]
    params.flash_attn_type = (
        llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    # llama-server's defaults (the C API's default is a full-size sliding-window cache)
    params.swa_full, params.kv_unified = False, False
    params.n_threads = params.n_threads_batch = 1
    with capture_llama_log() as log:
        context = llama_cpp.llama_init_from_model(loaded, params)
    assert context is not None
    llama_cpp.llama_free(context)
    request = PlanRequest(
        n_parallel=n_parallel,
        cache_type_k=cache,  # type: ignore[arg-type]
        cache_type_v=cache,  # type: ignore[arg-type]
        flash_attn=flash,
    )
    printed = parse_buffer_sizes(log.text).kv_bytes
    assert as_printed(kv_cache_bytes(info, n_ctx, request)) == as_printed(printed)


def test_a_missing_model_fails_naming_the_make_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    with pytest.raises(models.MissingModelError, match=r"is missing: run `make test-models`"):
        models.gemma_path()
    models.models_dir().mkdir(parents=True)
    (models.models_dir() / models.GEMMA_FILE).write_bytes(b"GGUF")
    with pytest.raises(models.MissingModelError, match=r"has 4 bytes, not 253113024: delete it"):
        models.gemma_path()
