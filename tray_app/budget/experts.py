"""Where a Mixture-of-Experts model's expert tensors go under llama-server's `--n-cpu-moe N`.

`--n-cpu-moe N` adds one CPU override per block 0..N-1 for that block's routed expert tensors
(llm_add_n_cpu_ffn_overrides in common/common.h): the experts of the *first* N blocks stay in system RAM,
whatever `-ngl` offloads. `-ngl` offloads the *last* blocks, so the two meet from opposite ends: with every
layer offloaded, the GPU keeps the dense part of each block, the KV cache, and the experts of the last
n_layers - N blocks.
"""

from __future__ import annotations

from tray_app.budget.model_info import ModelInfo
from tray_app.sizes import format_size


def offloaded_blocks(model: ModelInfo, n_gpu_layers: int) -> range:
    """The blocks `-ngl n_gpu_layers` puts on the GPU: the last n_gpu_layers - 1 ones, the output layer
    taking the first of the count (llama.cpp's i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0))."""
    blocks = min(max(n_gpu_layers - 1, 0), model.n_layers)
    return range(model.n_layers - blocks, model.n_layers)


def output_offloaded(n_gpu_layers: int) -> bool:
    """Whether `-ngl n_gpu_layers` puts the output layer on the GPU: llama.cpp offloads it first, so any
    positive count does (it prints "offloading output layer to GPU")."""
    return n_gpu_layers > 0


def expert_bytes(model: ModelInfo, layer: int) -> int:
    return model.expert_layer_bytes[layer] if model.expert_layer_bytes else 0


def experts_kept_on_cpu(model: ModelInfo, n_gpu_layers: int, n_cpu_moe: int) -> int:
    """Bytes of expert tensors that `--n-cpu-moe` keeps in RAM although their block is offloaded."""
    on_gpu = offloaded_blocks(model, n_gpu_layers)
    return sum(expert_bytes(model, layer) for layer in range(on_gpu.start, min(n_cpu_moe, model.n_layers)))


def dense_bytes(model: ModelInfo) -> int:
    """Every weight but the routed experts: what an expert split must fit on the GPU first."""
    return model.weights_bytes - sum(model.expert_layer_bytes)


def expert_split_words(model: ModelInfo, n_cpu_moe: int, cpu_bytes: int) -> str:
    """The split in words, e.g. "experts of 6/24 layers on the CPU: 5.10 GiB in RAM"."""
    return f"experts of {n_cpu_moe}/{model.n_layers} layers on the CPU: {format_size(cpu_bytes)} in RAM"
