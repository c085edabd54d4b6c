"""Config -> device probe + model info -> the GPU plan and the CPU plan: the one call the service makes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import psutil

from tray_app.budget import calibration
from tray_app.budget.device import DeviceMemory, GpuDevice, SimulatedDevice, probe_gpu, system_ram
from tray_app.budget.model_info import ModelInfo, inspect_model
from tray_app.budget.plan import Plan, PlanRequest
from tray_app.budget.planner import plan_cpu, plan_gpu
from tray_app.budget.ram_check import RamCheck, both_workers
from tray_app.budget.remote import RemoteDevice, RemoteShare, remote_shares
from tray_app.budget.target import PlanTarget, plan_target
from tray_app.config import Config
from tray_app.config.peers import PeerConfig
from tray_app.contract.sizes import format_size, parse_size
from tray_app.engine import binary
from tray_app.engine.devices import DeviceListError, DeviceListing, list_devices, rpc_device


@dataclass(frozen=True)
class PlanSet:
    device: DeviceMemory
    model: ModelInfo
    gpu: Plan
    cpu: Plan
    ram: DeviceMemory
    target: PlanTarget  # the device the GPU plan is for, as llama.cpp's build sees it
    # The GPU embeddings worker's plan, in what the chat plan leaves free; None: embeddings on the CPU only.
    embeddings: Plan | None = None
    boxes: tuple[RemoteDevice, ...] = ()  # the configured RPC boxes as probed for this plan
    remote: tuple[RemoteShare, ...] = ()  # the layers they hold for the GPU worker, in its --rpc order

    @property
    def remote_layers(self) -> int:
        return sum(share.n_layers for share in self.remote)

    def ram_together(self) -> RamCheck:
        """RAM for both workers at once; the GPU worker on a simulated device loads its weights into its own
        memory (tray_app.engine.argv), elsewhere llama-server maps the file both workers share."""
        return both_workers(self.gpu, self.cpu, weights_shared=self.target.kind != "simulated")

    def rpc_status(self) -> dict[str, Any]:
        """Other machines' devices the GPU worker spans (llama.cpp RPC): each box as probed, its layers."""
        return {
            "boxes": [asdict(box) for box in self.boxes],
            "remote": [share.to_dict() for share in self.remote],
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device.to_dict(),
            "target": self.target.to_dict(),
            "model": self.model.to_dict(),
            "gpu": self.gpu.to_dict(),
            "cpu": self.cpu.to_dict(),
            "ram": self.ram.to_dict(),
            "embeddings": self.embeddings.to_dict() if self.embeddings else None,
            **self.rpc_status(),
            "ram_check": self.ram_together().to_dict(),
        }


def physical_cores() -> int:
    """Physical cores (threads for a llama.cpp worker); logical ones when the count is unknown."""
    return psutil.cpu_count(logical=False) or psutil.cpu_count() or 1


CPU_SLOTS_MAX = 4


def cpu_slots(cfg: Config) -> int:
    """Slots of the CPU worker: `cpu.n_parallel`, else two per physical core up to 4. Measured on 2 cores
    with SmolLM2-135M: 4 clients at once got 74 tokens/s from 4 slots against 49 from one."""
    return cfg.cpu.n_parallel or min(CPU_SLOTS_MAX, 2 * physical_cores())


def gpu_request(cfg: Config) -> PlanRequest:
    budget = cfg.budget
    return PlanRequest(
        n_ctx=budget.n_ctx or None,
        max_ctx=budget.max_ctx,
        n_parallel=budget.n_parallel,
        cache_type_k=budget.cache_type,
        cache_type_v=budget.cache_type,
        flash_attn=budget.flash_attn,
        n_ubatch=budget.n_ubatch,
        reserve_percent=budget.reserve_percent,
        reserve_min_bytes=parse_size(budget.reserve_min),
    )


def cpu_request(cfg: Config) -> PlanRequest:
    # The same cache settings keep a replayed request's context compatible with the GPU worker's.
    return PlanRequest(
        n_ctx=cfg.cpu.n_ctx or None,
        max_ctx=cfg.cpu.max_ctx,
        n_parallel=cpu_slots(cfg),
        cache_type_k=cfg.budget.cache_type,
        cache_type_v=cfg.budget.cache_type,
        flash_attn=cfg.budget.flash_attn,
        n_ubatch=cfg.budget.n_ubatch,
        reserve_percent=cfg.cpu.reserve_percent,
        reserve_min_bytes=parse_size(cfg.cpu.reserve_min),
    )


def gpu_memory(cfg: Config, vram_override: int | None = None, gpu: GpuDevice | None = None) -> DeviceMemory:
    """The GPU to plan for: a GPU of `vram_override` bytes (what-if, nothing else on it), else `gpu` (the
    service's live device, e.g. a simulated one under drill pressure), else the device the config names."""
    if vram_override is not None:
        what_if = SimulatedDevice(vram_override, name="what-if GPU").memory()
        reason = f"a GPU of {format_size(vram_override)} as asked; no device was probed"
        return replace(what_if, reason=reason)
    return (gpu if gpu is not None else probe_gpu(cfg.device)).memory()


