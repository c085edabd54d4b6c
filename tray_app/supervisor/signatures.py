"""What llama.cpp prints when a load fails or a backend dies, per backend, with where each line comes from.

Every pattern is the text of a format string (or of the runtime message it prints) in the vendored
llama.cpp (commit 0c1e570); paths are relative to its root. tests/supervisor/test_signatures.py checks each
entry against the line as printed. Two tables:

- LOAD: llama-server exits with status 1 after a failed load; its load log says why (bad configuration
  first: a missing file also makes "failed to load model" lines, which are not about memory).
- FATAL: a backend error that ends in GGML_ABORT or an uncaught C++ exception (SIGABRT). The signal already
  names the failure (crash_abort); these lines say what caused it, e.g. a device out of memory mid-decode.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

LoadKind = Literal["bad_config", "oom_load"]


@dataclass(frozen=True)
class Signature:
    pattern: re.Pattern[str]
    source: str  # the file that prints it (and the function, where that helps find it)
    what: str  # the cause in a user's words


def _sig(pattern: str, source: str, what: str) -> Signature:
    return Signature(re.compile(pattern), source, what)


BAD_CONFIG = (
    _sig(r"failed to open GGUF file", "ggml/src/gguf.cpp (gguf_init_from_file)", "model file unreadable"),
    _sig(r"No such file or directory", "strerror(ENOENT) in ggml/src/gguf.cpp", "model file missing"),
    _sig(r"invalid magic characters", "ggml/src/gguf.cpp (gguf_init_from_reader)", "not a GGUF file"),
    _sig(r"unknown model architecture", "src/llama-model.cpp (llama_model_create)", "architecture unknown"),
    _sig(r"^error: invalid argument", "common/arg.cpp (common_params_parse_ex)", "bad argument"),
    _sig(r"^error while handling argument", "common/arg.cpp (common_params_parse_ex)", "bad argument"),
    _sig(r"error: unknown value for", "common/arg.cpp (--flash-attn, --fit, ... handlers)", "bad argument"),
)

OOM_LOAD = (
    # CUDA, and HIP/MUSA through the same file (vendors/hip.h maps cudaGetErrorString to hipGetErrorString,
    # which says "out of memory", or "hipErrorOutOfMemory" on older ROCm).
    _sig(
        r"cudaMalloc failed: (?:out of memory|hipErrorOutOfMemory)",
        "ggml/src/ggml-cuda/ggml-cuda.cu (ggml_backend_cuda_buffer_type_alloc_buffer)",
        "GPU out of memory (CUDA/HIP)",
    ),
    # Vulkan: vk::OutOfDeviceMemoryError's what() is "<call>: ErrorOutOfDeviceMemory" (vulkan.hpp).
    _sig(
        r"ErrorOutOfDeviceMemory|Requested buffer size exceeds device buffer size limit"
        r"|No suitable memory type found",
        "ggml/src/ggml-vulkan/ggml-vulkan-buffers.cpp (ggml_vk_create_buffer)",
        "GPU out of memory (Vulkan)",
    ),
    _sig(
        r"error: failed to allocate buffer, size =",
        "ggml/src/ggml-metal/ggml-metal-device.m (ggml_metal_buffer_init)",
        "GPU out of memory (Metal)",
    ),
    # Any backend, after its own allocator returned NULL: the weights, then the graph's buffers.
    _sig(
        r"failed to allocate \S+ buffer of size \d+",
        "ggml/src/ggml-alloc.c (alloc_tensor_range, ggml_gallocr_reserve_n)",
        "a device buffer could not be allocated",
    ),
    _sig(r"unable to allocate \S+ buffer", "src/llama-model.cpp (load_tensors)", "no room for the weights"),
    _sig(
        r"failed to allocate buffer for kv cache",
        "src/llama-kv-cache.cpp (llama_kv_cache)",
        "no room for the KV cache",
    ),
    _sig(
        r"failed to allocate compute (?:pp |tg )?buffers",
        "src/llama-context.cpp (llama_context, graph_reserve)",
        "no room for the compute buffers",
    ),
    _sig(
        r"failed to reserve initial output buffer|failed to allocate output buffer of size",
        "src/llama-context.cpp (llama_context, output_reserve)",
        "no room for the output buffer",
    ),
    # The CPU (and the simulated device under its memory limit).
    _sig(r"insufficient memory \(attempted to allocate", "ggml/src/ggml.c (ggml_aligned_malloc)", "RAM"),
    _sig(
        r"failed to allocate buffer of size \d+",
        "ggml/src/ggml-backend.cpp (ggml_backend_cpu_buffer_type_alloc_buffer)",
        "out of RAM",
    ),
    _sig(r"std::bad_alloc", "the C++ runtime (operator new)", "out of RAM"),
    _sig(r"out of memory", "any backend's error text", "out of memory"),
)

LOAD: tuple[tuple[LoadKind, tuple[Signature, ...]], ...] = (
    ("bad_config", BAD_CONFIG),
    ("oom_load", OOM_LOAD),
)

FATAL = (
    # GGML_CUDA_NAME " error: %s" (CUDA, ROCm, MUSA); a failed cudaMalloc in the pool mid-decode ends here.
    _sig(
        r"^(?:CUDA|ROCm|MUSA) error: (?:out of memory|hipErrorOutOfMemory)",
        "ggml/src/ggml-cuda/ggml-cuda.cu (ggml_cuda_error)",
        "GPU out of memory",
    ),
    _sig(r"^(?:CUDA|ROCm|MUSA) error: ", "ggml/src/ggml-cuda/ggml-cuda.cu (ggml_cuda_error)", "GPU error"),
    # An uncaught vk::SystemError; std::terminate prints its type, then "  what():  <call>: <result>".
    _sig(
        r"vk::OutOfDeviceMemoryError|what\(\):.*ErrorOutOfDeviceMemory",
        "ggml/src/ggml-vulkan/ggml-vulkan-buffers.cpp (ggml_vk_create_buffer), through std::terminate",
        "GPU out of memory",
    ),
    _sig(
        r"vk::DeviceLostError|ErrorDeviceLost",
        "ggml/src/ggml-vulkan/ggml-vulkan.cpp (fence waits), through std::terminate",
        "GPU lost (driver reset or hang)",
    ),
    # Metal's own description of a command buffer that ran out of memory, printed as "error: %s".
    _sig(
        r"kIOGPUCommandBufferCallbackErrorOutOfMemory|Insufficient Memory",
        "ggml/src/ggml-metal/ggml-metal-context.m (ggml_metal_synchronize)",
        "GPU out of memory",
    ),
    _sig(
        r"error: command buffer \d+ failed with status",
        "ggml/src/ggml-metal/ggml-metal-context.m (ggml_metal_synchronize)",
        "GPU error",
    ),
)


def match(signatures: tuple[Signature, ...], line: str) -> Signature | None:
    for signature in signatures:
        if signature.pattern.search(line):
            return signature
    return None
