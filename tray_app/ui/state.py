"""What the tray shows, worked out from a status dict: no Qt here, so it is tested as plain data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tray_app.budget.sizes import format_size

SERVING = "serving"
DEGRADED = "degraded"
DOWN = "down"

# Worker states in which the worker is on its way back rather than gone.
RECOVERING_STATES = {"starting", "restarting", "unhealthy"}


@dataclass(frozen=True)
class TraySummary:
    level: str  # serving, degraded or down
    headline: str  # short: "GPU serving", "CPU fallback active", ...
    tooltip: str  # one line with the essentials
    simulated: bool


def worker_state(status: dict[str, Any], role: str) -> str:
    worker = (status.get("workers") or {}).get(role) or {}
    return str(worker.get("state") or "unknown")


def device_label(status: dict[str, Any]) -> str:
    """ "simulated 4.00 GiB" or the GPU's name and size."""
    device = status.get("device") or {}
    plan = status.get("plan") or {}
    total = device.get("total_bytes") or plan.get("total_bytes")
    size = format_size(total) if total else ""
    if status.get("simulated") or device.get("simulated"):
        return f"simulated {size}".strip()
    name = str(device.get("name") or "GPU")
    return f"{name} {size}".strip()


def caps_label(status: dict[str, Any]) -> str:
    caps = status.get("caps") or {}
    n_ctx = caps.get("n_ctx")
    parallel = caps.get("n_parallel")
    if not n_ctx:
        return "no GPU context"
    per_seq = caps.get("n_ctx_per_seq") or n_ctx
    if parallel and parallel > 1:
        return f"context {per_seq:,} × {parallel} parallel"
    return f"context {per_seq:,}"


def _level_and_headline(status: dict[str, Any], active_fallbacks: int) -> tuple[str, str]:
    gpu = worker_state(status, "gpu")
    cpu = worker_state(status, "cpu")
    if gpu == "ready":
        if active_fallbacks:
            noun = "job" if active_fallbacks == 1 else "jobs"
            return DEGRADED, f"GPU serving, {active_fallbacks} {noun} on CPU fallback"
        return SERVING, "GPU serving"
    if gpu in RECOVERING_STATES:
        verb = "starting" if gpu == "starting" else "restarting"
        if cpu == "ready":
            return DEGRADED, f"GPU worker {verb}, CPU serving"
        return DEGRADED, f"GPU worker {verb}"
    if cpu == "ready":
        return DEGRADED, f"GPU worker {gpu}, CPU fallback active"
    return DOWN, f"GPU worker {gpu}, CPU worker {cpu}"


def summarize(
    status: dict[str, Any] | None, reachable: bool, active_fallbacks: int = 0, starting: bool = False
) -> TraySummary:
    """The tray's level, headline and tooltip from the last /failsoft/status (None: never reached)."""
    if starting and (not reachable or status is None):
        return TraySummary(DEGRADED, "Starting the service…", "Failsoft: starting the service…", False)
    if not reachable or status is None:
        return TraySummary(DOWN, "Service not reachable", "Failsoft: service not reachable", False)
    level, headline = _level_and_headline(status, active_fallbacks)
    pending = int((status.get("approvals") or {}).get("pending") or 0)
    depth = int((status.get("queue") or {}).get("depth") or 0)
    parts = [headline, device_label(status), caps_label(status)]
    if depth:
        parts.append(f"{depth} queued")
    if pending:
        parts.append(f"{pending} awaiting approval")
    tooltip = "Failsoft: " + " · ".join(part for part in parts if part)
    return TraySummary(level, headline, tooltip, bool(status.get("simulated")))
