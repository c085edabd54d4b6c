"""Which service events a person away from the server is told about, in the config's words
(`[[notify]].events`): a fallback, an approval needed, a worker failed, another program took the GPU, the
GPU lost. Every other event (tokens, queue depth, budget) stays on the status page."""

from __future__ import annotations

from typing import Any

# The event types a channel may be told about, each under one config name (or decided by its state).
EVENT_NAMES: dict[str, str] = {
    "fallback_started": "fallback",
    "fallback_refused": "fallback",
    "approval_needed": "approval",
    "worker_unhealthy": "worker_failed",
    "journal_failed": "worker_failed",  # the service cannot keep jobs: as urgent as a failed worker
}


def name_of(event: dict[str, Any]) -> str | None:
    """The config name an event falls under, None when no channel is told about it."""
    kind = event.get("type")
    if kind == "gpu_path":
        state, previous = event.get("state"), event.get("previous")
        if state == "lost" or (state == "normal" and previous == "lost"):
            return "gpu_lost"
        if state in ("squeezed", "yielded") or (state == "normal" and previous in ("squeezed", "yielded")):
            return "gpu_taken"
        return None
    return EVENT_NAMES.get(str(kind))
