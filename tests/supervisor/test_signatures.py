"""Each backend's failure lines, as llama.cpp prints them at the vendored commit (its format strings filled
in, with the file each comes from), through the classifier: load failures by kind, crashes by cause."""

from __future__ import annotations

import signal

import pytest

from tray_app.supervisor import signatures
from tray_app.supervisor.classify import classify_exit

EXIT = "srv  llama_server: exiting due to model loading error"

# (file it comes from, the line as printed, the kind of a load that ends with it and exit status 1)
LOAD_LINES = [
    # ggml/src/ggml-cuda/ggml-cuda.cu, ggml_backend_cuda_buffer_type_alloc_buffer (CUDA; HIP shares the file)
    (
        "ggml-cuda.cu",
        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096.00 MiB on device 0: "
        "cudaMalloc failed: out of memory",
        "oom_load",
    ),
    (
        "ggml-cuda.cu (HIP, older ROCm)",
        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 512.00 MiB on device 1: "
        "cudaMalloc failed: hipErrorOutOfMemory",
        "oom_load",
    ),
    # ggml/src/ggml-vulkan/ggml-vulkan-buffers.cpp: vk::OutOfDeviceMemoryError thrown by allocateMemory or
    # its own checks, as what() prints it when it reaches a catch that logs it.
    (
        "ggml-vulkan-buffers.cpp",
        "ggml_vulkan: vk::Device::allocateMemory: ErrorOutOfDeviceMemory",
        "oom_load",
    ),
    (
        "ggml-vulkan-buffers.cpp",
        "Requested buffer size exceeds device buffer size limit: ErrorOutOfDeviceMemory",
        "oom_load",
    ),
    ("ggml-vulkan-buffers.cpp", "No suitable memory type found: ErrorOutOfDeviceMemory", "oom_load"),
    # ggml/src/ggml-metal/ggml-metal-device.m, ggml_metal_buffer_init
    (
        "ggml-metal-device.m",
        "ggml_metal_buffer_init: error: failed to allocate buffer, size =  4096.00 MiB",
        "oom_load",
    ),
    # ggml/src/ggml-alloc.c, alloc_tensor_range and ggml_gallocr_reserve_n, for each backend's buffer names
    ("ggml-alloc.c", "alloc_tensor_range: failed to allocate CUDA0 buffer of size 4294967296", "oom_load"),
    ("ggml-alloc.c", "alloc_tensor_range: failed to allocate Vulkan0 buffer of size 754974720", "oom_load"),
    ("ggml-alloc.c", "alloc_tensor_range: failed to allocate ROCm0 buffer of size 754974720", "oom_load"),
    ("ggml-alloc.c", "alloc_tensor_range: failed to allocate MTL0 buffer of size 754974720", "oom_load"),
    ("ggml-alloc.c", "ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 301989888", "oom_load"),
    # src/llama-model.cpp (load_tensors), src/llama-kv-cache.cpp, src/llama-context.cpp
    ("llama-model.cpp", "llama_model_load: error loading model: unable to allocate CUDA0 buffer", "oom_load"),
    (
        "llama-kv-cache.cpp",
        "llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache",
        "oom_load",
    ),
    (
        "llama-context.cpp",
        "llama_init_from_model: failed to initialize the context: failed to allocate compute pp buffers",
        "oom_load",
    ),
    ("llama-context.cpp", "graph_reserve: failed to allocate compute buffers", "oom_load"),
    ("llama-context.cpp", "output_reserve: failed to allocate output buffer of size 0.19 MiB", "oom_load"),
    (
        "llama-context.cpp",
        "llama_init_from_model: failed to initialize the context: failed to reserve initial output buffer",
        "oom_load",
    ),
    # ggml/src/ggml.c, ggml/src/ggml-backend.cpp: the CPU, and the simulated device under its memory limit
    ("ggml.c", "ggml_aligned_malloc: insufficient memory (attempted to allocate  45.00 MB)", "oom_load"),
    (
        "ggml-backend.cpp",
        "ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 47185920",
        "oom_load",
    ),
    # Bad configuration: ggml/src/gguf.cpp, src/llama-model.cpp, common/arg.cpp
    (
        "gguf.cpp",
        "gguf_init_from_file: failed to open GGUF file '/m.gguf' (No such file or directory)",
        "bad_config",
    ),
    ("gguf.cpp", "gguf_init_from_reader: invalid magic characters: 'hell', expected 'GGUF'", "bad_config"),
    (
        "llama-model.cpp",
        "llama_model_load: error loading model: unknown model architecture: 'nonsense'",
        "bad_config",
    ),
    ("arg.cpp", "error: invalid argument: --bogus", "bad_config"),
    ("arg.cpp", 'error while handling argument "--ctx-size": stoi', "bad_config"),
    ("arg.cpp", "error: unknown value for --flash-attn: 'maybe'", "bad_config"),
]

