"""The buffer sizes llama.cpp prints while it loads a model, and a way to capture that log in-process.

llama.cpp reports every buffer it allocates, per backend ("CPU_Mapped", "CUDA0", "CUDA_Host", ...):

    load_tensors:   CPU_Mapped model buffer size =    85.82 MiB
    llama_kv_cache:        CPU KV buffer size =    45.00 MiB
    llama_kv_cache: size =   45.00 MiB (  2048 cells,  30 layers,  1/1 seqs), K (f16): ...
    llama_context:        CPU  output buffer size =     0.19 MiB
    llama_context:        CPU compute buffer size =    69.00 MiB

These are the ground truth the planner is checked against and calibrated with.
"""

from __future__ import annotations

import ctypes
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

_UNIT_BYTES = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "KB": 1000, "MB": 1000**2, "GB": 1000**3}
_NUMBER = r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[KMG]i?B|B)\b"
# One line per backend buffer; the backend name may be followed by one or two spaces ("CPU  output").
_BUFFER_RE = re.compile(r"(?P<backend>[\w.-]+)\s+(?P<kind>model|KV|compute|output) buffer size\s*=\s*" + _NUMBER)
# The KV summary ("llama_kv_cache: size = ...", older "KV self size = ..."), used only when no KV buffer line
# was printed: the summary repeats the buffers' total, so counting both would double it.
_KV_SUMMARY_RE = re.compile(r"(?:llama_kv_cache\w*:\s+size|KV self size)\s*=\s*" + _NUMBER)


@dataclass(frozen=True)
class BufferSizes:
    """Bytes llama.cpp allocated, summed over every backend it printed (host and devices)."""

    model_bytes: int = 0
    kv_bytes: int = 0
    compute_bytes: int = 0
    output_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.model_bytes + self.kv_bytes + self.compute_bytes + self.output_bytes

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def _to_bytes(match: re.Match[str]) -> int:
    # llama.cpp prints two decimals of MiB; round to whole bytes (exact for sizes it prints as x.00 MiB).
    return round(float(match.group("number")) * _UNIT_BYTES[match.group("unit")])


def parse_buffer_sizes(text: str) -> BufferSizes:
    """Sum the model, KV, compute and output buffers found in a llama.cpp load log (zeros when absent)."""
    totals = {"model": 0, "KV": 0, "compute": 0, "output": 0}
    kv_lines = 0
    kv_summary = 0
    for line in text.splitlines():
        buffer = _BUFFER_RE.search(line)
        if buffer is not None:
            totals[buffer.group("kind")] += _to_bytes(buffer)
            kv_lines += buffer.group("kind") == "KV"
            continue
        summary = _KV_SUMMARY_RE.search(line)
        if summary is not None:
            kv_summary += _to_bytes(summary)
    return BufferSizes(
        model_bytes=totals["model"],
        kv_bytes=totals["KV"] if kv_lines else kv_summary,
        compute_bytes=totals["compute"],
        output_bytes=totals["output"],
    )


class LlamaLogCapture:
    """The text llama.cpp logged while this capture was active (thread-safe; llama.cpp may log from any thread)."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._lock = threading.Lock()

    def append(self, text: str) -> None:
        with self._lock:
            self._parts.append(text)

    @property
    def text(self) -> str:
        with self._lock:
            return "".join(self._parts)

    def buffer_sizes(self) -> BufferSizes:
        return parse_buffer_sizes(self.text)


# llama.cpp has one process-wide log callback. One dispatcher is installed once; it hands each message to
# every active capture and then to llama-cpp-python's own callback, so its verbose printing still works.
_active: list[LlamaLogCapture] = []
_active_lock = threading.Lock()
_dispatcher: Any = None  # the ctypes callback object; kept referenced so it is never garbage-collected


def _install_dispatcher() -> None:
    global _dispatcher
    if _dispatcher is not None:
        return
    import llama_cpp
    from llama_cpp import _logger

    forward = _logger.llama_log_callback

    @llama_cpp.llama_log_callback  # type: ignore[misc]
    def dispatch(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        decoded = text.decode("utf-8", errors="replace")
        with _active_lock:
            captures = list(_active)
        for capture in captures:
            capture.append(decoded)
        forward(level, text, user_data)

    llama_cpp.llama_log_set(dispatch, ctypes.c_void_p(0))
    _dispatcher = dispatch


@contextmanager
def capture_llama_log() -> Iterator[LlamaLogCapture]:
    """Collect what llama.cpp logs inside the block (e.g. around `Llama(...)`), whatever `verbose` is."""
    _install_dispatcher()
    capture = LlamaLogCapture()
    with _active_lock:
        _active.append(capture)
    try:
        yield capture
    finally:
        with _active_lock:
            _active.remove(capture)
