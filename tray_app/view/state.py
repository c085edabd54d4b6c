"""What the tray shows, worked out from `/failsoft/status` (the contract's `ServiceStatus`): no Qt here, so it
is tested as plain data. Every field is read with `.get`: a status folded from events, or from an older
service, may lack some."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tray_app.contract.sizes import format_size
from tray_app.contract.status import ModelStatus, ServiceStatus, WorkerStatus

SERVING = "serving"
DEGRADED = "degraded"
DOWN = "down"

# Worker states in which the worker is on its way back rather than gone.
RECOVERING_STATES = {"starting", "restarting", "unhealthy"}
# Worker states with no requests to count: its slots are not shown.
IDLE_STATES = {"stopped", "failed", "absent"}

# Where a library model is (`ModelStatus.where`), in words; the tray has words for every value.
WHERE_WORDS = {
    "gpu": "on the GPU",
    "cpu": "on the CPU",
    "gpu+cpu": "on the GPU and the CPU",
    "loading": "loading…",
    "unloading": "unloading…",
    "not loaded": "not loaded",
}
DEVICE_NAMES = {"gpu": "GPU", "cpu": "CPU"}


@dataclass(frozen=True)
class TraySummary:
    level: str  # serving, degraded or down
    headline: str  # short: "GPU serving", "CPU fallback active", ...
    tooltip: str  # one line with the essentials
    simulated: bool


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "unknown"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
    return f"{seconds // 3600:.0f} h {(seconds % 3600) // 60:02.0f} min"


def _plural(count: int, one: str, many: str) -> str:
    return one if count == 1 else many.format(count)


def worker_state(status: ServiceStatus, role: str) -> str:
    worker = (status.get("workers") or {}).get(role) or {}
    return str(worker.get("state") or "unknown")


def worker_line(role: str, worker: WorkerStatus) -> str:
    """ "GPU worker: ready · 1/4 slots busy · pid 4242 · 180.00 MiB"."""
    parts = [f"{role.upper()} worker: {worker.get('state') or 'unknown'}"]
    if worker.get("slots") and worker.get("state") not in IDLE_STATES:
        parts.append(f"{worker.get('in_flight') or 0}/{worker['slots']} slots busy")
    if worker.get("pid"):
        parts.append(f"pid {worker['pid']}")
    if rss := worker.get("rss_bytes"):
        parts.append(format_size(rss))
    if worker.get("restarts"):
        parts.append(_plural(int(worker["restarts"]), "1 restart", "{} restarts"))
    return " · ".join(parts)


def device_label(status: ServiceStatus) -> str:
    """ "simulated 4.00 GiB" or the GPU's name and size."""
    device = status.get("device") or {}
    plan = status.get("plan") or {}
    total = device.get("total_bytes") or plan.get("total_bytes")
    size = format_size(total) if total else ""
    if status.get("simulated") or device.get("simulated"):
        return f"simulated {size}".strip()
    name = str(device.get("name") or "GPU")
    return f"{name} {size}".strip()


def caps_label(status: ServiceStatus) -> str:
    caps = status.get("caps") or {}
    n_ctx = caps.get("n_ctx")
    parallel = caps.get("n_parallel")
    if not n_ctx:
        return "no GPU context"
    per_seq = caps.get("n_ctx_per_seq") or n_ctx
    if parallel and parallel > 1:
        return f"context {per_seq:,} × {parallel} parallel"
    return f"context {per_seq:,}"


def _level_and_headline(status: ServiceStatus, active_fallbacks: int) -> tuple[str, str]:
    gpu = worker_state(status, "gpu")
    cpu = worker_state(status, "cpu")
    path = str((status.get("gpu_path") or {}).get("state") or "normal")
    if path in ("yielded", "lost") and gpu != "ready":
        # On purpose, or the card failed: the GPU worker's own state says less than that.
        if cpu == "ready":
            return DEGRADED, f"GPU {path}, CPU serving"
        return DOWN, f"GPU {path}, CPU worker {cpu}"
    if path == "squeezed":
        serving = "GPU serving" if gpu == "ready" else f"GPU worker {gpu}"
        return DEGRADED, f"{serving}, squeezed by another program"
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
    status: ServiceStatus | None, reachable: bool, active_fallbacks: int = 0, starting: bool = False
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


