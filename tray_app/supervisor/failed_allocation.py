"""What a load that ran out of device memory had reached, from what llama.cpp printed: the size of the
allocation that failed, and the device buffers it had allocated before.

Together they are a floor under what the load needed; beyond the memory free when it started, they are what
the plan's estimate lacked on this device, held back at the next GPU start (host.gpu_start). Each pattern is a
format string in the vendored llama.cpp (the paths below, relative to its root); several lines of one failure
name the same size. A host buffer (RAM) says nothing about the GPU, except on the simulated device, where the
CPU build's buffers are the device's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from tray_app.engine.llama_log import buffer_backend, parse_buffer_sizes

MIB = 1024 * 1024

# ggml/src/ggml-alloc.c (alloc_tensor_range, ggml_gallocr_reserve_n): weights, KV cache and compute buffers
# of every backend that allocates through ggml-alloc. The buffer type's name says whose memory it was.
_TYPED = re.compile(r"failed to allocate (\S+) buffer of size (\d+)")
# ggml/src/ggml-cuda/ggml-cuda.cu (ggml_backend_cuda_buffer_type_alloc_buffer), also ROCm and MUSA.
_CUDA = re.compile(r"allocating ([\d.]+) MiB on device \d+: cudaMalloc failed")
# ggml/src/ggml-vulkan/ggml-vulkan-buffers.cpp (ggml_vk_create_buffer).
_VULKAN = re.compile(r"ggml_vulkan: Device memory allocation of size (\d+) failed")
# ggml/src/ggml-metal/ggml-metal-device.m (ggml_metal_buffer_init).
_METAL = re.compile(r"failed to allocate buffer, size = +([\d.]+) MiB")
# ggml/src/ggml-backend.cpp (ggml_backend_cpu_buffer_type_alloc_buffer): RAM, the simulated device's only.
_CPU = re.compile(r"cpu_buffer_type_alloc_buffer: failed to allocate buffer of size (\d+)")


@dataclass(frozen=True)
class FailedAllocation:
    failed_bytes: int  # the allocation that failed
    reached_bytes: int  # the device buffers allocated before it, and it


def _host_buffer(name: str) -> bool:
    """A buffer type in system RAM: CPU, CPU_Mapped, CPU_REPACK, CUDA_Host (pinned), Vulkan_Host."""
    return name.startswith("CPU") or name.endswith("_Host")


def failed_allocation_bytes(lines: Sequence[str], *, simulated: bool) -> int:
    """The size of the device allocation these load lines say failed; 0 if none names its size."""
    found = 0
    for line in lines:
        typed = _TYPED.search(line)
        if typed is not None and (simulated or not _host_buffer(typed.group(1))):
            found = max(found, int(typed.group(2)))
        for pattern, unit in ((_CUDA, MIB), (_METAL, MIB), (_VULKAN, 1)):
            match = pattern.search(line)
            if match is not None:
                found = max(found, round(float(match.group(1)) * unit))
        cpu = _CPU.search(line) if simulated else None
        if cpu is not None:
            found = max(found, int(cpu.group(1)))
    return found


def failed_allocation(lines: Sequence[str], *, simulated: bool) -> FailedAllocation | None:
    """The failed allocation and what the load had reached with it; None if no line names its size."""
    failed = failed_allocation_bytes(lines, simulated=simulated)
    if failed <= 0:
        return None
    device = [
        line
        for line in lines
        if (backend := buffer_backend(line)) is not None and (simulated or not _host_buffer(backend))
    ]
    before = parse_buffer_sizes("\n".join(device)).total_bytes
    return FailedAllocation(failed, before + failed)
