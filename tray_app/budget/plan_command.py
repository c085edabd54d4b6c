"""`failsoft plan`: the VRAM split for the configured (or given) model and device, and the caps it sets."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from tray_app import config
from tray_app.budget import speed
from tray_app.budget.experts import expert_split_words, single_tensors_words, split_flag_words
from tray_app.budget.library_plan import ModelPlans, library_share, plan_library_model
from tray_app.budget.plan import Plan, PlanError
from tray_app.budget.plan_set import PlanSet, plan_from_config
from tray_app.contract.sizes import BAR_WIDTH, format_size, parse_size, text_bar
from tray_app.library.catalog import catalog_from_config


def _check_options(args: argparse.Namespace) -> None:
    # Checked here so that the message names the option, not the config file the value would land in.
    if args.ctx is not None and args.ctx < 0:
        raise ValueError(f"--ctx {args.ctx}: use 0 (the largest that fits) or a number of tokens")
    if args.parallel is not None and args.parallel < 1:
        raise ValueError(f"--parallel {args.parallel}: at least 1 sequence")
    if args.reserve is not None and not 0 <= args.reserve < 100:
        raise ValueError(f"--reserve {args.reserve}: a percentage from 0 up to (not including) 100")


def _apply_overrides(args: argparse.Namespace) -> tuple[config.Config, list[str]]:
    """The effective config with this command's options applied; notes say what was adjusted and why."""
    _check_options(args)
    cfg = config.load_config(args)
    notes: list[str] = []
    options = {
        "budget.n_ctx": args.ctx,
        "budget.n_parallel": args.parallel,
        "budget.reserve_percent": args.reserve,
        "budget.flash_attn": args.flash_attn,
        "budget.cache_type": args.cache_type,
    }
    overrides = {name: value for name, value in options.items() if value is not None}
    if args.cache_type not in (None, "f16") and args.flash_attn is None and not cfg.budget.flash_attn:
        # llama.cpp needs flash attention for a quantised V cache; asking for the cache type implies it.
        overrides["budget.flash_attn"] = True
        notes.append(f"flash attention turned on: a {args.cache_type} V cache needs it")
    # A new config with the options over it (the loaded one is not changed in place), validated like a file.
    return config.apply_overrides(cfg, {**cfg.overrides, **overrides}), notes


def _split_rows(plan: Plan, embeddings: Plan | None = None) -> list[tuple[str, int, str]]:
    layers = f"{plan.n_gpu_layers}/{plan.n_layers} layers"
    if plan.expert_split:
        partial = single_tensors_words(len(plan.cpu_expert_tensors))
        layers += f", experts of {plan.n_cpu_moe}/{plan.n_layers - 1}{partial} in RAM"
    cache = f"{plan.cache_type_k}/{plan.cache_type_v}, n_ctx {plan.n_ctx}"
    embedding = embeddings.used_bytes if embeddings is not None else 0
    rows = [
        ("weights", plan.weights_bytes, layers),
        ("KV cache", plan.kv_bytes, cache),
        ("compute", plan.compute_bytes, plan.compute_source),
        ("reserve", plan.reserve_bytes, "kept free, never planned"),
        ("other", plan.other_bytes, "other processes"),
    ]
    if embeddings is not None:
        rows.append(
            ("embedding", embedding, f"the embeddings worker, n_ctx {embeddings.n_ctx} (on first use)")
        )
    return [*rows, ("free", plan.free_bytes - embedding, "left over")]


def _device_line(plans: PlanSet) -> str:
    device = plans.device
    if device.kind == "none":
        return f"device: none ({device.reason})"
    label = "SIMULATED" if device.simulated else "real"
    return f"device: {device.name}, {format_size(device.total_bytes)} [{label}] - {device.reason}"


