"""What llama.cpp allocated for a worker's profile, kept for the planner: its compute estimate is checked
against the measurement and replaced by it (tray_app.budget.calibration)."""

from __future__ import annotations

import logging
from pathlib import Path

from tray_app.budget import calibration
from tray_app.budget.plan import ComputeSettings
from tray_app.engine.devices import DeviceListError, list_devices
from tray_app.engine.llama_log import BufferSizes
from tray_app.engine.profile import WorkerProfile

log = logging.getLogger(__name__)


def record_calibration(profile: WorkerProfile, buffers: BufferSizes, *, gpu_build: bool) -> None:
    """Keep what a worker's load allocated; `gpu_build`: its llama.cpp build has a GPU backend
    (engine_lists_a_gpu)."""
    if buffers.total_bytes == 0:
        log.warning("llama-server printed no buffer sizes: nothing to record for calibration")
        return
    if profile.n_gpu_layers == 0 and gpu_build:
        return  # with a GPU build a CPU worker's compute buffer is not the one a VRAM plan needs
    if profile.rpc:
        return  # a compute buffer on each machine: neither is one device's alone
    try:
        calibration.record_measurement(profile.model_path, compute_settings(profile), buffers)
    except OSError as error:
        log.warning("could not record the measured buffers: %s", error)


def compute_settings(profile: WorkerProfile) -> ComputeSettings:
    """What a worker's compute buffer depends on: the key its measured buffers are kept under."""
    return ComputeSettings(
        n_ctx=profile.n_ctx,
        n_parallel=profile.n_parallel,
        cache_type_k=profile.cache_type_k,
        cache_type_v=profile.cache_type_v,
        flash_attn=profile.flash_attn,
        n_ubatch=profile.n_ubatch,
        embeddings=profile.embeddings,  # kept apart: its logits are a whole batch's, not one per slot
    )


def engine_lists_a_gpu(engine_path: Path) -> bool:
    """Whether the worker's llama.cpp build has a GPU backend with a device, as its own `--list-devices`
    says: asked of the engine in a child process, never of the binding in this one (the service loads no
    native inference code)."""
    try:
        return bool(list_devices(engine_path).gpus)
    except DeviceListError:
        return False
