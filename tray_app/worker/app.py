"""The worker's ASGI app: /health and /debug/faults answered here, streamed completions by `lean_stream`,
everything else by llama-cpp-python's app.

/health never touches the model or its lock: it reads `WorkerState`, so it answers while a generation runs
(generation happens in a thread-pool thread with the GIL released inside llama.cpp). Until the model is
loaded, model routes answer 503 in the OpenAI error format.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from tray_app.worker import lean_stream
from tray_app.worker.errors import openai_error
from tray_app.worker.state import WorkerState

CONTROL_PATHS = frozenset({"/health", "/debug/faults"})
_ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]


def _control_app(state: WorkerState) -> Starlette:
    async def health(_request: Request) -> JSONResponse:
        return JSONResponse(state.health())

    async def arm_fault(request: Request) -> JSONResponse:
        if state.faults is None:
            return openai_error(
                404, "fault injection is off (start the worker with --enable-faults)", "not_found"
            )
        try:
            body: Any = json.loads(await request.body())
        except json.JSONDecodeError as error:
            return openai_error(400, f"body is not JSON: {error}", "invalid_request_error")
        if not isinstance(body, dict):
            return openai_error(400, "body must be a JSON object", "invalid_request_error")
        kind, after = body.get("kind"), body.get("after_tokens", 0)
        if not isinstance(after, int) or isinstance(after, bool):
            return openai_error(
                400, "after_tokens must be a whole number", "invalid_request_error", param="after_tokens"
            )
        try:
            fault = state.faults.arm(str(kind), after)
        except ValueError as error:
            return openai_error(400, str(error), "invalid_request_error", param="kind")
        return JSONResponse({"armed": {"kind": fault.kind, "after_tokens": fault.after_tokens}})

    async def not_ready(_request: Request) -> JSONResponse:
        if state.phase == "failed":
            return openai_error(
                503, f"the model failed to load: {state.error}", "unavailable", "model_failed"
            )
        return openai_error(503, "the model is still loading", "unavailable", "model_loading")

    routes = [Route("/health", health, methods=["GET"])]
    if state.faults is not None:
        routes.append(Route("/debug/faults", arm_fault, methods=["POST"]))
    routes.append(Route("/{path:path}", not_ready, methods=_ALL_METHODS))
    return Starlette(routes=routes)


class WorkerApp:
    """Dispatch: control paths (and anything before the model is ready) here, the rest to the model app."""

    def __init__(self, state: WorkerState) -> None:
        self._state = state
        self._control = _control_app(state)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        model_app = self._state.model_app
        if scope["type"] == "lifespan" or model_app is None or scope.get("path") in CONTROL_PATHS:
            await self._control(scope, receive, send)
            return
        if lean_stream.handles(scope):
            await lean_stream.serve(scope, receive, send, model_app)
            return
        await model_app(scope, receive, send)
