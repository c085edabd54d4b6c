"""The VRAM (and RAM) budget planner: pure functions over device memory, model info and a request; no I/O.

What a llama.cpp worker puts on a device: the weights of the layers it offloads, their KV cache, and a
compute buffer (the graph's workspace). Around that sit a reserve we promise never to spend and whatever
other processes already use. The planner picks the layer split, the context and the concurrency so that
the reserve stays intact, and says why in words.

The sizes are tray_app.budget.footprint's, what fits tray_app.budget.fit's, the types tray_app.budget.plan's.

A Mixture-of-Experts model that does not fit whole has a second way to split: every layer on the GPU but the
routed experts of the first blocks and single expert tensors of one more (`--n-cpu-moe`, `-ot`, see
tray_app.budget.experts). Both are planned, and the faster by estimated memory traffic is chosen
(tray_app.budget.placement).
"""

from __future__ import annotations

from dataclasses import replace

from tray_app.budget import placement, speed
from tray_app.budget.device import DeviceMemory
from tray_app.budget.experts import ExpertSplit, expert_split_words, experts_kept_on_cpu, split_flag_words
from tray_app.budget.fit import Budget, budget_for
from tray_app.budget.footprint import CTX_PAD, padded_context, prompt_cache_bytes
from tray_app.budget.model_info import ModelInfo
from tray_app.budget.placement import Candidate
from tray_app.budget.plan import MeasuredCompute, Plan, PlanRequest
from tray_app.contract.sizes import format_size


def _where(budget: Budget) -> str:
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


def _ctx_limit_words(budget: Budget, n_ctx: int, n_parallel: int) -> str:
    request = budget.request
    if n_ctx + CTX_PAD * n_parallel <= budget.context_cap(n_parallel):
        return "context limited by memory"
    if budget.context_cap(n_parallel) == request.max_ctx:
        return f"context capped by max_ctx {request.max_ctx}"
    return f"context capped by the trained context {budget.model.n_ctx_train} per sequence"


def _no_gpu_plan(budget: Budget) -> Plan:
    device = budget.device
    n_ctx, _ = padded_context(budget.request.n_ctx or budget.context_cap(1), 1)
    detail = f" ({device.reason})" if device.reason else ""
    reason = (
        f"no GPU to plan for{detail}: nothing goes on a GPU and the model runs on the CPU; "
        "use --simulate-vram SIZE (or device.simulate_vram) to plan for a GPU of that size"
    )
    return budget.plan("cpu", 0, n_ctx, 1, reason)


def _plan_requested(budget: Budget, n_ctx_asked: int) -> Plan:
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


def _plan_largest(budget: Budget) -> Plan:
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


def _expert_floor(budget: Budget) -> int:
    """The context an expert split must hold: as asked, else the smallest a layer split settles for."""
    request = budget.request
    wanted = request.n_ctx or min(request.min_ctx, budget.context_cap(request.n_parallel))
    return padded_context(wanted, request.n_parallel)[0]


def _plan_experts(budget: Budget) -> Plan | None:
    """Dense-first: every layer's dense part, the KV cache and compute on the GPU, then as many experts as
    fit (the last blocks': `--n-cpu-moe N` keeps the first N in RAM, `-ot` single tensors of block N); None
    when even that does not fit. The context: as asked, else the largest that fits once the floor's split is
    set (as for a layer split)."""
    request, model = budget.request, budget.model
    full, n_parallel = model.n_layers + 1, request.n_parallel
    asked = request.n_ctx is not None
    floor = _expert_floor(budget)
    experts = budget.fewest_experts_in_ram(floor, n_parallel)
    if experts is None:
        return None
    n_ctx = floor if asked else budget.largest_ctx(full, n_parallel, floor, experts) or floor
    limit = "as asked" if asked else _ctx_limit_words(budget, n_ctx, n_parallel)
    in_ram = expert_split_words(model, experts, experts_kept_on_cpu(model, full, experts))
    reason = (
        f"dense-first on {_where(budget)}: all {full} layers' dense tensors, the KV cache and compute at "
        f"{_ctx_words(n_ctx, n_parallel)} ({limit}) and {_gpu_experts_words(model.n_layers, experts)} "
        f"on the GPU; {in_ram} ({split_flag_words(experts)})"
    )
    return budget.plan("split", full, n_ctx, n_parallel, reason, experts)


def _gpu_experts_words(n_layers: int, experts: ExpertSplit) -> str:
    n_blocks = n_layers - experts.blocks - (1 if experts.partial else 0)
    whole = (
        "no experts"
        if n_blocks == 0
        else "the experts of the last block"
        if n_blocks == 1
        else f"the experts of the last {n_blocks} blocks"
    )
    return whole + (f" and some of block {experts.blocks}'s" if experts.partial else "")


def _candidate(kind: placement.Kind, plan: Plan, budget: Budget, speed_ctx: int) -> Candidate:
    """A plan as a candidate, its speed estimated at `speed_ctx` (the same for both candidates)."""
    reads = budget.reads_at(plan.n_gpu_layers, speed_ctx, plan.n_parallel, plan.expert_split)
    return Candidate(
        kind=kind,
        n_gpu_layers=plan.n_gpu_layers,
        n_layers=plan.n_layers,
        n_cpu_moe=plan.n_cpu_moe,
        cpu_expert_tensors=plan.cpu_expert_tensors,
        n_ctx=plan.n_ctx,
        fits=plan.fits,
        gpu_read_bytes=reads.gpu_bytes,
        cpu_read_bytes=reads.cpu_bytes,
        tokens_per_second=reads.tokens_per_second(plan.gpu_bandwidth, plan.cpu_bandwidth),
        speed_ctx=speed_ctx,
    )


def _weigh_expert_split(budget: Budget, layers: Plan) -> Plan:
    """A MoE model that does not fit whole: the layer split against the expert split, by estimated speed."""
    experts = _plan_experts(budget)
    if experts is None:
        floor, n_parallel = _expert_floor(budget), budget.request.n_parallel
        dense = budget.need(layers.n_layers, floor, n_parallel, ExpertSplit(budget.model.n_layers))
        why = (
            f"no expert split: every layer's dense tensors, the KV cache and compute alone need "
            f"{format_size(dense)} at {_ctx_words(floor, n_parallel)}"
        )
        alone = _candidate("layers", layers, budget, layers.n_ctx)
        return replace(layers, reason=f"{layers.reason}; {why}", candidates=(alone,))
    plans = (layers, experts)
    speed_ctx = min(layers.n_ctx, experts.n_ctx)
    candidates = [
        _candidate("layers", layers, budget, speed_ctx),
        _candidate("experts", experts, budget, speed_ctx),
    ]
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
    budget = budget_for(device, model, request, measured)
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
    budget = budget_for(ram, model, request, measured, host=True)
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


def _active_words(model: ModelInfo, plan: Plan) -> str:
    """Why a MoE model suits the CPU: a token reads its active parameters only."""
    active = speed.active_weights_bytes(model)
    return (
        f"a MoE model: a token goes through {model.n_expert_used} of {model.n_expert} experts per layer, "
        f"reading {format_size(active)} of its {format_size(model.weights_bytes)} of weights (and "
        f"{format_size(plan.cpu_read_bytes - active)} of its sequence's cache): about "
        f"{plan.tokens_per_second:.0f} tokens/s at most"
    )