# The model library (`status["models"]`, main model first); a service without a library has no "models" and
# the tray shows none.


def device_name(device: str) -> str:
    """ "GPU", "CPU"; an unknown device keeps its own name, so a CPU answer is never called "GPU"."""
    return DEVICE_NAMES.get(device, device.upper() or "unknown device")


def where_text(where: str) -> str:
    return WHERE_WORDS.get(where, where or "unknown")


def library(status: ServiceStatus) -> list[ModelStatus]:
    return [m for m in status.get("models") or [] if isinstance(m, dict) and m.get("name")]


def is_loaded(model: ModelStatus) -> bool:
    return str(model.get("where") or "not loaded") not in ("not loaded", "loading")


def model_line(model: ModelStatus) -> str:
    """ "gemma3-270m · on the GPU · 300.00 MiB VRAM · unloads in 42 s"."""
    parts = [str(model["name"])]
    if model.get("main"):
        parts.append("main")
    parts.append(where_text(str(model.get("where") or "")))
    vram = int(model.get("vram_bytes") or 0)
    if vram > 0:
        parts.append(f"{format_size(vram)} VRAM")
    in_flight = int(model.get("in_flight") or 0)
    if in_flight:
        parts.append(_plural(in_flight, "1 request running", "{} requests running"))
    unload_in = model.get("unload_in")
    if isinstance(unload_in, int | float):
        parts.append(f"unloads in {format_duration(unload_in)}")
    return " · ".join(parts)


def model_worker(status: ServiceStatus, role: str) -> WorkerStatus:
    """A model's worker by role: the main model's are in "workers", the others' in "library_workers"."""
    for workers in (status.get("library_workers"), status.get("workers")):
        worker = (workers or {}).get(role)
        if isinstance(worker, dict):
            return worker
    return {}


def model_details(model: ModelStatus, status: ServiceStatus) -> list[str]:
    """The lines of a model's submenu above its actions."""
    lines = []
    if model.get("aliases"):
        lines.append("Also called " + ", ".join(str(alias) for alias in model["aliases"]))
    devices = [device_name(str(device)) for device in model.get("devices") or []]
    if devices:
        lines.append("May run on the " + " or the ".join(devices))
    if model.get("stand_in"):
        lines.append(f"Stand-in on the GPU: {model['stand_in']}")
    keep_alive = float(model.get("keep_alive") or 0)
    if model.get("main") or keep_alive < 0:
        lines.append("Always kept loaded")
    else:
        lines.append(f"Unloads {format_duration(keep_alive)} after its last request")
    idle = model.get("idle_seconds")
    if isinstance(idle, int | float) and is_loaded(model):
        lines.append(f"Idle for {format_duration(idle)}")
    if not model.get("main"):  # the main model's workers have their own menus
        for device, role in (model.get("workers") or {}).items():
            worker = model_worker(status, str(role))
            line = f"{device_name(str(device))} worker {role}: {worker.get('state') or 'not running'}"
            if worker.get("pid"):
                line += f" · pid {worker['pid']}"
            if rss := worker.get("rss_bytes"):
                line += f" · {format_size(rss)}"
            lines.append(line)
    return lines


def load_block(model: ModelStatus) -> str:
    """Why "Load" is off for a model, in words; "" when it can be loaded."""
    where = str(model.get("where") or "not loaded")
    if model.get("main"):
        return "The main model is always loaded; its workers have their own menus"
    if where == "loading":
        return "Loading now"
    if where != "not loaded":
        return f"Already loaded {where_text(where)}"
    return ""


def unload_block(model: ModelStatus) -> str:
    """Why "Unload" is off for a model, in words; "" when it can be unloaded."""
    in_flight = int(model.get("in_flight") or 0)
    if model.get("main"):
        return "The main model is never unloaded"
    if in_flight:
        running = _plural(in_flight, "1 request runs", "{} requests run")
        return f"{running} on it; it can be unloaded when they end"
    if str(model.get("where") or "not loaded") == "not loaded":
        return "Not loaded"
    return ""


def gpu_guests(status: ServiceStatus) -> list[ModelStatus]:
    """The other models holding GPU memory now: each is a share of the device beside the main model's."""
    return [m for m in library(status) if not m.get("main") and int(m.get("vram_bytes") or 0) > 0]