def render_table(plans: PlanSet, notes: list[str]) -> str:
    plan, model = plans.gpu, plans.model
    lines = [
        f"model: {model.name} ({model.architecture}, {model.n_layers} blocks, "
        f"weights {format_size(model.weights_bytes)}, trained context {model.n_ctx_train})",
        _device_line(plans),
        f"plans against: {plans.target.label}" + (f" - {plans.target.reason}" if plans.target.reason else ""),
        "",
    ]
    if plan.total_bytes > 0:
        for label, size, detail in _split_rows(plan, plans.embeddings):
            lines.append(f"  {label:<9} {text_bar(size, plan.total_bytes)} {format_size(size):>11}  {detail}")
        lines.append(f"  {'total':<9} {'':<{BAR_WIDTH}} {format_size(plan.total_bytes):>11}")
        lines.append("")
    lines.append(f"verdict: {plan.verdict.upper()} - {plan.reason}")
    lines.append(
        f"caps: n_ctx {plan.n_ctx}, parallel {plan.n_parallel} (n_ctx per sequence {plan.n_ctx_per_seq}), "
        f"n_gpu_layers {plan.n_gpu_layers}/{plan.n_layers}, cache {plan.cache_type_k}/{plan.cache_type_v}, "
        f"flash attention {'on' if plan.flash_attn else 'off'}"
    )
    if plan.expert_split:
        lines.append(
            f"expert split: {expert_split_words(plans.model, plan.expert_split, plan.cpu_expert_bytes)} "
            f"(llama-server {split_flag_words(plan.expert_split)})"
        )
    if plan.host_weights_bytes or plan.host_kv_bytes:
        lines.append(
            f"in system RAM for this worker: weights {format_size(plan.host_weights_bytes)}, "
            f"KV cache {format_size(plan.host_kv_bytes)}, logits {format_size(plan.output_bytes)}"
        )
    lines.extend(remote_lines(plans))
    lines.extend(candidate_lines(plan))
    cpu = plans.cpu
    lines.append(
        f"CPU worker: n_ctx {cpu.n_ctx}, {format_size(cpu.used_bytes)} of RAM "
        f"({'fits' if cpu.fits else 'DOES NOT FIT'}) - {cpu.reason}"
    )
    lines.append(
        f"CPU worker's prompt cache: up to {format_size(cpu.prompt_cache_bytes)} of its free RAM "
        "(--cache-ram; what the CPU mirror fills)"
    )
    if plan.verdict == "split":
        lines.append(f"RAM for both workers: {plans.ram_together().words()}")
    lines.extend(f"note: {note}" for note in notes)
    return "\n".join(lines)


def _layers(count: int) -> str:
    return f"{count} layer" + ("" if count == 1 else "s")


def remote_lines(plans: PlanSet) -> list[str]:
    """Each device's layers when RPC boxes are configured: the local GPU, each box, the CPU."""
    if not plans.boxes:
        return []
    plan = plans.gpu
    on_cpu = plan.n_layers - plan.n_gpu_layers - plans.remote_layers
    lines = [f"layers by device ({plan.n_layers} in all):"]
    lines.append(f"  {plans.target.label}: {_layers(plan.n_gpu_layers)}")
    for share in plans.remote:
        lines.append(f"  {share.device} {share.placement_words()}")
        lines.append(f"  {'':<9} {text_bar(share.used_bytes, share.usable_bytes)} of its usable memory")
    lines.append(f"  CPU (system RAM): {_layers(on_cpu)}")
    used = {share.endpoint for share in plans.remote}
    for box in plans.boxes:
        if box.endpoint not in used:
            why = box.problem or "the local GPU holds every layer, or no layer fits there"
            lines.append(f"  {box.peer} at {box.endpoint}: not used - {why}")
    return lines


