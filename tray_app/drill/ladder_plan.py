"""Scenarios h to j before they play (pure): which models they use, how much simulated VRAM pushes the big one
off the GPU, each model's context, who should answer, and why a scenario cannot run against this service.

The ladder: a request for a model that cannot answer on the GPU goes to its stand-in on the GPU (route gpu,
reason stand_in, never silent: the answer names both models), else to the model's own CPU worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from tray_app.contract.sizes import format_size
from tray_app.contract.status import ModelStatus, ServiceStatus, WorkerStatus
from tray_app.drill.client import DrillError
from tray_app.drill.expected import WHILE_BUSY_OWN_CPU, WHILE_BUSY_STAND_IN
from tray_app.drill.records import Expectation, answerer


@dataclass(frozen=True)
class LadderModels:
    """The models the scenarios use, from the service's status."""

    big: ModelStatus  # a library model with a stand-in, that may use the GPU
    stand_in: ModelStatus  # its stand-in
    other: ModelStatus | None  # a second library model with a GPU plan (neither of those two), for j


def find_models(status: ServiceStatus) -> LadderModels | str:
    """The first library model with a stand-in (one with a GPU plan before one without), its stand-in and a
    second library model for j; or why there is none (the reason a scenario is skipped)."""
    models = status["models"]
    by_name = {name: model for model in models for name in (model["name"], *model["aliases"])}
    candidates = [
        model
        for model in models
        if not model["main"]
        and model["stand_in"]
        and "gpu" in model["devices"]
        and model["stand_in"] in by_name
    ]
    if not candidates:
        return (
            "the service has no library model with a stand-in that may use the GPU (the drill's own service "
            "adds one; for --url, configure a [[models]] entry with stand_in)"
        )
    big = next((model for model in candidates if model["plan"] is not None), candidates[0])
    stand_in = by_name[str(big["stand_in"])]
    other = next(
        (
            model
            for model in models
            if not model["main"]
            and model["name"] not in (big["name"], stand_in["name"])
            and "gpu" in model["devices"]
            and model["plan"] is not None
        ),
        None,
    )
    return LadderModels(big, stand_in, other)


def model_named(status: ServiceStatus, name: str) -> ModelStatus:
    found = next((model for model in status["models"] if model["name"] == name), None)
    if found is None:
        raise DrillError(f"the service's status has no model {name!r} any more")
    return found


def share_free(status: ServiceStatus) -> int:
    """What the main model's plans leave free on the GPU: the library's share (as the service plans it)."""
    plan = status.get("embeddings_plan") or status["plan"]
    return int(plan.get("free_bytes") or 0)


def gpu_need(model: ModelStatus) -> int | None:
    """What `model` needs of the library's share: 0 for the main model (its own plan); None without a
    GPU plan."""
    if model["main"]:
        return 0
    plan = model["plan"]
    if plan is None:
        return None
    return int(plan["weights_bytes"]) + int(plan["kv_bytes"]) + int(plan["compute_bytes"])


def share_target(models: LadderModels) -> int | str:
    """The library share to leave: less than the big model's weights, not less than what its stand-in needs
    there (nothing for the main model). 0: the big model has no GPU plan even now. A string: why no share
    does it."""
    big, stand_in = models.big, models.stand_in
    if big["plan"] is None:
        return 0
    need = gpu_need(stand_in)
    if need is None:
        return f"the stand-in {stand_in['name']} has no GPU plan either"
    weights = int(big["plan"]["weights_bytes"])
    if need >= weights:
        return (
            f"the stand-in {stand_in['name']} needs {format_size(need)} on the GPU, not less than "
            f"{big['name']}'s weights ({format_size(weights)}): no pressure leaves room for one only"
        )
    return (need + weights) // 2


def pressure_bytes(status: ServiceStatus, models: LadderModels) -> int | str:
    """Simulated VRAM to take so that the big model's weights no longer fit in the library's share while its
    stand-in still does (the main model's plan keeps its size: the share shrinks by what is taken). 0: the big
    model has no GPU plan even now. A string: why no amount does it."""
    target = share_target(models)
    if isinstance(target, str) or not target:
        return target
    return max(share_free(status) - target, 1)


