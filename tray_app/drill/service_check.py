"""What the drill, its soak and the bench ask of a service before they use it, and how they report it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from tray_app.budget.device import nvml_memory
from tray_app.config import Config
from tray_app.contract.status import ServiceStatus
from tray_app.drill.client import DrillError, ServiceClient

DEFAULT_SIMULATED_VRAM = "4GiB"

Progress = Callable[[str], None]


def default_simulated_vram(cfg: Config) -> str | None:
    """A simulated GPU when the config names none and NVML finds no NVIDIA GPU."""
    if cfg.device.simulate_vram:
        return None
    return DEFAULT_SIMULATED_VRAM if nvml_memory(cfg.device.gpu_index).kind == "none" else None


def service_summary(url: str, status: ServiceStatus, launched: bool) -> dict[str, Any]:
    return {
        "url": url,
        "launched": launched,
        "simulated": status.get("simulated"),
        "device": status.get("device"),
        "model": (status.get("model") or {}).get("id"),
        "engine": status.get("engine"),
        "caps": status.get("caps"),
        "policy": status.get("policy"),
    }


async def checked_status(client: ServiceClient) -> ServiceStatus:
    try:
        status = await client.status()
    except httpx.HTTPError as error:
        raise DrillError(f"no failsoft service answers at {client.base_url}: {error}") from None
    if not status.get("faults_enabled"):
        raise DrillError(
            f"the service at {client.base_url} was started without --enable-faults; a drill needs "
            "`failsoft serve --enable-faults` (or run `failsoft drill` without --url to start one)"
        )
    if ((status.get("workers") or {}).get("gpu") or {}).get("state") in (None, "absent"):
        raise DrillError(
            "the service has no GPU worker (real or simulated): start it with --simulate-vram SIZE"
        )
    fallback = (status.get("policy") or {}).get("fallback")
    if fallback != "auto":
        raise DrillError(
            f"the service's failover.fallback is {fallback!r}; the drill plays automatic fallback (auto): "
            "run `failsoft drill` without --url to start a drill service"
        )
    return status