def engine_devices(cfg: Config) -> tuple[DeviceListing | None, str]:
    """What the configured llama-server lists (`--list-devices`), or None and why it could not tell."""
    try:
        return list_devices(binary.locate(cfg.engine.llama_server)), ""
    except (binary.EngineError, DeviceListError) as error:
        return None, str(error)


def _rpc_peers(cfg: Config) -> list[PeerConfig]:
    return sorted((peer for peer in cfg.peers if peer.rpc), key=lambda peer: peer.priority)


def configured_endpoints(cfg: Config) -> list[str]:
    """The RPC boxes the config names, in the order they are probed and filled."""
    return [peer.rpc for peer in _rpc_peers(cfg)]


def probe_boxes(cfg: Config) -> tuple[RemoteDevice, ...]:
    """The `[[peers]]` with `rpc`, in priority order, each as llama.cpp lists its device now (or why not)."""
    configured = _rpc_peers(cfg)
    if not configured:
        return ()
    try:
        engine = binary.locate(cfg.engine.llama_server)
    except binary.EngineError as error:
        return tuple(RemoteDevice(peer.name, peer.rpc, problem=str(error)) for peer in configured)
    boxes = []
    for peer in configured:
        cap = parse_size(peer.rpc_memory) if peer.rpc_memory else 0
        try:
            device = rpc_device(engine, peer.rpc)
        except DeviceListError as error:
            boxes.append(RemoteDevice(peer.name, peer.rpc, cap_bytes=cap, problem=str(error)))
            continue
        boxes.append(
            RemoteDevice(
                peer.name, peer.rpc, device.description, device.total_bytes, device.free_bytes, cap_bytes=cap
            )
        )
    return tuple(boxes)


def plan_from_config(
    cfg: Config,
    *,
    vram_override: int | None = None,
    gpu: GpuDevice | None = None,
    boxes: tuple[RemoteDevice, ...] | None = None,
) -> PlanSet:
    """Probe the devices, inspect the model and plan both workers (with measured compute buffers if known).
    `boxes`: the RPC boxes as last probed (None: probe them now; a what-if plan leaves them out)."""
    model_path = cfg.model_path()
    model = inspect_model(model_path)
    measured = calibration.measured_compute(model_path)
    device = gpu_memory(cfg, vram_override, gpu)
    ram = system_ram()
    listing, list_error = engine_devices(cfg) if vram_override is None else (None, "")
    plans = PlanSet(
        device=device,
        model=model,
        gpu=plan_gpu(device, model, gpu_request(cfg), measured),
        cpu=plan_cpu(ram, model, cpu_request(cfg), measured),
        ram=ram,
        target=plan_target(device, listing, list_error, what_if=vram_override is not None),
    )
    if vram_override is None:
        boxes = probe_boxes(cfg) if boxes is None else boxes
        shares = remote_shares(
            model,
            gpu_request(cfg),
            plans.gpu,
            list(boxes),
            local_device_in_build=plans.target.kind == "gpu",
            measured=measured,
        )
        plans = replace(plans, boxes=boxes, remote=shares)
    return replace(plans, embeddings=embeddings_gpu_plan(cfg, plans))


def embeddings_gpu_plan(cfg: Config, plans: PlanSet) -> Plan | None:
    """The GPU embeddings worker's plan: all of its model's layers, its context and slots, in what the chat
    worker's plan leaves free (the reserve stays the chat plan's). None when embeddings are off, there is no
    GPU, or it does not fit whole: then the CPU's embeddings worker serves alone, and no VRAM is taken that
    the plan did not leave free."""
    settings = cfg.embeddings
    if not settings.enabled or not plans.device.available or not plans.gpu.fits:
        return None
    model_path = Path(settings.model).expanduser() if settings.model else cfg.model_path()
    model = inspect_model(model_path)
    left = replace(
        plans.device,
        free_bytes=plans.gpu.free_bytes,
        used_by_others_bytes=plans.device.total_bytes - plans.gpu.free_bytes,
    )
    # The embeddings worker runs with the chat worker's caches, flash attention and ubatch (see
    # supervisor.profile.embedding_profiles): planned with them, its measured compute is found again.
    chat = plans.gpu
    request = PlanRequest(
        n_ctx=settings.n_ctx,
        max_ctx=settings.n_ctx,
        n_parallel=settings.n_parallel,
        cache_type_k=chat.cache_type_k,  # type: ignore[arg-type]
        cache_type_v=chat.cache_type_v,  # type: ignore[arg-type]
        flash_attn=chat.flash_attn,
        n_ubatch=chat.n_ubatch,
        reserve_percent=0.0,
        reserve_min_bytes=0,
        min_ctx=min(settings.n_ctx, 2048),
        embeddings=True,
    )
    plan = plan_gpu(left, model, request, calibration.measured_compute(model_path))
    return plan if plan.fits and plan.whole_on_gpu else None
