"""Worker profiles (tray_app.engine.profile) derived from the budget plans and the config."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from tray_app.budget.footprint import MIB
from tray_app.budget.library_plan import ModelPlans, library_share
from tray_app.budget.model_info import inspect_model
from tray_app.budget.plan import Plan
from tray_app.budget.plan_set import PlanSet, physical_cores
from tray_app.budget.remote import RemoteShare
from tray_app.config import Config
from tray_app.contract.roles import EMBED_ROLES, Role
from tray_app.engine.profile import WorkerProfile, WorkerProfiles
from tray_app.engine.tools import template_for
from tray_app.library.catalog import ModelEntry


def embedding_profiles(
    cfg: Config, plans: PlanSet, gpu: WorkerProfile | None, cpu: WorkerProfile | None
) -> tuple[WorkerProfile, ...]:
    """An embeddings worker beside each chat worker, started on first use: on the GPU only with its own
    plan (all layers, in what the chat plan leaves free: plan_set.embeddings_gpu_plan), else CPU only."""
    settings = cfg.embeddings
    if not settings.enabled:
        return ()
    model = Path(settings.model).expanduser() if settings.model else None

    def beside(chat: WorkerProfile) -> WorkerProfile:
        return replace(
            chat,
            role=EMBED_ROLES[chat.role],
            model_path=model or chat.model_path,
            model_name=model.name if model else chat.model_name,
            n_ctx=settings.n_ctx,
            n_parallel=settings.n_parallel,
            chat_format="",
            pooling=settings.pooling,
            warm=False,
            warm_reason="started on the first embeddings request",
        )

    profiles = []
    if gpu is not None and plans.embeddings is not None:
        # On a simulated device its memory is what the chat plan left free, not the whole card.
        simulated = plans.gpu.free_bytes if gpu.simulated_vram_bytes is not None else None
        on_gpu = replace(
            beside(gpu),
            n_gpu_layers=plans.embeddings.n_gpu_layers,
            n_cpu_moe=plans.embeddings.n_cpu_moe,
            cpu_expert_tensors=plans.embeddings.cpu_expert_tensors,
            simulated_vram_bytes=simulated,
        )
        profiles.append(on_gpu)
    if cpu is not None:
        profiles.append(beside(cpu))
    return tuple(profiles)


def worker_threads(cfg: Config, role: Role, simulated_gpu: bool) -> int:
    """llama.cpp threads for a worker: `cpu.threads` when set, else the physical cores, except next to a
    simulated GPU. That worker computes on the same cores as the CPU worker, and llama.cpp's threads spin at
    every barrier: two workers with a thread per core each slow each other down many times over whenever
    both generate (64 tokens took 45 s instead of 1 s on 2 cores). So there the cores are split."""
    if cfg.cpu.threads:
        return cfg.cpu.threads
    cores = physical_cores()
    if not simulated_gpu:
        return cores
    gpu_share = max(cores // 2, 1)
    return gpu_share if role == "gpu" else max(cores - gpu_share, 1)


def _from_plan(
    cfg: Config,
    plan: Plan,
    model_path: Path,
    threads: int,
    chat_format: str | None = None,
    model_name: str | None = None,
) -> dict[str, Any]:
    """What both workers take the same way from their plan and the config. `model_name`: the library's
    name for the model; the main model's is `cfg.model_name()` (model.name, else its file's name: an Ollama
    model's file is a blob named by its digest)."""
    wanted = cfg.model.chat_format if chat_format is None else chat_format
    if model_name is None:  # the config's path is resolved only when a name is set: it may name no file
        model_name = cfg.model.name if cfg.model.name and model_path == cfg.model_path() else model_path.name
    return {
        "model_path": model_path,
        "model_name": model_name,
        "n_ctx": plan.n_ctx,
        "n_threads": threads,
        "n_parallel": plan.n_parallel,
        "n_ubatch": plan.n_ubatch,
        "cache_type_k": plan.cache_type_k,
        "cache_type_v": plan.cache_type_v,
        "flash_attn": plan.flash_attn,
        "chat_format": template_for(inspect_model(model_path).chat_template, wanted),
        "log_requests": cfg.supervisor.log_requests,
    }


def gpu_profile(
    cfg: Config,
    plan: Plan,
    model_path: Path,
    simulated_free_bytes: int | None,
    remote: tuple[RemoteShare, ...] = (),
) -> WorkerProfile:
    return WorkerProfile(
        role="gpu",
        n_gpu_layers=plan.n_gpu_layers,
        rpc=tuple(share.endpoint for share in remote),
        rpc_layers=tuple(share.n_layers for share in remote),
        n_cpu_moe=plan.n_cpu_moe,
        cpu_expert_tensors=plan.cpu_expert_tensors,
        simulated_vram_bytes=simulated_free_bytes,
        warm=True,
        warm_reason="the GPU worker always starts with the service",
        **_from_plan(cfg, plan, model_path, worker_threads(cfg, "gpu", simulated_free_bytes is not None)),
    )


