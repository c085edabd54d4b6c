"""Plans for the library's models (besides the main one): each on the GPU in the share that the main
model's plans leave (the reserve stays theirs), all layers or not at all, and on the CPU. Which of them are
loaded together is decided at load time against the same share (tray_app.library.eviction)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tray_app.budget import calibration
from tray_app.budget.device import DeviceMemory
from tray_app.budget.model_info import ModelInfo, inspect_model
from tray_app.budget.plan import Plan
from tray_app.budget.plan_set import PlanSet, cpu_request, cpu_slots, gpu_request
from tray_app.budget.planner import plan_cpu, plan_gpu
from tray_app.config import Config
from tray_app.contract.sizes import format_size
from tray_app.library.catalog import ModelEntry


@dataclass(frozen=True)
class ModelPlans:
    name: str
    model: ModelInfo
    gpu: Plan | None  # all its layers in the library's share; None: not on the GPU (gpu_note says why)
    cpu: Plan | None  # None: the model may not use the CPU
    gpu_note: str = ""

    @property
    def vram_bytes(self) -> int:
        """What its GPU worker holds once loaded: weights, KV cache and compute buffers."""
        return self.gpu.used_bytes if self.gpu is not None else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model.to_dict(),
            "gpu": self.gpu.to_dict() if self.gpu else None,
            "cpu": self.cpu.to_dict() if self.cpu else None,
            "gpu_note": self.gpu_note,
            "vram_bytes": self.vram_bytes,
        }


def library_share(plans: PlanSet) -> DeviceMemory | None:
    """The GPU memory the library's models share: what the main chat plan and its embeddings plan leave
    free. None when there is no GPU or the main plan does not fit."""
    if not plans.device.available or not plans.gpu.fits:
        return None
    free = plans.embeddings.free_bytes if plans.embeddings is not None else plans.gpu.free_bytes
    return replace(plans.device, free_bytes=free, used_by_others_bytes=plans.device.total_bytes - free)


def plan_library_model(cfg: Config, entry: ModelEntry, plans: PlanSet) -> ModelPlans:
    model = inspect_model(entry.path)
    measured = calibration.measured_compute(entry.path)
    gpu: Plan | None = None
    note = ""
    share = library_share(plans)
    if "gpu" not in entry.devices:
        note = "its devices do not include the GPU"
    elif share is None:
        note = "no GPU, or the main model's plan leaves none"
    else:
        request = replace(
            gpu_request(cfg),
            n_ctx=entry.n_ctx or None,
            n_parallel=entry.n_parallel or cfg.budget.n_parallel,
            reserve_percent=0.0,  # the main plan keeps the device's reserve
            reserve_min_bytes=0,
        )
        plan = plan_gpu(share, model, request, measured)
        if plan.fits and plan.whole_on_gpu:
            gpu = plan
        else:
            note = f"it does not fit whole in the {format_size(share.free_bytes)} the main model leaves"
    cpu: Plan | None = None
    if "cpu" in entry.devices:
        request = replace(
            cpu_request(cfg), n_ctx=entry.n_ctx or None, n_parallel=entry.n_parallel or cpu_slots(cfg)
        )
        cpu = plan_cpu(plans.ram, model, request, measured)
    return ModelPlans(entry.name, model, gpu, cpu, note)