# (file, the last lines before SIGABRT, the cause the message must name)
FATAL_TAILS = [
    (
        "ggml-cuda.cu, ggml_cuda_error then GGML_ABORT (ggml.c)",
        [
            "CUDA error: out of memory",
            "  current device: 0, in function alloc at ggml/src/ggml-cuda/ggml-cuda.cu:446",
            "  ggml_cuda_device_malloc(&ptr, look_ahead_size, device)",
            "ggml/src/ggml-cuda/ggml-cuda.cu:88: CUDA error",
        ],
        "GPU out of memory: CUDA error: out of memory",
    ),
    (
        "ggml-cuda.cu built for HIP (GGML_CUDA_NAME is ROCm)",
        ["ROCm error: out of memory", "ggml/src/ggml-cuda/ggml-cuda.cu:88: ROCm error"],
        "GPU out of memory: ROCm error: out of memory",
    ),
    (
        "ggml-cuda.cu, another CUDA error",
        ["CUDA error: an illegal memory access was encountered"],
        "GPU error: CUDA error: an illegal memory access was encountered",
    ),
    (
        "ggml-vulkan-buffers.cpp, uncaught, through std::terminate",
        [
            "terminate called after throwing an instance of 'vk::OutOfDeviceMemoryError'",
            "  what():  vk::Device::allocateMemory: ErrorOutOfDeviceMemory",
        ],
        "GPU out of memory: terminate called after throwing an instance of 'vk::OutOfDeviceMemoryError'",
    ),
    (
        "ggml-vulkan.cpp, a fence wait on a lost device",
        [
            "terminate called after throwing an instance of 'vk::DeviceLostError'",
            "  what():  vk::Device::waitForFences: ErrorDeviceLost",
        ],
        "GPU lost (driver reset or hang)",
    ),
    (
        "ggml-metal-context.m, ggml_metal_synchronize",
        [
            "ggml_metal_synchronize: error: command buffer 0 failed with status 5",
            "error: Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)",
        ],
        "GPU out of memory: error: Insufficient Memory",
    ),
]


@pytest.mark.parametrize(
    ("source", "line", "kind"), LOAD_LINES, ids=[f"{source}: {line[:40]}" for source, line, _ in LOAD_LINES]
)
def test_load_failure_lines_are_classified(source: str, line: str, kind: str) -> None:
    failure = classify_exit(1, [f"0.00.119.083 E {line}", EXIT])
    assert (failure.kind, failure.message) == (kind, line), source


@pytest.mark.parametrize(("source", "tail", "cause"), FATAL_TAILS, ids=[s for s, _, _ in FATAL_TAILS])
def test_a_crash_names_its_backends_cause(source: str, tail: list[str], cause: str) -> None:
    failure = classify_exit(-signal.SIGABRT, [], tail)
    assert failure.kind == "crash_abort", source  # the signal decides the kind
    assert failure.message.startswith(f"worker crashed (SIGABRT) after {cause}"), failure.message


def test_the_signal_comes_first_whatever_was_printed() -> None:
    assert classify_exit(-signal.SIGKILL, [LOAD_LINES[0][1]], ["CUDA error: out of memory"]).kind == "killed"
    assert classify_exit(-signal.SIGABRT, [], []).message == "worker crashed (SIGABRT)"


def test_every_signature_is_exercised_by_a_real_line() -> None:
    lines = [line for _source, line, _kind in LOAD_LINES] + [t for _s, tail, _c in FATAL_TAILS for t in tail]
    tables = [signature for _kind, table in signatures.LOAD for signature in table] + list(signatures.FATAL)
    unused = [s.pattern.pattern for s in tables if not any(s.pattern.search(line) for line in lines)]
    # std::bad_alloc and the catch-all "out of memory" come from the C++ runtime and other libraries.
    assert unused == [r"std::bad_alloc"], unused
    assert all(s.source for s in tables)
