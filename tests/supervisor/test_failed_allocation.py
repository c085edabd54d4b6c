"""The size of the allocation a failed load could not make, read from llama.cpp's own lines (the format
strings of the vendored llama.cpp, filled in as printed)."""

from __future__ import annotations

import pytest

from tray_app.supervisor.failed_allocation import FailedAllocation, failed_allocation, failed_allocation_bytes

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        # CUDA: the backend's line (MiB, two decimals), then ggml-alloc's with the exact size.
        (
            [
                "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 1536.00 MiB on device 0: "
                "cudaMalloc failed: out of memory",
                "alloc_tensor_range: failed to allocate CUDA0 buffer of size 1610612736",
                "llama_model_load: error loading model: unable to allocate CUDA0 buffer",
            ],
            1536 * MIB,
        ),
        # The compute buffers (ggml_gallocr_reserve_n), with llama.cpp's log prefix.
        (
            [
                "0.00.512.301 E ggml_gallocr_reserve_n: failed to allocate ROCm0 buffer of size 301989888",
                "0.00.512.302 E graph_reserve: failed to allocate compute buffers",
            ],
            288 * MIB,
        ),
        (["ggml_vulkan: Device memory allocation of size 402653184 failed."], 384 * MIB),
        (["ggml_metal_buffer_init: error: failed to allocate buffer, size =   256.00 MiB"], 256 * MIB),
        # RAM, not the GPU: pinned host memory and the CPU's own buffers say nothing about VRAM.
        (["alloc_tensor_range: failed to allocate CUDA_Host buffer of size 1048576"], 0),
        (["ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 1048576"], 0),
        # Out of memory with no size: nothing to learn from.
        (
            [
                "llama_init_from_model: failed to initialize the context: "
                "failed to allocate buffer for kv cache"
            ],
            0,
        ),
    ],
)
def test_the_size_of_a_failed_device_allocation(lines: list[str], expected: int) -> None:
    assert failed_allocation_bytes(lines, simulated=False) == expected


def test_on_the_simulated_device_the_cpu_builds_buffers_are_the_devices() -> None:
    lines = [
        "ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 1048576",
        "alloc_tensor_range: failed to allocate CPU buffer of size 1048576",
    ]
    assert failed_allocation_bytes(lines, simulated=True) == MIB
    assert failed_allocation_bytes(lines, simulated=False) == 0


def test_what_the_load_had_reached_counts_the_device_buffers_before_the_failure() -> None:
    # A CUDA load with part of the model in RAM: the weights and the KV cache on CUDA0 were allocated, the
    # compute buffer was not. The host buffers (mapped weights, pinned output) are not the device's.
    lines = [
        "load_tensors:   CPU_Mapped model buffer size =   100.00 MiB",
        "load_tensors:        CUDA0 model buffer size =  1000.00 MiB",
        "llama_context:  CUDA_Host  output buffer size =     0.50 MiB",
        "llama_kv_cache:      CUDA0 KV buffer size =   200.00 MiB",
        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 300.00 MiB on device 0: cudaMalloc failed: "
        "out of memory",
        "ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 314572800",
        "graph_reserve: failed to allocate compute buffers",
    ]
    assert failed_allocation(lines, simulated=False) == FailedAllocation(300 * MIB, 1500 * MIB)
    assert failed_allocation(lines[:4], simulated=False) is None  # no allocation failed
