"""Failure classification as a table: exit status or signal plus the worker's last lines -> kind."""

from __future__ import annotations

import signal

import pytest

from tray_app.supervisor.classify import classify_exit, hung_failure

TRACEBACK_CONTEXT = [
    "Traceback (most recent call last):",
    '  File "loader.py", line 10, in load_model',
    "    raise ValueError(message)",
]

CASES = [
    # (returncode, tail lines, expected kind, text the message must contain)
    (
        1,
        [
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 45.00 MiB on device 0: "
            "cudaMalloc failed: out of memory",
            "llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache",
            *TRACEBACK_CONTEXT,
            "ValueError: Failed to create llama_context",
        ],
        "oom_load",
        "Failed to create llama_context",
    ),
    (
        1,
        [
            "llama_model_load: error loading model: unable to allocate CUDA0 buffer",
            "ValueError: Failed to load model from file: m.gguf",
        ],
        "oom_load",
        "Failed to load model",
    ),
    (
        1,
        ["alloc_tensor_range: failed to allocate CPU buffer of size 123456"],
        "oom_load",
        "failed to allocate",
    ),
    (1, ["some line", "RuntimeError: llama_decode returned -2"], "oom_decode", "-2"),
    (1, ["RuntimeError: llama_decode returned -3"], "oom_decode", "-3"),
    (
        -signal.SIGABRT,
        ["CUDA error: out of memory", "  current device: 0"],
        "crash_abort",
        "CUDA error: out of memory",
    ),
    (-signal.SIGABRT, [], "crash_abort", "SIGABRT"),
    (-signal.SIGSEGV, [], "crash_abort", "SIGSEGV"),
    (-signal.SIGKILL, ["ValueError: Failed to create llama_context"], "killed", "SIGKILL"),
    (-signal.SIGTERM, [], "exited", "SIGTERM"),
    (1, ["ValueError: Model path does not exist: /nowhere/model.gguf"], "bad_config", "does not exist"),
    (
        2,
        [
            "usage: python -m tray_app.worker [-h] --model MODEL",
            "python -m tray_app.worker: error: argument --port: invalid value",
        ],
        "bad_config",
        "argument",
    ),
    (2, [], "bad_config", "arguments"),
    (
        2,
        [
            "usage: python -m tray_app.worker [-h] --model MODEL",
            "                [--flash-attn]",
            "python -m tray_app.worker: error: a quantised V cache (--cache-type-v) needs --flash-attn",
        ],
        "bad_config",
        "needs --flash-attn",
    ),
    (0, ["INFO: shutting down"], "exited", "status 0"),
    (1, [], "exited", "status 1"),
    # The newest line decides: a decode error long ago does not explain a later load failure.
    (
        1,
        ["RuntimeError: llama_decode returned -2", "ValueError: Failed to create llama_context"],
        "oom_load",
        "llama_context",
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
