"""The planner checked against llama.cpp itself: load the bundled model (and Gemma 3, with sliding-window
layers and a 262k vocabulary) at several settings, parse the buffer sizes llama.cpp prints, and compare. KV
cache exactly, weights within 1 %, compute never under what llama.cpp reserves and at most a little over
(and the measured value is kept and used by the next plan)."""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from tray_app.budget import calibration
from tray_app.budget.footprint import (
    estimate_compute_bytes,
    kv_cache_bytes,
    output_buffer_bytes,
    padded_context,
)
from tray_app.budget.model_info import ModelInfo, inspect_model
from tray_app.budget.plan import ComputeSettings, PlanRequest
from tray_app.budget.planner import plan_gpu
from tray_app.engine.llama_log import BufferSizes, as_printed, capture_llama_log, parse_buffer_sizes

from .conftest import GIB, gpu

pytestmark = pytest.mark.integration

GGML_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0}
CACHES = [("f16", False), ("f16", True), ("q8_0", True)]  # (K and V type, flash attention)
SETTINGS = [
    ComputeSettings(n_ctx, n_parallel, cache, cache, flash, 512)
    for n_ctx, n_parallel, (cache, flash) in itertools.product((1000, 2048, 8192), (1, 3), CACHES)
]
COMPUTE_SLACK = 10 * 1024**2
# llama.cpp prints buffer sizes in MiB with two decimals: a printed size is within half of 0.01 MiB (and
# the byte the parse rounds to) of the real one.
PRINT_ROUNDING = 0.005 * 1024**2 + 1
N_CTX_LINE = re.compile(r"llama_context: n_ctx\s+=\s+(\d+)")


@pytest.fixture(scope="module")
def quiet_llama() -> Iterator[None]:
    # llama-cpp-python prints every llama.cpp line to stderr until a Llama() sets its logger's level.
    logger = logging.getLogger("llama-cpp-python")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


@pytest.fixture(scope="module", params=["model_path", "gemma_model_path"], ids=["smollm2", "gemma3"])
def checked_model(request: pytest.FixtureRequest) -> Path:
    return Path(request.getfixturevalue(request.param))


@pytest.fixture(scope="module")
def info(checked_model: Path) -> ModelInfo:
    return inspect_model(checked_model, use_cache=False)


@pytest.fixture(scope="module")
def loaded(checked_model: Path, quiet_llama: None) -> Iterator[tuple[Any, BufferSizes]]:
    """The model loaded once through llama.cpp's C API (contexts with n_seq_max need it), with its log."""
    llama_cpp.llama_backend_init()
    with capture_llama_log() as log:
        model = llama_cpp.llama_model_load_from_file(
            str(checked_model).encode(), llama_cpp.llama_model_default_params()
        )
    assert model is not None, f"llama.cpp could not load {checked_model.name}"
    yield model, log.buffer_sizes()
    llama_cpp.llama_model_free(model)


