"""`GET /health` (and `/v1/health`): whether the router can answer a chat now, for uptime monitors, container
health checks and clients that wait for a server, in llama-server's own shape (200 `{"status": "ok"}`, 503
"Loading model" while nothing can answer yet). Like llama-server's, it needs no API key: it tells only the
workers' states."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

HEALTH_PATHS = ("/health", "/v1/health")

# A worker in one of these will answer soon: the router queues a request for it meanwhile.
_COMING = ("starting", "restarting", "unhealthy")


def health_answer(states: Mapping[str, str], simulated: bool) -> tuple[int, dict[str, Any]]:
    """The status and body for the chat workers' `states` (by role).

    Ready when one chat worker is ready, or stopped and so started by the next request (a CPU worker that
    is not kept warm, a model unloaded after its keep-alive). Loading while none is, but one is starting
    or restarting. Unavailable when every one has failed, is stopping or is absent."""
    shown = {"workers": dict(states), "simulated": simulated}
    values = states.values()
    if "ready" in values or ("stopped" in values and not any(state in _COMING for state in values)):
        return 200, {"status": "ok", **shown}
    if any(state in _COMING for state in values):
        message, status = "Loading model", "loading"
    else:
        described = ", ".join(f"{role} {state}" for role, state in states.items())
        message, status = f"no worker can answer ({described})", "unavailable"
    error = {"code": 503, "message": message, "type": "unavailable_error"}
    return 503, {"status": status, "error": error, **shown}
