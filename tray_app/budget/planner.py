"""The VRAM (and RAM) budget planner: pure functions over device memory, model info and a request; no I/O.

What a llama.cpp worker puts on a device: the weights of the layers it offloads, their KV cache, and a
compute buffer (the graph's workspace). Around that sit a reserve we promise never to spend and whatever
other processes already use. The planner picks the layer split, the context and the concurrency so that
the reserve stays intact, and says why in words.

Layer counting follows llama.cpp: a model with N repeating blocks has N + 1 offloadable layers, the last being
the output layer (output norm and output matrix), so `n_gpu_layers == n_layers` means everything on the GPU.

A Mixture-of-Experts model that does not fit whole has a second way to split: every layer on the GPU but the
routed experts of the first blocks (`--n-cpu-moe`, see tray_app.budget.experts). Both are planned, and the
faster by estimated memory traffic is chosen (tray_app.budget.placement).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from tray_app.budget import placement, speed
from tray_app.budget.device import DeviceMemory
from tray_app.budget.experts import expert_split_words, experts_kept_on_cpu, offloaded_blocks
from tray_app.budget.model_info import ModelInfo
from tray_app.budget.placement import Candidate
from tray_app.sizes import format_size

CacheType = Literal["f16", "q8_0", "q4_0"]
Verdict = Literal["gpu", "split", "cpu"]

# Bytes per block and elements per block of each KV cache type (ggml's type sizes).
CACHE_TYPE_BLOCKS: dict[str, tuple[int, int]] = {"f16": (2, 1), "q8_0": (34, 32), "q4_0": (18, 32)}
# llama.cpp rounds the context (and each sequence's share of it) up to a multiple of this.
CTX_PAD = 256
FLOAT_BYTES = 4
F16_BYTES = 2
# ggml's allocator packs the graph's tensors with some fragmentation: measured 0-4 % above the peak tensors.
COMPUTE_MARGIN = 1.05


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
        return self.n_gpu_layers >= self.n_layers and self.n_cpu_moe == 0

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


# ---------------------------------------------------------------------------------------------- sizes


def cache_row_bytes(cache_type: str, n_elements: int) -> int:
    """Bytes of one cache row of `n_elements` values (ggml_row_size)."""
    try:
        block_bytes, block_elements = CACHE_TYPE_BLOCKS[cache_type]
    except KeyError:
        raise PlanError(
            f"unknown cache type {cache_type!r}; use one of {', '.join(CACHE_TYPE_BLOCKS)}"
        ) from None
    return -(-n_elements // block_elements) * block_bytes


def padded_context(n_ctx: int, n_parallel: int) -> tuple[int, int]:
    """(n_ctx, n_ctx_per_seq) as llama.cpp sets them: the total padded to 256, each sequence's share padded to
    256, the total then made the exact multiple (non-unified cache: one stream per sequence)."""
    total = -(-max(n_ctx, 1) // CTX_PAD) * CTX_PAD
    per_seq = -(-(total // n_parallel) // CTX_PAD) * CTX_PAD
    return per_seq * n_parallel, per_seq


def kv_cache_bytes(
    model: ModelInfo,
    n_ctx: int,
    request: PlanRequest,
    layers: range | None = None,
    n_parallel: int | None = None,
) -> int:
    """Σ over layers of cells × (row of K + row of V): exactly what llama.cpp allocates for these layers.

    A layer has n_ctx cells, except a sliding-window layer (llama_kv_cache_iswa): each of the `n_parallel`
    sequences (default: the request's) keeps its window plus one ubatch, padded to 256, at most its own
    context. That is llama-server's cache as the workers run it (no --swa-full, no --kv-unified).
    """
    layers = layers if layers is not None else range(model.n_layers)
    n_parallel = n_parallel or request.n_parallel
    swa_cells = n_parallel * swa_window_cells(model, n_ctx // n_parallel, request.n_ubatch)
    # Without flash attention V is stored transposed, every layer padded to the widest V (llama.cpp does so).
    widest_v = max(model.n_head_kv, default=0) * model.head_dim_v
    total = 0
    for layer in layers:
        n_head_kv = model.n_head_kv[layer]
        if n_head_kv == 0:
            continue  # a layer without attention has no cache
        k_row = cache_row_bytes(request.cache_type_k, n_head_kv * model.head_dim_k)
        v_width = n_head_kv * model.head_dim_v if request.flash_attn else widest_v
        cells = swa_cells if model.swa_layers and model.swa_layers[layer] else n_ctx
        total += cells * (k_row + cache_row_bytes(request.cache_type_v, v_width))
    return total


def swa_window_cells(model: ModelInfo, n_ctx_seq: int, n_ubatch: int) -> int:
    """The cells a sliding-window layer keeps per sequence: its window plus one ubatch, padded to 256, at
    most the sequence's context (0 for a model without such layers)."""
    if not model.swa_layers:
        return 0
    return -(-min(n_ctx_seq, model.n_swa + n_ubatch) // CTX_PAD) * CTX_PAD


def output_buffer_bytes(model: ModelInfo, n_parallel: int) -> int:
    """The logits buffer llama.cpp reserves at start: one row of n_vocab floats per sequence."""
    return model.n_vocab * n_parallel * FLOAT_BYTES


def estimate_compute_bytes(model: ModelInfo, settings: ComputeSettings) -> int:
    """An estimate of llama.cpp's compute buffer (the graph's peak workspace), from the worst case it
    reserves: one ubatch of prompt tokens attending to a whole sequence's cache.

    Two peaks compete. The logits at the end of the graph: a chat worker's llama-server reserves one output
    row per slot (`n_outputs_max`, see server_output_limits in tools/server), an embeddings worker one per
    token of the batch. And the attention: the residual, feed-forward (gate, up and their product) and
    attention-output rows of every ubatch token, with the mask over the sequence's cache (f16 with flash
    attention, the scores staying in tiles; without it the K·Q scores, one n_ctx_seq × ubatch float matrix
    per head, and a float mask). A model with sliding-window layers has a second mask, over its window.
    Checked against what llama-server reports at load (SmolLM2 and Gemma 3 at 1 and 4 slots, 2k to 32k
    tokens): never under it; the allocator's fragmentation is covered by a small margin.
    """
    n_tokens = min(settings.n_ctx, settings.n_ubatch)
    n_ctx_seq = settings.n_ctx // settings.n_parallel
    n_outputs = n_tokens if settings.embeddings else min(settings.n_parallel, n_tokens)
    logits = (n_outputs * model.n_vocab + n_tokens * 2 * model.n_embd) * FLOAT_BYTES
    rows = n_tokens * (2 * model.n_embd + 3 * model.n_ff + 2 * model.n_head * model.head_dim_v) * FLOAT_BYTES
    if settings.flash_attn:
        window = swa_window_cells(model, n_ctx_seq, settings.n_ubatch)
        attention = rows + (n_ctx_seq + window) * n_tokens * F16_BYTES
    else:
        attention = rows + n_ctx_seq * n_tokens * (model.n_head + 1) * FLOAT_BYTES
    return int(max(logits, attention) * COMPUTE_MARGIN)


def reserve_bytes(total_bytes: int, percent: float, minimum: int) -> int:
    """The larger of a share of the device and an absolute floor."""
    return max(int(total_bytes * percent / 100), minimum)


def gpu_weights_bytes(model: ModelInfo, n_gpu_layers: int, n_cpu_moe: int = 0) -> int:
    """Weights llama.cpp puts on the GPU for `n_gpu_layers`: the last blocks, then the output layer; less
    the experts `--n-cpu-moe n_cpu_moe` keeps in RAM."""
    blocks = min(n_gpu_layers, model.n_layers)
    weights = sum(model.layer_bytes[model.n_layers - blocks :]) if blocks else 0
    if n_gpu_layers > model.n_layers:
        weights += model.output_layer_bytes
    return weights - experts_kept_on_cpu(model, n_gpu_layers, n_cpu_moe)


def host_weights_bytes(model: ModelInfo, n_gpu_layers: int, n_cpu_moe: int = 0) -> int:
    """Weights that stay in system RAM: the blocks not offloaded and the tensors outside the blocks, except
    the output layer's own tensors once it is offloaded (a tied embedding stays: its copy went to the GPU),
    and the experts `--n-cpu-moe n_cpu_moe` keeps there."""
    blocks = min(n_gpu_layers, model.n_layers)
    host = sum(model.layer_bytes[: model.n_layers - blocks]) + model.non_layer_bytes
    if n_gpu_layers > model.n_layers:
        host -= model.output_layer_bytes - (model.input_bytes if model.tied_embeddings else 0)
    return host + experts_kept_on_cpu(model, n_gpu_layers, n_cpu_moe)


def _gpu_blocks(model: ModelInfo, n_gpu_layers: int) -> range:
    return offloaded_blocks(model, n_gpu_layers)


# ---------------------------------------------------------------------------------------------- search


@dataclass(frozen=True)
class _Budget:
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

    def weights(self, n_gpu_layers: int, n_cpu_moe: int = 0) -> int:
        if self.host:
            return self.model.weights_bytes if n_gpu_layers else 0
        return gpu_weights_bytes(self.model, n_gpu_layers, n_cpu_moe)

    def offload_copy(self, n_cpu_moe: int) -> int:
        """GPU compute memory an expert split adds: ggml's scheduler runs a prompt batch's expert matmul on
        the GPU even when the experts sit in RAM (op offload, batches of 32 tokens and more), copying the
        expert tensor into the GPU's compute buffer; one at a time, the largest counts."""
        return self.model.expert_tensor_max_bytes if n_cpu_moe and not self.host else 0

    def compute(self, n_ctx: int, n_parallel: int) -> tuple[int, Literal["estimate", "measured"]]:
        if (n_ctx, n_parallel) not in self._computed:
            self._computed[n_ctx, n_parallel] = self._compute(n_ctx, n_parallel)
        return self._computed[n_ctx, n_parallel]

    def _compute(self, n_ctx: int, n_parallel: int) -> tuple[int, Literal["estimate", "measured"]]:
        settings = ComputeSettings(
            n_ctx=n_ctx,
            n_parallel=n_parallel,
            cache_type_k=self.request.cache_type_k,
            cache_type_v=self.request.cache_type_v,
            flash_attn=self.request.flash_attn,
            n_ubatch=self.request.n_ubatch,
            embeddings=self.request.embeddings,
        )
        found = self.measured(settings) if self.measured else None
        if found is not None:
            return found, "measured"
        return estimate_compute_bytes(self.model, settings), "estimate"

    def output(self, n_parallel: int) -> int:
        # The logits buffer is host memory: it counts against RAM, never against a GPU.
        return output_buffer_bytes(self.model, n_parallel) if self.host else 0

    def need(self, n_gpu_layers: int, n_ctx: int, n_parallel: int, n_cpu_moe: int = 0) -> int:
        if n_gpu_layers == 0:
            return 0
        kv = kv_cache_bytes(
            self.model, n_ctx, self.request, _gpu_blocks(self.model, n_gpu_layers), n_parallel
        )
        compute = self.compute(n_ctx, n_parallel)[0] + self.offload_copy(n_cpu_moe)
        return self.weights(n_gpu_layers, n_cpu_moe) + kv + compute + self.output(n_parallel)

    def fits(self, n_gpu_layers: int, n_ctx: int, n_parallel: int, n_cpu_moe: int = 0) -> bool:
        return self.need(n_gpu_layers, n_ctx, n_parallel, n_cpu_moe) <= self.usable

    def context_cap(self, n_parallel: int) -> int:
        return min(self.request.max_ctx, self.model.n_ctx_train * n_parallel)

    def largest_ctx(self, n_gpu_layers: int, n_parallel: int, floor: int, n_cpu_moe: int = 0) -> int | None:
        """The largest padded context (at least `floor`) at which these layers fit, or None."""
        step = CTX_PAD * n_parallel
        n_ctx = self.context_cap(n_parallel) // step * step
        while n_ctx >= max(floor, step):
            if self.fits(n_gpu_layers, n_ctx, n_parallel, n_cpu_moe):
                return n_ctx
            n_ctx -= step
        return None

    def fewest_cpu_moe(self, n_ctx: int, n_parallel: int) -> int | None:
        """With every layer on the GPU, the fewest blocks whose experts must stay in RAM for the rest to fit
        (dense-first); None for a dense model, or when the dense part, KV cache and compute do not fit."""
        if not self.model.is_moe:
            return None
        full = self.model.n_layers + 1
        for n_cpu_moe in range(1, self.model.n_layers + 1):
            if self.fits(full, n_ctx, n_parallel, n_cpu_moe):
                return n_cpu_moe
        return None

    def largest_layers(self, n_ctx: int, n_parallel: int) -> int:
        for n_gpu_layers in range(self.model.n_layers, 0, -1):  # n_layers blocks: all but the output layer
            if self.fits(n_gpu_layers, n_ctx, n_parallel):
                return n_gpu_layers
        return 0

    def reads(self, n_gpu_layers: int, n_cpu_moe: int, kv: int, host_kv: int, n_parallel: int) -> speed.Reads:
        if self.host:  # the whole model and its cache in RAM
            return speed.reads_per_token(self.model, 0, 0, 0, kv, n_parallel)
        return speed.reads_per_token(self.model, n_gpu_layers, n_cpu_moe, kv, host_kv, n_parallel)

    def plan(
        self,
        verdict: Verdict,
        n_gpu_layers: int,
        n_ctx: int,
        n_parallel: int,
        reason: str,
        n_cpu_moe: int = 0,
    ) -> Plan:
        model, request, device = self.model, self.request, self.device
        on_gpu = _gpu_blocks(model, n_gpu_layers)
        kv = kv_cache_bytes(model, n_ctx, request, on_gpu, n_parallel) if n_gpu_layers else 0
        host_kv = kv_cache_bytes(model, n_ctx, request, None, n_parallel) - kv
        compute, source = self.compute(n_ctx, n_parallel) if n_gpu_layers else (0, "estimate")
        compute += self.offload_copy(n_cpu_moe)
        weights = self.weights(n_gpu_layers, n_cpu_moe)
        other = min(device.used_by_others_bytes, device.total_bytes)
        reserve = min(self.reserve, device.total_bytes - other)
        used = weights + kv + compute + (self.output(n_parallel) if n_gpu_layers else 0)
        reads = self.reads(n_gpu_layers, n_cpu_moe, kv, host_kv, n_parallel)
        return Plan(
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
            host_weights_bytes=0 if self.host else host_weights_bytes(model, n_gpu_layers, n_cpu_moe),
            host_kv_bytes=host_kv,
            n_cpu_moe=n_cpu_moe,
            cpu_expert_bytes=0 if self.host else experts_kept_on_cpu(model, n_gpu_layers, n_cpu_moe),
            tokens_per_second=reads.tokens_per_second(request.gpu_bandwidth, request.cpu_bandwidth),
            gpu_read_bytes=reads.gpu_bytes,
            cpu_read_bytes=reads.cpu_bytes,
            gpu_bandwidth=request.gpu_bandwidth,
            cpu_bandwidth=request.cpu_bandwidth,
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


def _budget(
    device: DeviceMemory,
    model: ModelInfo,
    request: PlanRequest,
    measured: MeasuredCompute | None,
    host: bool = False,
) -> _Budget:
    _check_request(request)
    reserve = reserve_bytes(device.total_bytes, request.reserve_percent, request.reserve_min_bytes)
    usable = device.total_bytes - device.used_by_others_bytes - reserve
    return _Budget(device, model, request, measured, reserve, usable, host)


def _where(budget: _Budget) -> str:
    device = budget.device
    label = f"the {device.name}" + (
        " (simulated)" if device.simulated and "simulated" not in device.name else ""
    )
    usable, total = format_size(max(budget.usable, 0)), format_size(device.total_bytes)
    return (
        f"{label}: {usable} usable of {total} after the {format_size(budget.reserve)} reserve "
        f"and {format_size(device.used_by_others_bytes)} used by others"
    )


def _ctx_words(n_ctx: int, n_parallel: int) -> str:
    if n_parallel == 1:
        return f"n_ctx {n_ctx}"
    return f"n_ctx {n_ctx} ({n_parallel} sequences of {n_ctx // n_parallel})"


def _ctx_limit_words(budget: _Budget, n_ctx: int, n_parallel: int) -> str:
    request = budget.request
    if n_ctx + CTX_PAD * n_parallel <= budget.context_cap(n_parallel):
        return "context limited by memory"
    if budget.context_cap(n_parallel) == request.max_ctx:
        return f"context capped by max_ctx {request.max_ctx}"
    return f"context capped by the trained context {budget.model.n_ctx_train} per sequence"


def _no_gpu_plan(budget: _Budget) -> Plan:
    device = budget.device
    n_ctx, _ = padded_context(budget.request.n_ctx or budget.context_cap(1), 1)
    detail = f" ({device.reason})" if device.reason else ""
    reason = (
        f"no GPU to plan for{detail}: nothing goes on a GPU and the model runs on the CPU; "
        "use --simulate-vram SIZE (or device.simulate_vram) to plan for a GPU of that size"
    )
    return budget.plan("cpu", 0, n_ctx, 1, reason)


def _plan_requested(budget: _Budget, n_ctx_asked: int) -> Plan:
    n_parallel = budget.request.n_parallel
    n_ctx, _ = padded_context(n_ctx_asked, n_parallel)
    full = budget.model.n_layers + 1
    need_all = budget.need(full, n_ctx, n_parallel)
    if need_all <= budget.usable:
        reason = (
            f"all {full} layers fit at {_ctx_words(n_ctx, n_parallel)}, needing {format_size(need_all)} on "
        )
        return budget.plan("gpu", full, n_ctx, n_parallel, reason + _where(budget))
    layers = budget.largest_layers(n_ctx, n_parallel)
    context = _ctx_words(n_ctx, n_parallel)
    short = f"all {full} layers at {context} need {format_size(need_all)}, more than {_where(budget)}"
    if layers:
        reason = (
            f"{short}; {layers} of {full} layers fit on the GPU, the other {full - layers} run on the CPU"
        )
        return budget.plan("split", layers, n_ctx, n_parallel, reason)
    return budget.plan(
        "cpu", 0, n_ctx, n_parallel, f"{short}; not even one layer fits, so the model runs on the CPU"
    )


def _plan_largest(budget: _Budget) -> Plan:
    full = budget.model.n_layers + 1
    for n_parallel in range(budget.request.n_parallel, 0, -1):
        floor = min(budget.request.min_ctx, budget.context_cap(n_parallel))
        n_ctx = budget.largest_ctx(full, n_parallel, floor)
        if n_ctx is None:
            continue
        fewer = (
            ""
            if n_parallel == budget.request.n_parallel
            else f" (only {n_parallel} of {budget.request.n_parallel} sequences fit)"
        )
        reason = (
            f"all {full} layers fit at {_ctx_words(n_ctx, n_parallel)}{fewer}, "
            f"{_ctx_limit_words(budget, n_ctx, n_parallel)}, needing "
            f"{format_size(budget.need(full, n_ctx, n_parallel))} on {_where(budget)}"
        )
        return budget.plan("gpu", full, n_ctx, n_parallel, reason)
    n_parallel = budget.request.n_parallel
    target, _ = padded_context(min(budget.request.min_ctx, budget.context_cap(n_parallel)), n_parallel)
    layers = budget.largest_layers(target, n_parallel)
    short = f"not all {full} layers fit even at n_ctx {target} on {_where(budget)}"
    if not layers:
        return budget.plan(
            "cpu", 0, target, n_parallel, f"{short}; not even one layer fits, so the model runs on the CPU"
        )
    n_ctx = budget.largest_ctx(layers, n_parallel, target) or target
    reason = (
        f"{short}; {layers} of {full} layers fit on the GPU (the other {full - layers} run on the CPU) "
        f"at {_ctx_words(n_ctx, n_parallel)}, {_ctx_limit_words(budget, n_ctx, n_parallel)}"
    )
    return budget.plan("split", layers, n_ctx, n_parallel, reason)


def _expert_floor(budget: _Budget) -> int:
    """The context an expert split must hold: as asked, else the smallest a layer split settles for."""
    request = budget.request
    wanted = request.n_ctx or min(request.min_ctx, budget.context_cap(request.n_parallel))
    return padded_context(wanted, request.n_parallel)[0]


def _plan_experts(budget: _Budget) -> Plan | None:
    """Dense-first: every layer's dense part, the KV cache and compute on the GPU, then the experts of as many
    blocks as fit (the last ones: `--n-cpu-moe N` keeps the first N in RAM); None when even that does not fit.
    The context: as asked, else the largest that fits once the floor's split is set (as for a layer split)."""
    request, model = budget.request, budget.model
    full, n_parallel = model.n_layers + 1, request.n_parallel
    asked = request.n_ctx is not None
    floor = _expert_floor(budget)
    n_cpu_moe = budget.fewest_cpu_moe(floor, n_parallel)
    if n_cpu_moe is None:
        return None
    n_ctx = floor if asked else budget.largest_ctx(full, n_parallel, floor, n_cpu_moe) or floor
    limit = "as asked" if asked else _ctx_limit_words(budget, n_ctx, n_parallel)
    in_ram = expert_split_words(model, n_cpu_moe, experts_kept_on_cpu(model, full, n_cpu_moe))
    reason = (
        f"dense-first on {_where(budget)}: all {full} layers' dense tensors, the KV cache and compute at "
        f"{_ctx_words(n_ctx, n_parallel)} ({limit}) and {_gpu_experts_words(model.n_layers - n_cpu_moe)} "
        f"on the GPU; {in_ram} (--n-cpu-moe {n_cpu_moe})"
    )
    return budget.plan("split", full, n_ctx, n_parallel, reason, n_cpu_moe)


def _gpu_experts_words(n_blocks: int) -> str:
    if n_blocks == 0:
        return "no experts"
    return "the experts of the last block" if n_blocks == 1 else f"the experts of the last {n_blocks} blocks"


def _candidate(kind: placement.Kind, plan: Plan) -> Candidate:
    return Candidate(
        kind=kind,
        n_gpu_layers=plan.n_gpu_layers,
        n_layers=plan.n_layers,
        n_cpu_moe=plan.n_cpu_moe,
        n_ctx=plan.n_ctx,
        fits=plan.fits,
        gpu_read_bytes=plan.gpu_read_bytes,
        cpu_read_bytes=plan.cpu_read_bytes,
        tokens_per_second=plan.tokens_per_second,
    )


def _weigh_expert_split(budget: _Budget, layers: Plan) -> Plan:
    """A MoE model that does not fit whole: the layer split against the expert split, by estimated speed."""
    experts = _plan_experts(budget)
    if experts is None:
        floor, n_parallel = _expert_floor(budget), budget.request.n_parallel
        dense = budget.need(layers.n_layers, floor, n_parallel, budget.model.n_layers)
        why = (
            f"no expert split: every layer's dense tensors, the KV cache and compute alone need "
            f"{format_size(dense)} at {_ctx_words(floor, n_parallel)}"
        )
        return replace(layers, reason=f"{layers.reason}; {why}", candidates=(_candidate("layers", layers),))
    plans = (layers, experts)
    candidates = [_candidate("layers", layers), _candidate("experts", experts)]
    best, why = placement.choose(candidates)
    chosen = plans[best]
    weighed = tuple(replace(candidate, chosen=index == best) for index, candidate in enumerate(candidates))
    return replace(chosen, reason=f"{chosen.reason}; {why}", candidates=weighed)


def plan_gpu(
    device: DeviceMemory, model: ModelInfo, request: PlanRequest, measured: MeasuredCompute | None = None
) -> Plan:
    """Split the GPU: all layers if they fit, else the most that fit, else none; the largest context and
    concurrency (up to what was asked) that keep the reserve intact. A MoE model that does not fit whole
    is also planned as an expert split, and the faster of the two is chosen."""
    budget = _budget(device, model, request, measured)
    if not device.available:
        return _no_gpu_plan(budget)
    layers = _plan_requested(budget, request.n_ctx) if request.n_ctx is not None else _plan_largest(budget)
    if layers.verdict == "gpu" or not model.is_moe:
        return layers
    return _weigh_expert_split(budget, layers)


def plan_cpu(
    ram: DeviceMemory, model: ModelInfo, request: PlanRequest, measured: MeasuredCompute | None = None
) -> Plan:
    """Size the CPU worker against system RAM (its own reserve in the request): every layer in RAM, the
    largest context up to what was asked that keeps the reserve intact."""
    budget = _budget(ram, model, request, measured, host=True)
    full = model.n_layers + 1
    n_parallel = request.n_parallel
    if request.n_ctx is not None:
        n_ctx, _ = padded_context(request.n_ctx, n_parallel)
        fits = budget.fits(full, n_ctx, n_parallel)
        limit = "as asked"
    else:
        found = budget.largest_ctx(full, n_parallel, CTX_PAD * n_parallel)
        fits = found is not None
        n_ctx = found if found is not None else CTX_PAD * n_parallel
        limit = _ctx_limit_words(budget, n_ctx, n_parallel)
    need = format_size(budget.need(full, n_ctx, n_parallel))
    context = _ctx_words(n_ctx, n_parallel)
    if fits:
        reason = f"the CPU worker fits in RAM at {context} ({limit}), needing {need} of {_where(budget)}"
    else:
        reason = f"the CPU worker needs {need} at {context}, more than {_where(budget)}"
    plan = budget.plan("cpu", full, n_ctx, n_parallel, reason)
    if model.is_moe:
        reason += "; " + _active_words(model, plan)
    return replace(plan, fits=fits, reason=reason, prompt_cache_bytes=prompt_cache_bytes(plan))


# Prompts of a whole slot's context the CPU worker's prompt cache holds: the mirror's conversations.
PROMPT_CACHE_PROMPTS = 8
MIB = 1024**2


def prompt_cache_bytes(plan: Plan) -> int:
    """The CPU worker's prompt cache: room for PROMPT_CACHE_PROMPTS prompts as long as a slot's context
    (each token costs what it costs in the KV cache), at most half of what the plan leaves free; whole MiB,
    as llama-server takes it."""
    if plan.n_ctx <= 0:
        return 0
    per_token = (plan.kv_bytes + plan.host_kv_bytes) / plan.n_ctx
    wanted = int(per_token * plan.n_ctx_per_seq * PROMPT_CACHE_PROMPTS)
    return min(wanted, plan.free_bytes // 2) // MIB * MIB


def _active_words(model: ModelInfo, plan: Plan) -> str:
    """Why a MoE model suits the CPU: a token reads its active parameters only."""
    active = speed.active_weights_bytes(model)
    return (
        f"a MoE model: a token goes through {model.n_expert_used} of {model.n_expert} experts per layer, "
        f"reading {format_size(active)} of its {format_size(model.weights_bytes)} of weights (and "
        f"{format_size(plan.cpu_read_bytes - active)} of its sequence's cache): about "
        f"{plan.tokens_per_second:.0f} tokens/s at most"
    )