def _context_log(model: Any, settings: ComputeSettings) -> str:
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = settings.n_ctx
    params.n_seq_max = settings.n_parallel
    # As llama-server runs a chat worker: one output per slot, sliding-window layers in window-sized caches.
    params.n_outputs_max = settings.n_parallel
    params.swa_full = False
    params.n_batch = 512
    params.n_ubatch = settings.n_ubatch
    params.type_k = GGML_TYPES[settings.cache_type_k]
    params.type_v = GGML_TYPES[settings.cache_type_v]
    params.flash_attn_type = (
        llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        if settings.flash_attn
        else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    params.n_threads = params.n_threads_batch = 2
    with capture_llama_log() as log:
        context = llama_cpp.llama_init_from_model(model, params)
    assert context is not None, f"llama.cpp refused a context for {settings}"
    llama_cpp.llama_free(context)
    return log.text


def test_weights_match_the_mapped_model_buffer(loaded: tuple[Any, BufferSizes], info: ModelInfo) -> None:
    _, buffers = loaded
    mapped = buffers.model_buffer("CPU_Mapped")
    estimate = as_printed(info.weights_bytes)
    print(f"\nweights: estimate {estimate} MiB, llama.cpp CPU_Mapped {as_printed(mapped)} MiB")
    assert abs(info.weights_bytes - mapped) <= 0.01 * mapped


@pytest.mark.parametrize(
    "settings",
    SETTINGS,
    ids=lambda s: f"ctx{s.n_ctx}-par{s.n_parallel}-{s.cache_type_k}-fa{int(s.flash_attn)}",
)
def test_kv_exact_compute_close(
    loaded: tuple[Any, BufferSizes], info: ModelInfo, settings: ComputeSettings
) -> None:
    model, _ = loaded
    text = _context_log(model, settings)
    buffers = parse_buffer_sizes(text)
    n_ctx, _ = padded_context(settings.n_ctx, settings.n_parallel)
    found = N_CTX_LINE.search(text)
    assert found is not None and int(found.group(1)) == n_ctx  # the planner pads exactly as llama.cpp does
    request = PlanRequest(
        n_parallel=settings.n_parallel,
        cache_type_k=settings.cache_type_k,  # type: ignore[arg-type]
        cache_type_v=settings.cache_type_v,  # type: ignore[arg-type]
        flash_attn=settings.flash_attn,
    )
    kv = kv_cache_bytes(info, n_ctx, request)
    padded = ComputeSettings(
        n_ctx, settings.n_parallel, settings.cache_type_k, settings.cache_type_v, settings.flash_attn, 512
    )
    compute = estimate_compute_bytes(info, padded)
    print(
        f"\n{settings.n_ctx:>5} -> n_ctx {n_ctx:>5} x{settings.n_parallel} {settings.cache_type_k:>4} "
        f"fa={int(settings.flash_attn)}: KV {as_printed(kv)} vs {as_printed(buffers.kv_bytes)} MiB, "
        f"compute {as_printed(compute)} vs {as_printed(buffers.compute_bytes)} MiB "
        f"({compute / buffers.compute_bytes - 1:+.1%}), output {as_printed(buffers.output_bytes)} MiB"
    )
    # Exact, at the precision llama.cpp prints: 0.01 MiB per cache, and a model with sliding-window layers
    # has two (the parsed total is the sum of two rounded figures).
    assert abs(kv - buffers.kv_bytes) <= PRINT_ROUNDING * (2 if info.swa_layers else 1)
    assert as_printed(output_buffer_bytes(info, settings.n_parallel)) == as_printed(buffers.output_bytes)
    # Never under (the plan would promise memory llama.cpp then takes); over by at most 15 % and the few
    # MiB of workspace counted for every ubatch token without flash attention.
    assert buffers.compute_bytes <= compute <= 1.15 * buffers.compute_bytes + COMPUTE_SLACK


def test_measured_compute_is_kept_and_used(
    loaded: tuple[Any, BufferSizes], info: ModelInfo, checked_model: Path
) -> None:
    model, _ = loaded
    settings = ComputeSettings(4096, 1, "f16", "f16", False, 512)
    request = PlanRequest(n_ctx=4096)
    lookup = calibration.measured_compute(checked_model)
    before = plan_gpu(gpu(4 * GIB), info, request, lookup)
    assert before.compute_source == "estimate"
    measured = parse_buffer_sizes(_context_log(model, settings))
    calibration.record_measurement(checked_model, settings, measured)
    after = plan_gpu(gpu(4 * GIB), info, request, lookup)
    assert (after.compute_source, after.compute_bytes) == ("measured", measured.compute_bytes)
    assert after.kv_bytes == before.kv_bytes


def test_llama_class_load_is_captured_even_when_quiet(checked_model: Path, info: ModelInfo) -> None:
    """The way a worker loads: llama_cpp.Llama with verbose=False still reports through the capture."""
    with capture_llama_log() as log:
        llama = llama_cpp.Llama(
            model_path=str(checked_model),
            n_ctx=1024,
            type_k=llama_cpp.GGML_TYPE_Q8_0,
            type_v=llama_cpp.GGML_TYPE_Q8_0,
            flash_attn=True,
            n_threads=2,
            verbose=False,
        )
    llama.close()
    buffers = log.buffer_sizes()
    request = PlanRequest(cache_type_k="q8_0", cache_type_v="q8_0", flash_attn=True)
    assert as_printed(kv_cache_bytes(info, 1024, request)) == as_printed(buffers.kv_bytes)
    mapped = buffers.model_buffer("CPU_Mapped")
    assert abs(info.weights_bytes - mapped) <= 0.01 * mapped
    assert buffers.compute_bytes > 0 and buffers.output_bytes > 0
