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
import logging
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tray_app.engine.devices import RPC_PREFIX

_UNIT_BYTES = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "KB": 1000, "MB": 1000**2, "GB": 1000**3}
_NUMBER = r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[KMG]i?B|B)\b"
# One line per backend buffer; the backend name may be followed by one or two spaces ("CPU  output"). A device
# on another machine carries its address: "RPC0[192.168.1.20:50052]".
_BUFFER_RE = re.compile(
    r"(?P<backend>[\w.-]+(?:\[[\w.:-]+\])?)\s+(?P<kind>model|KV|compute|output) buffer size\s*=\s*" + _NUMBER
)
# The KV summary ("llama_kv_cache: size = ...", older "KV self size = ..."), used only when no KV buffer line
# was printed: the summary repeats the buffers' total, so counting both would double it.
_KV_SUMMARY_RE = re.compile(r"(?:llama_kv_cache\w*:\s+size|KV self size)\s*=\s*" + _NUMBER)


@dataclass(frozen=True)
class BufferSizes:
    """Bytes llama.cpp allocated, summed over every backend it printed (host and devices).

    `model_buffers` keeps the model buffers per backend: on CPUs with AMX (or other repacking) llama.cpp keeps
    the file's tensors mapped ("CPU_Mapped") and also holds repacked copies of the weights in another buffer.
    """

    model_bytes: int = 0
    kv_bytes: int = 0
    compute_bytes: int = 0
    output_bytes: int = 0
    model_buffers: tuple[tuple[str, int], ...] = ()
    compute_buffers: tuple[tuple[str, int], ...] = ()  # per backend (a split model has one on each device)
    kv_buffers: tuple[tuple[str, int], ...] = ()  # per backend, summed

    @property
    def total_bytes(self) -> int:
        return self.model_bytes + self.kv_bytes + self.compute_bytes + self.output_bytes

    def local_compute_bytes(self) -> int:
        """The compute buffers on this machine: all but those of other machines' devices ("RPC0[...]")."""
        if not self.compute_buffers:
            return self.compute_bytes
        return sum(size for name, size in self.compute_buffers if not name.startswith(RPC_PREFIX))

    def model_buffer(self, backend: str) -> int:
        """Bytes of the model buffers whose backend name is `backend` (e.g. "CPU_Mapped", "CUDA0")."""
        return sum(size for name, size in self.model_buffers if name == backend)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_bytes": self.model_bytes,
            "kv_bytes": self.kv_bytes,
            "compute_bytes": self.compute_bytes,
            "output_bytes": self.output_bytes,
            "model_buffers": dict(self.model_buffers),
            "kv_buffers": dict(self.kv_buffers),
            "compute_buffers": dict(self.compute_buffers),
        }


def as_printed(num_bytes: int) -> str:
    """A size as llama.cpp prints it (MiB, two decimals): compare an estimate at the log's precision."""
    return f"{num_bytes / 1024**2:.2f}"


def _to_bytes(match: re.Match[str]) -> int:
    # llama.cpp prints two decimals of MiB; round to whole bytes (exact for sizes it prints as x.00 MiB).
    return round(float(match.group("number")) * _UNIT_BYTES[match.group("unit")])


def buffer_backend(line: str) -> str | None:
    """The backend a buffer-size line names ("CUDA0", "CPU_Mapped"), or None for any other line."""
    buffer = _BUFFER_RE.search(line)
    return buffer.group("backend") if buffer is not None else None


def parse_buffer_sizes(text: str) -> BufferSizes:
    """Sum the model, KV, compute and output buffers found in the log of one model load (zeros when absent).

    Model, KV and output buffers add up (a split model, or a model with two KV caches, prints several lines
    for one backend). The compute buffer is per backend the last one printed: llama.cpp re-reserves its
    graph (e.g. after changing adapters) and each reservation replaces the previous buffer.
    """
    totals = {"model": 0, "KV": 0, "output": 0}
    compute: dict[str, int] = {}
    kv: dict[str, int] = {}
    model_buffers: list[tuple[str, int]] = []
    kv_lines = 0
    kv_summary = 0
    for line in text.splitlines():
        buffer = _BUFFER_RE.search(line)
        if buffer is not None:
            kind, backend, size = buffer.group("kind"), buffer.group("backend"), _to_bytes(buffer)
            if kind == "compute":
                compute[backend] = size
            else:
                totals[kind] += size
            if kind == "model":
                model_buffers.append((backend, size))
            if kind == "KV":
                kv[backend] = kv.get(backend, 0) + size
            kv_lines += kind == "KV"
            continue
        summary = _KV_SUMMARY_RE.search(line)
        if summary is not None:
            kv_summary += _to_bytes(summary)
    return BufferSizes(
        model_bytes=totals["model"],
        kv_bytes=totals["KV"] if kv_lines else kv_summary,
        compute_bytes=sum(compute.values()),
        output_bytes=totals["output"],
        model_buffers=tuple(model_buffers),
        compute_buffers=tuple(compute.items()),
        kv_buffers=tuple(kv.items()),
    )


class LlamaLogCapture:
    """What llama.cpp logged while this capture was active (thread-safe: it may log from any thread)."""

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
# every active capture, or, when none is active, to Python's logging ("llama.cpp") at its level. It replaces
# llama-cpp-python's callback, which maps ggml's levels by an older numbering: it printed warnings even when
# not verbose (a vocab-only load's "n_ctx_seq (512) > n_ctx_train (0)") and hid errors.
_active: list[LlamaLogCapture] = []
_active_lock = threading.Lock()
_dispatcher: Any = None  # the ctypes callback object; kept referenced so it is never garbage-collected
_install_lock = threading.Lock()
log = logging.getLogger("llama.cpp")

# ggml_log_level at the vendored commit: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the
# previous message). llama.cpp's INFO is its load report: debug detail here.
GGML_CONTINUE = 5
_LOGGING_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}


class _Forward:
    """Python-logging side of the dispatcher: one record per line, continuations at their message's level."""

    def __init__(self) -> None:
        self.level = logging.DEBUG

    def __call__(self, ggml_level: int, text: str) -> None:
        if ggml_level != GGML_CONTINUE:
            self.level = _LOGGING_LEVELS.get(ggml_level, logging.INFO)
        line = text.strip()
        if line and log.isEnabledFor(self.level):
            log.log(self.level, "%s", line)


def _install_dispatcher() -> None:
    global _dispatcher
    with _install_lock:
        if _dispatcher is None:
            _dispatcher = _make_dispatcher()


def _make_dispatcher() -> Any:
    import llama_cpp

    forward = _Forward()

    @llama_cpp.llama_log_callback
    def dispatch(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        decoded = text.decode("utf-8", errors="replace")
        with _active_lock:
            captures = list(_active)
        for capture in captures:
            capture.append(decoded)
        if not captures:
            forward(level, decoded)

    llama_cpp.llama_log_set(dispatch, ctypes.c_void_p(0))
    return dispatch


@contextmanager
def capture_llama_log() -> Iterator[LlamaLogCapture]:
    """Collect what llama.cpp logs inside the block (e.g. around `Llama(...)`), whatever `verbose` is; it is
    not logged elsewhere meanwhile."""
    _install_dispatcher()
    capture = LlamaLogCapture()
    with _active_lock:
        _active.append(capture)
    try:
        yield capture
    finally:
        with _active_lock:
            _active.remove(capture)
