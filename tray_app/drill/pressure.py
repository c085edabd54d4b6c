"""`failsoft drill --pressure SIZE`: take VRAM away from the GPU worker and record what the service does.

On a simulated GPU the drill takes the memory through the simulated ledger
(`POST /failsoft/debug/pressure`), as another process would on a real card; the service re-plans. On a
real NVIDIA GPU it allocates the memory with torch (the optional `drill` extra) in this process and
reports torch's own accounting. Either way a small probe request shows where the service sends work
while the memory is gone, and the memory is given back at the end.
"""

from __future__ import annotations

import importlib
import time
from typing import Any

from tray_app.budget.device import nvml_memory
from tray_app.contract.sizes import format_size
from tray_app.contract.status import ServiceStatus
from tray_app.drill.bodies import BASE, SEA
from tray_app.drill.client import DrillError, ServiceClient

LABEL = "drill-pressure"
TORCH_HINT = "pip install 'failsoft[drill]'"
PLAN_KEYS = ("verdict", "fits", "n_gpu_layers", "n_layers", "n_ctx", "n_ctx_per_seq", "free_bytes", "reason")


def _plan_view(status: ServiceStatus) -> dict[str, Any]:
    plan = status.get("plan") or {}
    device = status.get("device") or {}
    view = {key: plan.get(key) for key in PLAN_KEYS}
    view["device_free_bytes"] = device.get("free_bytes")
    view["caps"] = status.get("caps")
    view["gpu_worker_pid"] = ((status.get("workers") or {}).get("gpu") or {}).get("pid")
    return view


async def _probe(client: ServiceClient) -> dict[str, Any]:
    """A small request that fits the GPU profile as it was: where does the service run it now?"""
    answer = await client.chat({**BASE, "messages": SEA, "max_tokens": 16})
    info = answer.failsoft or {}
    return {
        "status": answer.status,
        "worker": info.get("worker"),
        "attempts": info.get("attempts"),
        "fallback_reason": info.get("fallback_reason"),
        "error": answer.error,
        "seconds": round(answer.ended_at - answer.started_at, 3),
    }


def summarize_change(before: dict[str, Any], during: dict[str, Any], probe: dict[str, Any]) -> list[str]:
    """What the service did with the pressure, in words (pure: from the recorded views)."""
    lines = [
        f"device free: {format_size(before['device_free_bytes'] or 0)} -> "
        f"{format_size(during['device_free_bytes'] or 0)} while the pressure was held",
        f"plan: {before['verdict']} -> {during['verdict']}; GPU layers {before['n_gpu_layers']}/"
        f"{before['n_layers']} -> {during['n_gpu_layers']}/{during['n_layers']}; n_ctx {before['n_ctx']} -> "
        f"{during['n_ctx']}",
    ]
    before_caps, during_caps = before.get("caps") or {}, during.get("caps") or {}
    if before_caps.get("n_ctx_per_seq") != during_caps.get("n_ctx_per_seq"):
        lines.append(
            f"admission cap: {before_caps.get('n_ctx_per_seq')} -> {during_caps.get('n_ctx_per_seq')} tokens "
            "per sequence; longer requests now go to the CPU"
        )
    else:
        lines.append(f"admission cap unchanged: {during_caps.get('n_ctx_per_seq')} tokens per sequence")
    if before.get("gpu_worker_pid") == during.get("gpu_worker_pid"):
        lines.append("the running GPU worker was not restarted: it keeps the memory it already holds")
    else:
        lines.append("the GPU worker was restarted under pressure")
    if probe.get("error"):
        lines.append(f"probe request refused: {probe['error'].get('code')}: {probe['error'].get('message')}")
    else:
        reason = f", fallback reason {probe['fallback_reason']}" if probe.get("fallback_reason") else ""
        lines.append(f"probe request served by the {probe.get('worker')} worker{reason}")
    return lines


async def simulated_pressure(client: ServiceClient, size: int) -> dict[str, Any]:
    await client.wait_ready()
    before = _plan_view(await client.status())
    result: dict[str, Any] = {"mode": "simulated", "size_bytes": size, "size": format_size(size)}
    try:
        taken = await client.pressure({"take": str(size), "label": LABEL})
    except DrillError as error:
        result.update(before=before, error=f"the ledger refused the pressure: {error}")
        return result
    try:
        during = _plan_view(await client.status())
        probe = await _probe(client)
    finally:
        released = await client.pressure({"release": LABEL})
    after = _plan_view(await client.status())
    result.update(
        held_bytes=taken.get("held", {}).get(LABEL),
        before=before,
        during=during,
        probe=probe,
        released_bytes=released.get("released"),
        after=after,
        summary=[
            *summarize_change(before, during, probe),
            f"released {format_size(released.get('released') or 0)}: plan {after['verdict']}, "
            f"{after['n_gpu_layers']}/{after['n_layers']} layers, device free "
            f"{format_size(after['device_free_bytes'] or 0)}",
        ],
    )
    return result


def torch_available() -> Any | None:
    """The torch module when installed with CUDA, else None."""
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return None
    return torch


async def real_gpu_pressure(client: ServiceClient, size: int, gpu_index: int = 0) -> dict[str, Any]:
    result: dict[str, Any] = {"mode": "nvidia", "size_bytes": size, "size": format_size(size)}
    torch = torch_available()
    if torch is None:
        result["error"] = f"torch is not installed; memory pressure on a real GPU needs it: {TORCH_HINT}"
        return result
    if not torch.cuda.is_available():
        result["error"] = "torch cannot see a CUDA device (a CPU-only torch build, or no driver)"
        return result
    await client.wait_ready()
    before = _plan_view(await client.status())
    # The service planned a real card once, at start; NVML shows what the pressure does to free memory now.
    before["device_free_bytes"] = nvml_memory(gpu_index).free_bytes
    device = torch.device(f"cuda:{gpu_index}")
    started = time.monotonic()
    try:
        block = torch.empty(size, dtype=torch.uint8, device=device)
    except torch.cuda.OutOfMemoryError as error:
        result.update(before=before, error=f"torch could not allocate {format_size(size)}: {error}")
        return result
    try:
        result["torch_during"] = {
            "allocated_bytes": int(torch.cuda.memory_allocated(device)),
            "reserved_bytes": int(torch.cuda.memory_reserved(device)),
            "allocation_seconds": round(time.monotonic() - started, 3),
        }
        during = _plan_view(await client.status())
        during["device_free_bytes"] = nvml_memory(gpu_index).free_bytes
        probe = await _probe(client)
    finally:
        del block
        torch.cuda.empty_cache()
    result["torch_after"] = {
        "allocated_bytes": int(torch.cuda.memory_allocated(device)),
        "reserved_bytes": int(torch.cuda.memory_reserved(device)),
    }
    result.update(before=before, during=during, probe=probe, summary=summarize_change(before, during, probe))
    return result


async def apply_pressure(client: ServiceClient, size: int) -> dict[str, Any]:
    """Pressure on whatever GPU the service has: the simulated ledger, or a real card through torch."""
    status = await client.status()
    device = status.get("device") or {}
    if device.get("simulated"):
        return await simulated_pressure(client, size)
    if device.get("kind") == "nvidia":
        return await real_gpu_pressure(client, size)
    return {
        "mode": "none",
        "size_bytes": size,
        "error": f"the service has no GPU, real or simulated ({device.get('reason', 'no device')})",
    }
