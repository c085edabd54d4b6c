"""Is a loaded worker where its plan put it? A GPU worker on a real device must show its layers on a GPU
(tray_app.engine.offload); one on a simulated device must fit the simulated VRAM (tray_app.engine.simulated).
Functions over the profile and what llama.cpp printed; the owner acts on the answer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tray_app.budget.experts import ExpertSplit, experts_kept_on_cpu
from tray_app.budget.footprint import host_weights_bytes
from tray_app.budget.model_info import ModelFileError, ModelInfo, inspect_model
from tray_app.engine import offload, simulated
from tray_app.engine.devices import DeviceListError, list_devices
from tray_app.engine.llama_log import BufferSizes
from tray_app.engine.profile import WorkerProfile
from tray_app.supervisor.classify import Failure


@dataclass(frozen=True)
class LoadFailure:
    failure: Failure
    log_lines: tuple[str, ...]  # for the worker's log, so the reason sits beside llama.cpp's own lines


def needs_gpu_proof(profile: WorkerProfile) -> bool:
    simulated_device = profile.simulated_vram_bytes is not None
    return offload.needs_gpu_proof(profile.role, simulated_device, profile.n_gpu_layers)


def refusal_before_start(profile: WorkerProfile, engine_path: Path) -> str | None:
    """A GPU worker on a real device is not started with a build that lists no GPU (it would run on the
    CPU under the GPU's name)."""
    if not needs_gpu_proof(profile):
        return None
    try:
        return offload.refusal_before_start(list_devices(engine_path))
    except DeviceListError as error:
        return f"cannot tell whether this llama.cpp build has a GPU backend: {error}"


def check_load(
    profile: WorkerProfile, placement: offload.Offload | None, buffers: BufferSizes
) -> LoadFailure | None:
    """On a real GPU: did the layers and weights land on a GPU device? On a simulated device: does what
    llama.cpp allocated fit the simulated VRAM?"""
    free = profile.simulated_vram_bytes
    if free is None:
        if not needs_gpu_proof(profile):
            return None
        reason = offload.failure_after_load(
            placement or offload.Offload(None, None, ()), profile.n_gpu_layers
        )
        if reason is None:
            return None
        return LoadFailure(Failure("bad_config", reason), (f"--- {reason}",))
    model = inspect_model(profile.model_path)  # read once per model file, then cached
    in_ram = experts_kept_on_cpu(model, _offloaded(profile, model), _expert_split(profile))
    share = simulated.device_share(buffers, profile.n_gpu_layers, model.n_layers, experts_in_ram=in_ram)
    lines = simulated.failure_lines(share, free)
    if lines is None:
        return None
    return LoadFailure(Failure("oom_load", lines[-1]), tuple(lines))


def ram_weights_bytes(profile: WorkerProfile) -> int:
    """The weights a worker keeps in system RAM by its plan (layers not offloaded, experts kept in RAM): on a
    simulated device the process holds them beside the simulated VRAM. 0 for a file that cannot be read:
    llama-server then fails its load and says why."""
    try:
        model = inspect_model(profile.model_path)
    except ModelFileError:
        return 0
    return host_weights_bytes(model, _offloaded(profile, model), _expert_split(profile))


def _offloaded(profile: WorkerProfile, model: ModelInfo) -> int:
    """The profile's `-ngl` as a count (-1: every layer, the output layer included)."""
    return model.n_layers + 1 if profile.n_gpu_layers < 0 else profile.n_gpu_layers


def _expert_split(profile: WorkerProfile) -> ExpertSplit:
    return ExpertSplit(profile.n_cpu_moe, profile.cpu_expert_tensors)