def cpu_profile(
    cfg: Config, plan: Plan, model_path: Path, *, beside_simulated_gpu: bool = False
) -> WorkerProfile:
    if not plan.fits:
        warm, reason = False, f"started on demand only: {plan.reason}"
    elif not cfg.cpu.warm:
        warm, reason = False, "started on demand (cpu.warm = false)"
    else:
        warm, reason = True, f"warm: {plan.reason}"
    threads = worker_threads(cfg, "cpu", beside_simulated_gpu)
    return WorkerProfile(
        role="cpu",
        n_gpu_layers=0,
        warm=warm,
        warm_reason=reason,
        cache_ram_mib=plan.prompt_cache_bytes // MIB,
        **_from_plan(cfg, plan, model_path, threads),
    )


def profiles_from_plans(cfg: Config, plan_set: PlanSet, *, enable_faults: bool = False) -> WorkerProfiles:
    """The GPU worker from the GPU plan, the CPU worker from the RAM plan (threads: see worker_threads)."""
    model_path = cfg.model_path()
    notes: list[str] = []
    gpu: WorkerProfile | None = None
    if plan_set.device.available:
        simulated_free = plan_set.device.free_bytes if plan_set.device.simulated else None
        gpu = gpu_profile(cfg, plan_set.gpu, model_path, simulated_free, plan_set.remote)
    else:
        notes.append(f"no GPU worker: {plan_set.device.reason or 'no GPU device'}")
    cpu: WorkerProfile | None = None
    if cfg.cpu.enabled:
        simulated_gpu = plan_set.device.available and plan_set.device.simulated
        cpu = cpu_profile(cfg, plan_set.cpu, model_path, beside_simulated_gpu=simulated_gpu)
        if not cpu.warm:
            notes.append(f"CPU worker {cpu.warm_reason}")
    else:
        notes.append("no CPU worker: cpu.enabled = false")
    if enable_faults:
        gpu = gpu.with_faults() if gpu else None
        cpu = cpu.with_faults() if cpu else None
    embeddings = embedding_profiles(cfg, plan_set, gpu, cpu)
    if cfg.embeddings.enabled and gpu is not None and plan_set.embeddings is None:
        notes.append("embeddings on the CPU only: the GPU plan leaves no room for an embeddings worker")
    return WorkerProfiles(gpu=gpu, cpu=cpu, notes=tuple(notes), embeddings=embeddings)


def library_profiles(
    cfg: Config, entry: ModelEntry, plans: ModelPlans, plan_set: PlanSet, *, enable_faults: bool = False
) -> list[WorkerProfile]:
    """A library model's workers: on the GPU when its plan fits there, on the CPU when it may use it; both
    started on its first request (or at start with `preload`), stopped after its keep-alive."""
    simulated = plan_set.device.available and plan_set.device.simulated
    warm_reason = "preloaded (preload = true)" if entry.preload else "loaded when a request names it"
    profiles = []
    share = library_share(plan_set)
    if plans.gpu is not None and share is not None:
        threads = worker_threads(cfg, "gpu", simulated)
        profiles.append(
            WorkerProfile(
                role=entry.role("gpu"),
                n_gpu_layers=plans.gpu.n_gpu_layers,
                n_cpu_moe=plans.gpu.n_cpu_moe,
                cpu_expert_tensors=plans.gpu.cpu_expert_tensors,
                simulated_vram_bytes=share.free_bytes if simulated else None,
                warm=entry.preload,
                warm_reason=warm_reason,
                **_from_plan(cfg, plans.gpu, entry.path, threads, entry.chat_format, entry.name),
            )
        )
    if plans.cpu is not None and cfg.cpu.enabled:
        threads = worker_threads(cfg, "cpu", simulated)
        profiles.append(
            WorkerProfile(
                role=entry.role("cpu"),
                n_gpu_layers=0,
                warm=entry.preload and plans.gpu is None,
                warm_reason=warm_reason,
                cache_ram_mib=plans.cpu.prompt_cache_bytes // MIB,
                **_from_plan(cfg, plans.cpu, entry.path, threads, entry.chat_format, entry.name),
            )
        )
    return [profile.with_faults() for profile in profiles] if enable_faults else profiles
