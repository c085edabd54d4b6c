"""The buffer sizes llama.cpp printed while loading a model, per backend, read from a worker's log: what the
GPU check and the MoE check compare the planner's figures with.

Standard library only: the GPU check imports it in its own environment."""

from __future__ import annotations

import re

KINDS = ("model", "kv", "compute", "output")
_BUFFER = re.compile(
    r"(?P<backend>[\w.-]+)\s+(?P<kind>model|KV|compute|output) buffer size\s*=\s*"
    r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>GiB|MiB|KiB|B)\b"
)
_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
_LOAD_START = "llama_model_loader: loaded meta data"


def last_load(log: str) -> str:
    """The log from the last model load on: a restarted worker logs every load, and `--fit on` loads the
    model once without memory to measure it (printing the same lines) before the real load."""
    start = log.rfind(_LOAD_START)
    return log[start:] if start >= 0 else log


def per_backend(log: str) -> dict[str, dict[str, int]]:
    """Bytes per backend ("CUDA0", "Vulkan0", "CUDA_Host", "CPU_Mapped", ...) and kind: model, KV and output
    buffers add up; a compute buffer replaces the one printed before it (each graph reservation replaces the
    last)."""
    found: dict[str, dict[str, int]] = {}
    for match in _BUFFER.finditer(log):
        backend, kind = match["backend"], match["kind"].lower()
        size = round(float(match["number"]) * _UNITS[match["unit"]])
        sizes = found.setdefault(backend, dict.fromkeys(KINDS, 0))
        sizes[kind] = size if kind == "compute" else sizes[kind] + size
    return found
