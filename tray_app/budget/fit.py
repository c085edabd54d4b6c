"""What fits on a device: a model and a request against its memory, and the searches over layers, context,
slots and a MoE model's expert split. The planner (tray_app.budget.planner) chooses among what fits here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from tray_app.budget import speed
from tray_app.budget.device import DeviceMemory
from tray_app.budget.experts import (
    NO_SPLIT,
    ExpertSplit,
    experts_kept_on_cpu,
    offloaded_blocks,
    partial_splits,
)
from tray_app.budget.footprint import (
    CACHE_TYPE_BLOCKS,
    CTX_PAD,
    estimate_compute_bytes,
    gpu_weights_bytes,
    host_weights_bytes,
    kv_cache_bytes,
    output_buffer_bytes,
    reserve_bytes,
    split_copy_bytes,
)
from tray_app.budget.model_info import ModelInfo
from tray_app.budget.plan import ComputeSettings, MeasuredCompute, Plan, PlanError, PlanRequest, Verdict


def _gpu_blocks(model: ModelInfo, n_gpu_layers: int) -> range:
    return offloaded_blocks(model, n_gpu_layers)


@dataclass(frozen=True)
class Budget:
    """One device, model and request: what a split needs, whether it fits, and the searches."""

    device: DeviceMemory
    model: ModelInfo
    request: PlanRequest
    measured: MeasuredCompute | None
    reserve: int
    usable: int  # total - others - reserve
    host: bool = False  # planning system RAM: every weight and cache row lives there
    _computed: dict[tuple[int, int], tuple[int, Literal["estimate", "measured"]]] = field(
        default_factory=dict
    )

    def weights(self, n_gpu_layers: int, experts: ExpertSplit = NO_SPLIT) -> int:
        if self.host:
            return self.model.weights_bytes if n_gpu_layers else 0
        return gpu_weights_bytes(self.model, n_gpu_layers, experts)

    def split_copy(self, n_gpu_layers: int, n_ctx: int, n_parallel: int) -> int:
        """What a layer split adds to the compute buffer (blocks left in RAM); nothing for a whole model."""
        if self.host or not 0 < n_gpu_layers <= self.model.n_layers:
            return 0
        return split_copy_bytes(self.model, self._settings(n_ctx, n_parallel))

    def compute(self, n_ctx: int, n_parallel: int) -> tuple[int, Literal["estimate", "measured"]]:
        if (n_ctx, n_parallel) not in self._computed:
            self._computed[n_ctx, n_parallel] = self._compute(n_ctx, n_parallel)
        return self._computed[n_ctx, n_parallel]

    def _settings(self, n_ctx: int, n_parallel: int) -> ComputeSettings:
        return ComputeSettings(
            n_ctx=n_ctx,
            n_parallel=n_parallel,
            cache_type_k=self.request.cache_type_k,
            cache_type_v=self.request.cache_type_v,
            flash_attn=self.request.flash_attn,
            n_ubatch=self.request.n_ubatch,
            embeddings=self.request.embeddings,
        )

    def _compute(self, n_ctx: int, n_parallel: int) -> tuple[int, Literal["estimate", "measured"]]:
        settings = self._settings(n_ctx, n_parallel)
        found = self.measured(settings) if self.measured else None
        if found is not None:
            return found, "measured"
        return estimate_compute_bytes(self.model, settings), "estimate"

    def output(self, n_parallel: int) -> int:
        # The logits buffer is host memory: it counts against RAM, never against a GPU.
        return output_buffer_bytes(self.model, n_parallel) if self.host else 0

    def need(self, n_gpu_layers: int, n_ctx: int, n_parallel: int, experts: ExpertSplit = NO_SPLIT) -> int:
        if n_gpu_layers == 0:
            return 0
        kv = kv_cache_bytes(
            self.model, n_ctx, self.request, _gpu_blocks(self.model, n_gpu_layers), n_parallel
        )
        compute = self.compute(n_ctx, n_parallel)[0] + self.split_copy(n_gpu_layers, n_ctx, n_parallel)
        return self.weights(n_gpu_layers, experts) + kv + compute + self.output(n_parallel)

    def fits(self, n_gpu_layers: int, n_ctx: int, n_parallel: int, experts: ExpertSplit = NO_SPLIT) -> bool:
        return self.need(n_gpu_layers, n_ctx, n_parallel, experts) <= self.usable

    def context_cap(self, n_parallel: int) -> int:
        return min(self.request.max_ctx, self.model.n_ctx_train * n_parallel)

    def largest_ctx(
        self, n_gpu_layers: int, n_parallel: int, floor: int, experts: ExpertSplit = NO_SPLIT
    ) -> int | None:
        """The largest padded context (at least `floor`) at which these layers fit, or None."""
        step = CTX_PAD * n_parallel
        n_ctx = self.context_cap(n_parallel) // step * step
        while n_ctx >= max(floor, step):
            if self.fits(n_gpu_layers, n_ctx, n_parallel, experts):
                return n_ctx
            n_ctx -= step
        return None

    def fewest_experts_in_ram(self, n_ctx: int, n_parallel: int) -> ExpertSplit | None:
        """With every layer on the GPU, the fewest expert bytes that must stay in RAM for the rest to fit
        (dense-first): the fewest whole blocks, then as many single tensors of the last of them back on the
        GPU as fit. None for a dense model, or when the dense part, KV cache and compute do not fit."""
        if not self.model.is_moe:
            return None
        full = self.model.n_layers + 1
        for blocks in range(1, self.model.n_layers + 1):
            if self.fits(full, n_ctx, n_parallel, ExpertSplit(blocks)):
                fewer = (
                    split
                    for split in partial_splits(self.model, blocks)
                    if self.fits(full, n_ctx, n_parallel, split)
                )
                return next(fewer, ExpertSplit(blocks))
        return None

    def largest_layers(self, n_ctx: int, n_parallel: int) -> int:
        for n_gpu_layers in range(self.model.n_layers, 0, -1):  # all but one block; 1: the output layer alone
            if self.fits(n_gpu_layers, n_ctx, n_parallel):
                return n_gpu_layers
        return 0

    def reads(
        self, n_gpu_layers: int, experts: ExpertSplit, kv: int, host_kv: int, n_parallel: int
    ) -> speed.Reads:
        if self.host:  # the whole model and its cache in RAM
            return speed.reads_per_token(self.model, 0, NO_SPLIT, 0, kv, n_parallel)
        return speed.reads_per_token(self.model, n_gpu_layers, experts, kv, host_kv, n_parallel)

    def reads_at(self, n_gpu_layers: int, n_ctx: int, n_parallel: int, experts: ExpertSplit) -> speed.Reads:
        """What a token of a placement reads where at a context (to weigh two placements at the same one)."""
        kv, host_kv = self.kv_sides(n_gpu_layers, n_ctx, n_parallel)
        return self.reads(n_gpu_layers, experts, kv, host_kv, n_parallel)

    def kv_sides(self, n_gpu_layers: int, n_ctx: int, n_parallel: int) -> tuple[int, int]:
        """The KV cache on the GPU and in RAM."""
        on_gpu = _gpu_blocks(self.model, n_gpu_layers)
        kv = kv_cache_bytes(self.model, n_ctx, self.request, on_gpu, n_parallel) if n_gpu_layers else 0
        return kv, kv_cache_bytes(self.model, n_ctx, self.request, None, n_parallel) - kv

    def plan(
        self,
        verdict: Verdict,
        n_gpu_layers: int,
        n_ctx: int,
        n_parallel: int,
        reason: str,
        experts: ExpertSplit = NO_SPLIT,
    ) -> Plan:
        model, request, device = self.model, self.request, self.device
        kv, host_kv = self.kv_sides(n_gpu_layers, n_ctx, n_parallel)
        compute, source = self.compute(n_ctx, n_parallel) if n_gpu_layers else (0, "estimate")
        compute += self.split_copy(n_gpu_layers, n_ctx, n_parallel)
        weights = self.weights(n_gpu_layers, experts)
        other = min(device.used_by_others_bytes, device.total_bytes)
        reserve = min(self.reserve, device.total_bytes - other)
        used = weights + kv + compute + (self.output(n_parallel) if n_gpu_layers else 0)
        placed = Plan(
            verdict=verdict,
            reason=reason,
            fits=used <= self.usable or n_gpu_layers == 0,
            n_gpu_layers=0 if self.host else n_gpu_layers,
            n_layers=model.n_layers + 1,
            n_ctx=n_ctx,
            n_parallel=n_parallel,
            n_ctx_per_seq=n_ctx // n_parallel,
            weights_bytes=weights,
            kv_bytes=kv,
            compute_bytes=compute,
            output_bytes=output_buffer_bytes(model, n_parallel),
            reserve_bytes=reserve,
            other_bytes=other,
            free_bytes=max(0, device.total_bytes - other - reserve - used),
            total_bytes=device.total_bytes,
            simulated=device.simulated,
            device_name=device.name,
            device_kind=device.kind,
            cache_type_k=request.cache_type_k,
            cache_type_v=request.cache_type_v,
            flash_attn=request.flash_attn,
            n_ubatch=request.n_ubatch,
            compute_source=source,
            host_weights_bytes=0 if self.host else host_weights_bytes(model, n_gpu_layers, experts),
            host_kv_bytes=host_kv,
            n_cpu_moe=experts.blocks,
            cpu_expert_tensors=experts.partial,
            cpu_expert_bytes=0 if self.host else experts_kept_on_cpu(model, n_gpu_layers, experts),
        )
        return self._with_speed(placed, self.reads(n_gpu_layers, experts, kv, host_kv, n_parallel))

    def _with_speed(self, plan: Plan, reads: speed.Reads) -> Plan:
        """The plan with its estimated generation ceiling: what a token reads on each device against the
        bandwidths the request assumes."""
        gpu_bandwidth, cpu_bandwidth = self.request.gpu_bandwidth, self.request.cpu_bandwidth
        return replace(
            plan,
            tokens_per_second=reads.tokens_per_second(gpu_bandwidth, cpu_bandwidth),
            gpu_read_bytes=reads.gpu_bytes,
            cpu_read_bytes=reads.cpu_bytes,
            gpu_bandwidth=gpu_bandwidth,
            cpu_bandwidth=cpu_bandwidth,
        )


def _check_request(request: PlanRequest) -> None:
    for name, cache_type in (("K", request.cache_type_k), ("V", request.cache_type_v)):
        if cache_type not in CACHE_TYPE_BLOCKS:
            raise PlanError(
                f"unknown {name} cache type {cache_type!r}; use one of {', '.join(CACHE_TYPE_BLOCKS)}"
            )
    if request.cache_type_v != "f16" and not request.flash_attn:
        raise PlanError(
            f"a quantised V cache ({request.cache_type_v}) needs flash attention: llama.cpp refuses it "
            "otherwise; enable flash attention or use f16 for V"
        )
    if request.n_parallel < 1:
        raise PlanError(f"n_parallel must be at least 1, got {request.n_parallel}")
    if request.n_ctx is not None and request.n_ctx < 1:
        raise PlanError(f"n_ctx must be positive, got {request.n_ctx}")
    if request.n_ubatch < 1:
        raise PlanError(f"n_ubatch must be positive, got {request.n_ubatch}")


def budget_for(
    device: DeviceMemory,
    model: ModelInfo,
    request: PlanRequest,
    measured: MeasuredCompute | None,
    host: bool = False,
) -> Budget:
    _check_request(request)
    reserve = reserve_bytes(device.total_bytes, request.reserve_percent, request.reserve_min_bytes)
    usable = device.total_bytes - device.used_by_others_bytes - reserve
    return Budget(device, model, request, measured, reserve, usable, host)
