"""Out-of-memory at load on a simulated GPU, through the same path and message shape as a real one.

After the model loaded (on the CPU build), what llama.cpp allocated (from its own log) is laid out in the
order a CUDA build allocates it: weights, KV cache, output, compute. The first buffer that does not fit in the
simulated free VRAM fails as cudaMalloc would: llama.cpp's lines are printed (marked "(simulated)") and the
same exception llama-cpp-python raises is raised. Weights and KV cache of layers left on the CPU do not count.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from tray_app.llama_log import BufferSizes

MIB = 1024 * 1024
MARK = "(simulated)"


@dataclass(frozen=True)
class SimulatedAllocation:
    """Device bytes per buffer kind on the simulated GPU, in llama.cpp's allocation order."""

    model_bytes: int
    kv_bytes: int
    output_bytes: int
    compute_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.model_bytes + self.kv_bytes + self.output_bytes + self.compute_bytes


def device_share(buffers: BufferSizes, n_gpu_layers: int, n_layers: int) -> SimulatedAllocation:
    """The part of the measured buffers that a GPU with `n_gpu_layers` offloaded would hold."""
    offloaded = n_layers if n_gpu_layers < 0 else min(n_gpu_layers, n_layers)
    fraction = offloaded / n_layers if n_layers > 0 else 1.0
    return SimulatedAllocation(
        model_bytes=round(buffers.model_bytes * fraction),
        kv_bytes=round(buffers.kv_bytes * fraction),
        output_bytes=buffers.output_bytes if offloaded else 0,
        compute_bytes=buffers.compute_bytes if offloaded else 0,
    )


def alloc_failed_lines(size: int, what: str) -> list[str]:
    return [
        f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {size / MIB:.2f} MiB on device 0: "
        f"cudaMalloc failed: out of memory {MARK}",
        f"alloc_tensor_range: failed to allocate CUDA0 buffer of size {size} {MARK}",
        f"{what} {MARK}",
    ]


def failure_for(
    allocation: SimulatedAllocation, free_bytes: int, model_path: Path
) -> tuple[list[str], str] | None:
    """The log lines and exception message of the first allocation that does not fit, or None if all fit."""
    used = 0
    steps = (
        (allocation.model_bytes, "llama_model_load: error loading model: unable to allocate CUDA0 buffer"),
        (
            allocation.kv_bytes,
            "llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache",
        ),
        (
            allocation.output_bytes,
            "llama_init_from_model: failed to initialize the context: failed to allocate output buffer",
        ),
        (allocation.compute_bytes, "graph_reserve: failed to allocate compute buffers"),
    )
    for index, (size, what) in enumerate(steps):
        if used + size > free_bytes:
            lines = alloc_failed_lines(size, what)
            if index == 0:
                # Weights that do not fit fail model loading itself, before any context exists.
                return [*lines, "llama_model_load_from_file_impl: failed to load model"], (
                    f"Failed to load model from file: {model_path}"
                )
            return lines, "Failed to create llama_context"
        used += size
    return None


def raise_out_of_memory(lines: list[str], message: str, stream: TextIO | None = None) -> None:
    """Print llama.cpp's lines and raise the plain ValueError llama-cpp-python raises: nothing downstream can
    tell it from a real one, except the "(simulated)" mark on the lines."""
    out = stream or sys.stderr
    out.write("".join(line + "\n" for line in lines))
    out.flush()
    raise ValueError(message)
