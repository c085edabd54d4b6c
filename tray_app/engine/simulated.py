"""The GPU worker on a simulated device: a real memory limit on the process, and the after-load check.

On a machine with no GPU, the "GPU" worker is a CPU build of llama-server with the plan's GPU arguments.
Two things make the simulated VRAM size mean something:

- RLIMIT_AS caps the worker's address space at what llama-server maps before it loads a model (measured for
  this build: libraries, thread stacks, the HTTP server), plus the simulated VRAM, plus a margin. A plan far
  beyond the device then fails inside llama.cpp in a real allocation ("failed to allocate ... buffer",
  exit status 1), the path a real out-of-memory at load takes.
- After load, what llama.cpp printed it allocated (weights, KV cache, output, compute) is laid out in the
  order a GPU build allocates it; the first buffer that does not fit fails the worker as cudaMalloc would,
  with llama.cpp's own lines marked "(simulated)".
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass

from tray_app.engine.llama_log import BufferSizes, as_printed

MIB = 1024 * 1024
MARK = "(simulated)"
ERROR_MODEL = "llama_model_load: error loading model: unable to allocate CUDA0 buffer"
ERROR_KV = "llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache"
ERROR_OUTPUT = "llama_init_from_model: failed to initialize the context: failed to allocate output buffer"
ERROR_COMPUTE = "graph_reserve: failed to allocate compute buffers"
# llama-server's own address space before it allocates for a model (measured: about 0.3 GiB of mappings,
# libraries and one 8 MiB stack per thread), with room for malloc arenas of its HTTP threads.
BASELINE_BYTES = 1024 * MIB
MARGIN_BYTES = 512 * MIB
# The drill's load failure: the whole address space llama-server gets. Measured: it reaches the model's
# first buffer with 200 MiB (and fails there, "insufficient memory"), and needs about 680 MiB to serve.
LOAD_FAULT_LIMIT_BYTES = 192 * MIB


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


def device_share(
    buffers: BufferSizes, n_gpu_layers: int, n_layers: int, experts_in_ram: int = 0
) -> SimulatedAllocation:
    """The part of the measured buffers that a GPU with `n_gpu_layers` offloaded would hold, less the expert
    tensors an expert split keeps in RAM (a CPU build prints every weight in one CPU buffer)."""
    offloaded = n_layers if n_gpu_layers < 0 else min(n_gpu_layers, n_layers)
    fraction = offloaded / n_layers if n_layers > 0 else 1.0
    return SimulatedAllocation(
        model_bytes=max(round(buffers.model_bytes * fraction) - experts_in_ram, 0),
        kv_bytes=round(buffers.kv_bytes * fraction),
        output_bytes=buffers.output_bytes if offloaded else 0,
        compute_bytes=buffers.local_compute_bytes() if offloaded else 0,
    )


def alloc_failed_lines(size: int, what: str) -> list[str]:
    return [
        f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {size / MIB:.2f} MiB on device 0: "
        f"cudaMalloc failed: out of memory {MARK}",
        f"alloc_tensor_range: failed to allocate CUDA0 buffer of size {size} {MARK}",
        f"{what} {MARK}",
    ]


def failure_lines(allocation: SimulatedAllocation, free_bytes: int) -> list[str] | None:
    """The lines of the first allocation that does not fit in `free_bytes`, after those of the buffers
    allocated before it (as llama.cpp prints each), or None if all fit."""
    steps = (
        (allocation.model_bytes, "load_tensors: CUDA0 model buffer size", ERROR_MODEL),
        (allocation.kv_bytes, "llama_kv_cache: CUDA0 KV buffer size", ERROR_KV),
        (allocation.output_bytes, "llama_context: CUDA0 output buffer size", ERROR_OUTPUT),
        (allocation.compute_bytes, "sched_reserve: CUDA0 compute buffer size", ERROR_COMPUTE),
    )
    used = 0
    allocated: list[str] = []
    for size, printed, error in steps:
        if used + size > free_bytes:
            return allocated + alloc_failed_lines(size, error)
        used += size
        if size:
            allocated.append(f"{printed} = {as_printed(size)} MiB {MARK}")
    return None


def address_space_limit(simulated_vram_bytes: int, *, load_fault: bool = False) -> int:
    if load_fault:
        return LOAD_FAULT_LIMIT_BYTES
    return BASELINE_BYTES + simulated_vram_bytes + MARGIN_BYTES


def limit_in_child(limit_bytes: int) -> Callable[[], None] | None:
    """A `preexec_fn` that caps the child's address space (None where the OS has no such limit)."""
    if not sys.platform.startswith("linux"):
        return None

    def apply() -> None:
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard == resource.RLIM_INFINITY or hard >= limit_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, hard))

    return apply
