"""What the planner is asked and what it answers: the request, the compute buffer's key, the plan.

A plan's parts add up to its device's total (PLAN_PARTS). The sizes come from tray_app.budget.footprint, the
search from tray_app.budget.fit, the choices and their words from tray_app.budget.planner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from tray_app.budget import speed
from tray_app.budget.experts import ExpertSplit
from tray_app.budget.placement import Candidate

CacheType = Literal["f16", "q8_0", "q4_0"]
Verdict = Literal["gpu", "split", "cpu"]


class PlanError(ValueError):
    """The request cannot be planned as asked (e.g. a quantised V cache without flash attention)."""


@dataclass(frozen=True)
class PlanRequest:
    n_ctx: int | None = None  # total over all sequences; None: the largest that fits
    max_ctx: int = 8192
    n_parallel: int = 1
    cache_type_k: CacheType = "f16"
    cache_type_v: CacheType = "f16"
    flash_attn: bool = False
    n_ubatch: int = 512
    reserve_percent: float = 10.0
    reserve_min_bytes: int = 256 * 1024**2
    # With no context asked for: keep all layers on the GPU only if at least this much context fits with them;
    # below it, offloading fewer layers and keeping a useful context is the better trade.
    min_ctx: int = 2048
    embeddings: bool = False  # planned for an embeddings worker (its outputs are every token's, see below)
    # Memory bandwidths in bytes per second, for the speed estimate that picks between two splits.
    gpu_bandwidth: float = speed.GPU_BANDWIDTH
    cpu_bandwidth: float = speed.CPU_BANDWIDTH


@dataclass(frozen=True)
class ComputeSettings:
    """What the compute buffer depends on, for a given model: the key of a measurement."""

    n_ctx: int
    n_parallel: int
    cache_type_k: str
    cache_type_v: str
    flash_attn: bool
    n_ubatch: int
    embeddings: bool = False  # an embeddings worker: every token of a batch is an output, not one per slot


MeasuredCompute = Callable[[ComputeSettings], int | None]


# The parts of a plan that add up to its device's total (weights+kv+compute+reserve+other+free = total).
PLAN_PARTS = ("weights_bytes", "kv_bytes", "compute_bytes", "reserve_bytes", "other_bytes", "free_bytes")


@dataclass(frozen=True)
class Plan:
    verdict: Verdict
    reason: str
    fits: bool  # the plan keeps the reserve intact
    n_gpu_layers: int
    n_layers: int  # offloadable layers: repeating blocks + the output layer
    n_ctx: int
    n_parallel: int
    n_ctx_per_seq: int
    weights_bytes: int  # on this device
    kv_bytes: int  # on this device
    compute_bytes: int  # on this device
    output_bytes: int  # logits buffer: host memory, so counted in a RAM plan's free bytes, not a GPU's
    reserve_bytes: int
    other_bytes: int
    free_bytes: int  # left over after everything above; weights+kv+compute+reserve+other+free = total
    total_bytes: int
    simulated: bool
    device_name: str
    device_kind: str
    cache_type_k: str
    cache_type_v: str
    flash_attn: bool
    n_ubatch: int
    compute_source: Literal["estimate", "measured"]
    host_weights_bytes: int  # weights left in system RAM (the CPU's share of a split, or all of them)
    host_kv_bytes: int  # KV cache of the layers left on the CPU
    n_cpu_moe: int = 0  # the routed experts of the first N blocks stay in RAM (llama-server --n-cpu-moe N)
    cpu_expert_tensors: tuple[str, ...] = ()  # and these expert tensors of block n_cpu_moe (`-ot ...=CPU`)
    cpu_expert_bytes: int = 0  # those experts' bytes (part of host_weights_bytes)
    # Estimated generation ceiling: the bytes a token reads on each device against its bandwidth.
    tokens_per_second: float = 0.0
    gpu_read_bytes: int = 0
    cpu_read_bytes: int = 0
    gpu_bandwidth: float = speed.GPU_BANDWIDTH  # what the estimate assumed, bytes per second
    cpu_bandwidth: float = speed.CPU_BANDWIDTH
    candidates: tuple[Candidate, ...] = ()  # the splits weighed against each other (a MoE model's)
    # A RAM plan's prompt cache (llama-server --cache-ram): prompts kept after their slot is reused, what
    # the CPU mirror fills. Part of free_bytes: an upper bound llama-server fills as prompts are cached.
    prompt_cache_bytes: int = 0

    @property
    def whole_on_gpu(self) -> bool:
        """Every weight on the GPU: all layers, no experts left in RAM."""
        return self.n_gpu_layers >= self.n_layers and not self.expert_split

    @property
    def expert_split(self) -> ExpertSplit:
        return ExpertSplit(self.n_cpu_moe, self.cpu_expert_tensors)

    @property
    def used_bytes(self) -> int:
        """What this plan puts on its device: weights+kv+compute+reserve+other+free = total on a GPU; a RAM
        plan also holds the (host) logits buffer."""
        output = self.output_bytes if self.device_kind == "ram" else 0
        return self.weights_bytes + self.kv_bytes + self.compute_bytes + output

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["candidates"] = list(data["candidates"])  # as JSON gives it back
        return data
