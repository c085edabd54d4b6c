"""Generation speed of a placement, estimated from memory traffic: each generated token reads the weights it
uses and its sequence's KV cache once, on the device that holds them, at that device's memory bandwidth.

Generating one token is memory-bound on every device a home server has, so the time per token is close to
Σ bytes read on a device / its bandwidth (the devices take turns, layer after layer). It is a ceiling, not a
forecast: a small model on a few cores is compute-bound well below it. What it ranks well is two placements of
the same model, which is what it is for: a Mixture-of-Experts token reads only the experts it is routed to
(expert_used_count of expert_count), so experts are the cheapest bytes to leave on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from tray_app.budget.experts import (
    NO_SPLIT,
    ExpertSplit,
    expert_bytes,
    experts_in_ram,
    offloaded_blocks,
    output_offloaded,
)
from tray_app.budget.model_info import ModelInfo

GB = 1000**3
# Defaults when none is configured: a mid-range card's VRAM (RTX 3060 360 GB/s, RTX 4070 504 GB/s) and
# dual-channel DDR4-3200 (51 GB/s peak; DDR5 and more channels give more).
GPU_BANDWIDTH = 400 * GB
CPU_BANDWIDTH = 50 * GB


@dataclass(frozen=True)
class Reads:
    """Bytes one generated token reads on each device."""

    gpu_bytes: int
    cpu_bytes: int

    def tokens_per_second(self, gpu_bandwidth: float, cpu_bandwidth: float) -> float:
        seconds = self.gpu_bytes / gpu_bandwidth + self.cpu_bytes / cpu_bandwidth
        return 1 / seconds if seconds > 0 else 0.0


def reads_per_token(
    model: ModelInfo,
    n_gpu_layers: int,
    experts: ExpertSplit,
    kv_gpu_bytes: int,
    kv_cpu_bytes: int,
    n_parallel: int,
) -> Reads:
    """What a token reads where, for `-ngl n_gpu_layers` and an expert split (n_gpu_layers 0: all in RAM).

    Weights: dense tensors whole; routed experts by the share a token is routed to (routing assumed even);
    the output layer whole; the input embedding one row (left out). KV cache: one sequence's, half full on
    average over its life (the caches given are over all `n_parallel` sequences).
    """
    gpu = cpu = 0
    share = model.active_expert_share
    on_gpu = offloaded_blocks(model, n_gpu_layers)
    for layer in range(model.n_layers):
        routed = expert_bytes(model, layer)
        dense = model.layer_bytes[layer] - routed
        if layer in on_gpu:
            in_ram = experts_in_ram(model, layer, experts)
            gpu += dense + round((routed - in_ram) * share)
            cpu += round(in_ram * share)
        else:
            cpu += dense + round(routed * share)
    if output_offloaded(n_gpu_layers):
        gpu += model.output_layer_bytes
    else:
        cpu += model.output_layer_bytes
    per_sequence = 2 * max(n_parallel, 1)
    return Reads(gpu + kv_gpu_bytes // per_sequence, cpu + kv_cpu_bytes // per_sequence)


def active_weights_bytes(model: ModelInfo) -> int:
    """The weights one token reads wherever they are: a MoE model's active parameters, in bytes."""
    return reads_per_token(model, 0, NO_SPLIT, 0, 0, 1).cpu_bytes
