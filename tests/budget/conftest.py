"""Fixtures for the planner tests: a hand-built model description for pure planning cases."""

from __future__ import annotations

import pytest

from tray_app.budget.device import DeviceMemory
from tray_app.budget.model_info import ModelInfo

MIB = 1024**2
GIB = 1024**3


def gpu(total: int, others: int = 0, *, simulated: bool = True) -> DeviceMemory:
    return DeviceMemory(
        name="test GPU",
        kind="simulated" if simulated else "nvidia",
        total_bytes=total,
        free_bytes=total - others,
        used_by_others_bytes=others,
        simulated=simulated,
    )


@pytest.fixture
def model_8b() -> ModelInfo:
    """Shaped like an 8B llama at 4-5 bits: 32 blocks of 200 MiB, GQA 32/8 heads of 128."""
    return ModelInfo(
        path="llama-8b.gguf",
        architecture="llama",
        n_layers=32,
        n_embd=4096,
        n_head=32,
        n_head_kv=(8,) * 32,
        head_dim_k=128,
        head_dim_v=128,
        n_ctx_train=131072,
        n_vocab=128256,
        n_ff=14336,
        file_bytes=32 * 200 * MIB + 2 * 260 * MIB + 1024,
        layer_bytes=(200 * MIB,) * 32,
        non_layer_bytes=2 * 260 * MIB,
        input_bytes=260 * MIB,
        output_layer_bytes=260 * MIB,
        tied_embeddings=False,
    )
