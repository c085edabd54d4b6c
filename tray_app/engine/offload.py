"""Proof that a GPU worker runs on a GPU: checked before it starts and again from its load log.

Before: the build must list a GPU device (tray_app.engine.devices); a CPU-only llama.cpp accepts
`--n-gpu-layers 999` and silently runs everything on the CPU. After load, llama.cpp's own lines
(src/llama-model.cpp, llama_model::load_tensors) must show the layers and the weights on a GPU device:

    load_tensors: offloading 30 repeating layers to GPU
    load_tensors: offloaded 31/31 layers to GPU
    load_tensors:        CUDA0 model buffer size =    70.31 MiB
    load_tensors:   CPU_Mapped model buffer size =    21.79 MiB

The "offloaded" line is printed only when the build supports GPU offload at all. A worker on a simulated
device is exempt: it is a CPU build by design and says so everywhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tray_app.engine.binary import no_gpu_backend_reason
from tray_app.engine.devices import DeviceListing, is_gpu_buffer
from tray_app.engine.llama_log import BufferSizes

_OFFLOADED = re.compile(r"offloaded (?P<layers>\d+)/(?P<total>\d+) layers to GPU")


@dataclass(frozen=True)
class Offload:
    """Where llama.cpp put a model, from its load log."""

    layers: int | None  # None: no "offloaded N/M layers to GPU" line (a build without GPU offload)
    layers_total: int | None
    gpu_buffers: tuple[tuple[str, int], ...]  # model buffers on a GPU device: (name, bytes)

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for name, _size in self.gpu_buffers))

    def to_dict(self) -> dict[str, Any]:
        return {
            "layers": self.layers,
            "layers_total": self.layers_total,
            "gpu_buffers": dict(self.gpu_buffers),
            "devices": list(self.devices),
        }


def parse_offload(load_log: str, buffers: BufferSizes) -> Offload:
    found = _OFFLOADED.search(load_log)
    return Offload(
        layers=int(found["layers"]) if found else None,
        layers_total=int(found["total"]) if found else None,
        gpu_buffers=tuple((name, size) for name, size in buffers.model_buffers if is_gpu_buffer(name)),
    )


def needs_gpu_proof(role: str, simulated: bool, n_gpu_layers: int) -> bool:
    """A GPU worker (chat or embeddings) on a real device with layers planned on it must show them there."""
    return role in ("gpu", "gpu-embed") and not simulated and n_gpu_layers != 0


def refusal_before_start(listing: DeviceListing) -> str | None:
    """Why a GPU worker must not start with this build (None: the build lists a GPU)."""
    if listing.gpus:
        return None
    # A GPU backend that finds no usable device lists none either (ggml-vulkan skips CPU-type devices such
    # as Mesa's lavapipe unless GGML_VK_VISIBLE_DEVICES names them).
    return (
        f"{no_gpu_backend_reason()} (`llama-server --list-devices` lists no GPU device; with a GPU build, "
        "its backend found no usable device)"
    )


def failure_after_load(offload: Offload, n_gpu_layers: int) -> str | None:
    """Why a loaded GPU worker is not on a GPU (None: its layers and weights are on one)."""
    if offload.layers is None:
        return f"{no_gpu_backend_reason()} (llama.cpp printed no 'offloaded N/M layers to GPU' line)"
    assert offload.layers_total is not None
    expected = offload.layers_total if n_gpu_layers < 0 else min(n_gpu_layers, offload.layers_total)
    if offload.layers < max(expected, 1):
        return (
            f"llama.cpp offloaded {offload.layers}/{offload.layers_total} layers to GPU, "
            f"{expected} were planned: the GPU worker would run on the CPU"
        )
    if not offload.gpu_buffers:
        return (
            f"llama.cpp offloaded {offload.layers}/{offload.layers_total} layers, but printed no model "
            "buffer on a GPU device (only host buffers): the GPU worker would run on the CPU"
        )
    return None
