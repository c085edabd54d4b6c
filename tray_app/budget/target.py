"""Which device the GPU worker is planned against, in words, and what to do when the build cannot use a GPU.

Two sources must agree before anything is called a GPU: the device Failsoft probed (NVML, or a simulated
one) and the devices llama.cpp's build lists (tray_app.engine.devices). A card the build cannot drive is
"CPU only", never a GPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from tray_app.budget.device import DeviceMemory
from tray_app.engine.binary import no_gpu_backend_reason
from tray_app.engine.devices import DeviceListing

TargetKind = Literal["gpu", "simulated", "what-if", "cpu", "unknown"]


@dataclass(frozen=True)
class PlanTarget:
    kind: TargetKind
    label: str  # what the plan and the status show, e.g. "CUDA0 (NVIDIA GeForce RTX 4090), cuda"
    backend: str = ""  # "cuda", "vulkan", "hip", "metal"; empty when no GPU backend serves the plan
    device: str = ""  # llama.cpp's device name, e.g. "CUDA0"
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_target(
    device: DeviceMemory, listing: DeviceListing | None, list_error: str = "", *, what_if: bool = False
) -> PlanTarget:
    """The device a GPU plan is for: a what-if size, the simulated device, a GPU llama.cpp lists, or none."""
    if what_if:
        return PlanTarget("what-if", "what-if GPU (no device probed)")
    if device.simulated:
        return PlanTarget("simulated", "simulated (no GPU)")
    if listing is None:
        return PlanTarget("unknown", "unknown (llama.cpp's devices could not be listed)", reason=list_error)
    if not listing.gpus:
        if device.available:
            reason = f"{device.name} was found, but {no_gpu_backend_reason()}"
        else:
            reason = f"{device.reason or 'no GPU found'}; llama.cpp lists no GPU device"
        return PlanTarget("cpu", "CPU only", reason=reason)
    # llama-server spreads layers over every GPU it lists; the plan is for the first one.
    first = listing.gpus[0]
    if not device.available:
        reason = (
            f"llama.cpp lists {first.label()}, but its memory is read through NVML (NVIDIA) only: "
            f"{device.reason}"
        )
        return PlanTarget("cpu", "CPU only", reason=reason)
    reason = f"llama.cpp lists {', '.join(gpu.name for gpu in listing.gpus)}"
    return PlanTarget("gpu", f"{first.label()}, {first.backend}", first.backend, first.name, reason)