def cpu_context(status: ServiceStatus, model: ModelStatus) -> int:
    """Tokens per request on `model`'s CPU worker (its profile's context over its slots); 0 without one."""
    if model["main"]:
        return int(status["caps"]["cpu_n_ctx"])
    role = model["workers"].get("cpu")
    worker: WorkerStatus = status["library_workers"].get(role, {}) if role else {}
    profile = worker.get("profile") or {}
    return int(profile.get("n_ctx") or 0) // max(int(profile.get("n_parallel") or 1), 1)


def model_context(status: ServiceStatus, model: ModelStatus) -> int:
    """The context one request for `model` may use, as the service counts it: its GPU plan's per slot, else
    its CPU's."""
    if model["main"]:
        return int(status["caps"]["n_ctx_per_seq"])
    plan = model["plan"]
    return int(plan["n_ctx_per_seq"]) if plan is not None else cpu_context(status, model)


def on_device(model: str, device: str, stand_in_for: str = "") -> str:
    """Who should answer, in the words `records.answerer` uses for who did."""
    return answerer({"model": model, "device": device, "stand_in_for": stand_in_for})


def eviction_skip(status: ServiceStatus, models: LadderModels | str, max_loaded: int | None) -> str:
    """Why scenario j cannot force an eviction against this service; empty when it can."""
    if isinstance(models, str):
        return models
    if models.big["plan"] is None:
        return f"{models.big['name']} has no GPU plan on this device: nothing to load or unload there"
    if models.other is None:
        return (
            "the service has no second library model with a GPU plan (besides "
            f"{models.big['name']} and its stand-in): nothing to evict for"
        )
    need = (gpu_need(models.big) or 0) + (gpu_need(models.other) or 0)
    if max_loaded == 1 or need > share_free(status):
        return ""
    limit = "unknown" if max_loaded is None else str(max_loaded)
    return (
        f"{models.big['name']} and {models.other['name']} fit on the GPU together ({format_size(need)} of a "
        f"{format_size(share_free(status))} share) and library.max_loaded is {limit}: loading one never "
        "unloads the other (the drill's own service sets max_loaded 1)"
    )


def while_busy(
    models: LadderModels, stand_in_enabled: bool, max_loaded: int | None
) -> tuple[Expectation, str] | str:
    """j's second request, for the big model while the other one is busy: (what must happen, who answers),
    or why this service leaves it open. The main model's GPU worker is always there for a stand-in; a library
    stand-in finds no place while the busy model holds library.max_loaded 1."""
    big, stand_in = models.big, models.stand_in
    if stand_in_enabled and stand_in["main"]:
        return WHILE_BUSY_STAND_IN, on_device(stand_in["name"], "gpu", big["name"])
    if stand_in_enabled and max_loaded != 1:
        return (
            f"whether {stand_in['name']}, {big['name']}'s stand-in, can load beside a busy library model "
            "depends on their sizes: j needs the main model as the stand-in or library.max_loaded 1"
        )
    if "cpu" not in big["devices"]:
        return f"{big['name']} may not use the CPU: no rung below its stand-in"
    return WHILE_BUSY_OWN_CPU, on_device(big["name"], "cpu")


def ladder_why(route: str, reason: str, asked: str) -> str:
    """Why a request for `asked` went where it did, in words."""
    if reason == "stand_in":
        return (
            f"{asked} could not answer on the GPU and the request allowed a stand-in: its stand-in answered "
            "there (failsoft.model, stand_in_for and X-Failsoft-Model say so)"
        )
    if route == "cpu":
        return (
            f"{asked} could not answer on the GPU and no stand-in might ({reason}): its own CPU worker, "
            "loaded on demand, by the CPU policy (fast enough for the deadline)"
        )
    if route == "gpu":
        return f"{asked} answered on its own GPU worker"
    return f"{route} ({reason})"
