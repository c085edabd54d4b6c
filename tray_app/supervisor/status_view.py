"""What a worker's status shows (tray_app.contract.status.WorkerStatus): rendered from what the owner knows,
never written back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil

from tray_app.contract.status import WorkerStatus
from tray_app.contract.vocabulary import WorkerState
from tray_app.engine import binary, offload
from tray_app.engine.llama_log import BufferSizes
from tray_app.engine.profile import WorkerProfile
from tray_app.supervisor.messages import Attempt


def worker_status(
    *,
    state: WorkerState,
    reason: str,
    attempt: Attempt | None,
    pid: int | None,
    base_url: str | None,
    restarts: int,
    last_failure: dict[str, Any] | None,
    next_retry_at: float | None,
    profile: WorkerProfile,
    engine: binary.EngineInfo | None,
    log_file: Path,
    health: dict[str, Any],
) -> WorkerStatus:
    rss, cpu = _usage(attempt.psutil_process if attempt is not None else None)
    return {
        "role": profile.role,
        "state": state,
        "reason": reason,
        "pid": pid,
        "base_url": base_url,
        "rss_bytes": rss,
        "cpu_percent": cpu,
        "restarts": restarts,
        "last_failure": last_failure,
        "next_retry_at": next_retry_at,
        "warm": profile.warm,
        "warm_reason": profile.warm_reason,
        "log_file": str(log_file),
        "profile": profile.to_dict(),
        "engine": engine.to_dict() if engine else None,
        "health": dict(health),
    }


def worker_health(
    attempt: Attempt, answer: dict[str, Any], buffers: BufferSizes, engine: binary.EngineInfo | None
) -> dict[str, Any]:
    """What status shows of a ready worker: its /health answer, the plan it runs and what it allocated."""
    profile = attempt.profile
    return {
        **answer,
        "role": profile.role,
        "pid": attempt.process.pid,
        "engine": engine.describe() if engine else "",
        "model_path": str(profile.model_path),
        "n_ctx": profile.n_ctx,
        "n_ctx_per_slot": profile.n_ctx // max(profile.n_parallel, 1),
        "n_parallel": profile.n_parallel,
        "n_gpu_layers": profile.n_gpu_layers,
        "n_threads": profile.n_threads,
        "simulated": profile.simulated_vram_bytes is not None,
        # What the worker runs on by llama.cpp's own load log: GPU devices, "simulated", or "CPU".
        "runs_on": runs_on(profile, attempt.placement),
        "offload": attempt.placement.to_dict() if attempt.placement else None,
        "simulated_vram_bytes": profile.simulated_vram_bytes,
        "memory_limit": {"limit_bytes": attempt.memory_limit} if attempt.memory_limit else None,
        "faults_enabled": profile.enable_faults,
        "buffers": buffers.to_dict(),
        "load_seconds": attempt.load_seconds,
    }


def runs_on(profile: WorkerProfile, placement: offload.Offload | None) -> str:
    if profile.simulated_vram_bytes is not None:
        return "simulated"
    devices = placement.devices if placement else ()
    return ", ".join(devices) if devices else "CPU"


def usage_meter(pid: int) -> psutil.Process | None:
    """What status reads the worker's memory and CPU share from (None when the process is already gone)."""
    try:
        process = psutil.Process(pid)
        process.cpu_percent(interval=None)  # the first call only sets the baseline
    except psutil.Error:
        return None
    return process


def _usage(process: psutil.Process | None) -> tuple[int | None, float | None]:
    """Resident memory and CPU share of the worker's process (None, None when it is gone)."""
    if process is None:
        return None, None
    try:
        return process.memory_info().rss, process.cpu_percent(interval=None)
    except psutil.Error:
        return None, None