def candidate_lines(plan: Plan) -> list[str]:
    """The splits a MoE model's plan weighed, each with its estimated speed; the chosen one starred."""
    if not plan.candidates:
        return []
    gpu, cpu = plan.gpu_bandwidth / speed.GB, plan.cpu_bandwidth / speed.GB
    at = plan.candidates[0].speed_ctx
    lines = [
        f"splits weighed (tokens/s from memory traffic at GPU {gpu:g} GB/s, RAM {cpu:g} GB/s; "
        f"each with the KV cache of n_ctx {at}):"
    ]
    for candidate in plan.candidates:
        mark = "*" if candidate.chosen else " "
        fits = "" if candidate.fits else ", does not fit"
        lines.append(
            f"  {mark} {candidate.label:<12} {candidate.placement_words()}, n_ctx {candidate.n_ctx}: "
            f"{candidate.reads_words()} -> about {candidate.tokens_per_second:.0f} tokens/s{fits}"
        )
    if len(plan.candidates) == 1:
        lines.append("    expert split: does not fit (see the verdict)")
    return lines


def library_lines(library: list[ModelPlans], share: int) -> list[str]:
    """Each other model's share of the GPU (all its layers, or the CPU only) and whether all fit at once."""
    if not library:
        return []
    lines = ["", f"other models (loaded on demand, in the {format_size(share)} the main model leaves):"]
    for plans in library:
        gpu = plans.gpu
        where = (
            f"GPU {format_size(plans.vram_bytes)} (weights {format_size(gpu.weights_bytes)}, KV "
            f"{format_size(gpu.kv_bytes)}, compute {format_size(gpu.compute_bytes)}; n_ctx {gpu.n_ctx}, "
            f"{gpu.n_parallel} slots)"
            if gpu is not None
            else f"CPU only: {plans.gpu_note}"
        )
        cpu = (
            f"; CPU n_ctx {plans.cpu.n_ctx}, {format_size(plans.cpu.used_bytes)} of RAM" if plans.cpu else ""
        )
        lines.append(f"  {plans.name}: {where}{cpu}")
    together = sum(plans.vram_bytes for plans in library)
    verdict = (
        "all fit at once" if together <= share else "not all at once: idle ones are unloaded to make room"
    )
    lines.append(f"  together on the GPU: {format_size(together)} of {format_size(share)} ({verdict})")
    return lines


def library_plans(cfg: config.Config, plans: PlanSet) -> tuple[list[ModelPlans], int]:
    """The library's models planned beside the main model's plans, and the GPU share they have."""
    catalog = catalog_from_config(cfg)
    share = library_share(plans)
    return [plan_library_model(cfg, entry, plans) for entry in catalog.others()], (
        share.free_bytes if share else 0
    )


def plan_json(plans: PlanSet) -> dict[str, object]:
    """The GPU plan's keys at the top level (sizes in bytes); the device, model and CPU plan beside them."""
    return {
        **plans.gpu.to_dict(),
        "device": plans.device.to_dict(),
        "target": plans.target.to_dict(),
        "model": plans.model.to_dict(),
        "cpu_plan": plans.cpu.to_dict(),
        "ram": plans.ram.to_dict(),
        "embeddings_plan": plans.embeddings.to_dict() if plans.embeddings else None,
        "ram_check": plans.ram_together().to_dict(),
        "boxes": [asdict(box) for box in plans.boxes],
        "remote": [share.to_dict() for share in plans.remote],
    }


def run(args: argparse.Namespace) -> int:
    try:
        vram = parse_size(args.vram) if args.vram else None
        if vram is not None and vram <= 0:
            raise ValueError("--vram must be a positive size")
        cfg, notes = _apply_overrides(args)
        plans = plan_from_config(cfg, vram_override=vram)
        library, share = library_plans(cfg, plans)
    except (ValueError, PlanError) as error:
        # ConfigError, ModelFileError and PlanError are ValueErrors with messages meant for the user.
        print(f"failsoft plan: {error}", file=sys.stderr)
        return 2
    if args.json:
        models = [model.to_dict() for model in library]
        print(
            json.dumps(
                {**plan_json(plans), "models": models, "library_share_bytes": share, "notes": notes}, indent=2
            )
        )
    else:
        print("\n".join([render_table(plans, notes), *library_lines(library, share)]))
    return 0
