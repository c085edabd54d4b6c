"""Failure classification as a table: exit status or signal plus the worker's last lines -> kind."""

from __future__ import annotations

import signal

import pytest

from tray_app.supervisor.classify import classify_exit, hung_failure

# llama-server's own lines (with its log prefix), as this build printed them at the vendored commit.
KV_OOM_UNDER_A_MEMORY_LIMIT = [
    "0.00.002.675 W srv  llama_server: security: no API key is set and CORS allows all origins",
    "0.00.119.077 E ggml_aligned_malloc: insufficient memory (attempted to allocate  45.00 MB)",
    "0.00.119.083 E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 47185920",
    "0.00.119.084 E alloc_tensor_range: failed to allocate CPU buffer of size 47185920",
    "0.00.119.307 E llama_init_from_model: failed to initialize the context: "
    "failed to allocate buffer for kv cache",
    "0.00.119.337 E srv    load_model: failed to create_context with model 'm.gguf'",
    "0.00.120.169 E srv  llama_server: exiting due to model loading error",
]
MISSING_MODEL = [
    "0.00.004.871 E gguf_init_from_file: failed to open GGUF file '/m.gguf' (No such file or directory)",
    "0.00.004.940 E llama_model_load: error loading model: llama_model_loader: failed to load model from x",
    "0.00.004.951 E llama_model_load_from_file_impl: failed to load model",
    "0.00.005.009 E srv    load_model: failed to load model, '/nonexist.gguf'",
    "0.00.005.348 E srv  llama_server: exiting due to model loading error",
]
# From llama.cpp's CUDA, HIP and Vulkan backends at the vendored commit (ggml-cuda.cu, ggml-vulkan.cpp).
CUDA_WEIGHTS_OOM = [
    "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096.00 MiB on device 0: cudaMalloc failed: "
    "out of memory",
    "alloc_tensor_range: failed to allocate CUDA0 buffer of size 4294967296",
    "llama_model_load: error loading model: unable to allocate CUDA0 buffer",
    "srv  llama_server: exiting due to model loading error",
]
VULKAN_OOM = [
    "ggml_vulkan: Device memory allocation of size 754974720 failed.",
    "ggml_vulkan: vk::Device::allocateMemory: ErrorOutOfDeviceMemory",
    "alloc_tensor_range: failed to allocate Vulkan0 buffer of size 754974720",
]

CASES = [
    # (returncode, load log, expected kind, text the message must contain)
    (1, KV_OOM_UNDER_A_MEMORY_LIMIT, "oom_load", "ggml_aligned_malloc: insufficient memory"),
    (1, CUDA_WEIGHTS_OOM, "oom_load", "cudaMalloc failed: out of memory"),
    (1, VULKAN_OOM, "oom_load", "ErrorOutOfDeviceMemory"),
    (1, MISSING_MODEL, "bad_config", "failed to open GGUF file"),
    (
        1,
        ["0.00.004.418 E gguf_init_from_reader: invalid magic characters: 'hell', expected 'GGUF'"],
        "bad_config",
        "invalid magic",
    ),
    (1, ["error: invalid argument: --bogus"], "bad_config", "--bogus"),
    # How the process ended comes first: a signal says it all, whatever it printed.
    (-signal.SIGABRT, ["CUDA error: out of memory", "  current device: 0"], "crash_abort", "SIGABRT"),
    (-signal.SIGSEGV, [], "crash_abort", "SIGSEGV"),
    (-signal.SIGKILL, CUDA_WEIGHTS_OOM, "killed", "SIGKILL"),
    (-signal.SIGTERM, [], "exited", "SIGTERM"),
    (0, ["srv  llama_server: model loaded"], "exited", "status 0"),
    (1, [], "exited", "status 1"),
    (
        1,
        ["srv  init: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 5000"],
        "exited",
        "status 1",
    ),
]


@pytest.mark.parametrize(("returncode", "tail", "kind", "text"), CASES)
def test_classification_table(returncode: int, tail: list[str], kind: str, text: str) -> None:
    failure = classify_exit(returncode, tail)
    assert failure.kind == kind
    assert text in failure.message


def test_hung_failure_says_how_long_and_when() -> None:
    failure = hung_failure(3.0, "a health check")
    assert failure.kind == "hung"
    assert "3 s" in failure.message and "a health check" in failure.message
