"""The app factory: the routes of every dialect and of the control API, mounted on the outermost layer.
Adding a dialect: its folder (paths with its `Dialect` record, translate, routes) and a line in DIALECTS plus
its routes below (docs/architecture.md, "Add a dialect")."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from tray_app.server import control
from tray_app.server.anthropic.paths import COUNT_TOKENS, MESSAGES
from tray_app.server.anthropic.paths import DIALECT as ANTHROPIC
from tray_app.server.anthropic.routes import MessagesRoutes
from tray_app.server.dialect import Dialect
from tray_app.server.health import HEALTH_PATHS
from tray_app.server.http import INTERNAL_ERROR, AuthAndErrors, Handler, error_response, not_found
from tray_app.server.jobs_api import JobsApi
from tray_app.server.ollama.paths import DIALECT as OLLAMA
from tray_app.server.ollama.paths import is_ollama_path
from tray_app.server.ollama.routes import OllamaRoutes
from tray_app.server.openai import Router
from tray_app.server.ports import ServiceView
from tray_app.server.responses.routes import PATH as RESPONSES
from tray_app.server.responses.routes import ResponsesRoute
from tray_app.server.status_page.routes import StatusPage

# The APIs besides OpenAI's whose paths answer in their own error shape (the Responses API is OpenAI's).
DIALECTS: tuple[Dialect, ...] = (OLLAMA, ANTHROPIC)


def create_app(service: ServiceView, *, manage_lifecycle: bool = True) -> ASGIApp:
    """The ASGI app. With `manage_lifecycle`, starting the app starts the service (workers and all)."""
    router = Router(service)
    jobs_api = JobsApi(router)
    ollama = OllamaRoutes(service, router)
    responses = ResponsesRoute(router)
    messages = MessagesRoutes(router)
    ctl = control.Control(service)
    generation: dict[str, Handler] = {
        "/v1/chat/completions": router.chat,
        "/chat/completions": router.chat,  # llama-server's path too: clients given a base URL without /v1
        "/v1/completions": router.completions,
        "/v1/embeddings": router.embeddings,
        RESPONSES: responses.create,
        RESPONSES.removeprefix("/v1"): responses.create,
        MESSAGES: messages.create,
        COUNT_TOKENS: messages.count_tokens,
        **ollama.direct(),
    }

    async def post_only(request: Request) -> Response:  # never called: POST goes to `generation` directly
        raise HTTPException(405)

    routes = [
        # Listed so that other methods get a 405 (POST on these paths is dispatched by AuthAndErrors).
        *(Route(path, post_only, methods=["POST"]) for path in generation if not is_ollama_path(path)),
        *(
            route
            for path in (RESPONSES, RESPONSES.removeprefix("/v1"))
            for route in (
                Route(path + "/input_tokens", responses.count_input_tokens, methods=["POST"]),
                Route(path + "/{response_id}", responses.retrieve, methods=["GET"]),
            )
        ),
        Route("/v1/models", router.models, methods=["GET"]),
        Route("/models", router.models, methods=["GET"]),
        *(Route(path, router.health, methods=["GET"]) for path in HEALTH_PATHS),
        Route("/v1/jobs", jobs_api.create, methods=["POST"]),
        Route("/v1/jobs/{job_id}", jobs_api.get, methods=["GET"]),
        Route("/v1/jobs/{job_id}", jobs_api.delete, methods=["DELETE"]),
        *ctl.routes(),
        *StatusPage(service).routes(),  # /ui/: the status page, its login, the phone's action links
        *ollama.routes(post_only),  # Ollama's API: none of its paths is a control route (ollama/paths.py)
    ]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if manage_lifecycle:
            await service.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                await service.stop()

    async def internal_error(request: Request, exc: Exception) -> Response:
        return error_response(INTERNAL_ERROR)  # Starlette logs the exception and raises it on

    async def unknown_route(request: Request, exc: Exception) -> Response:
        return await not_found(request, exc, DIALECTS)

    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        HTTPException: unknown_route,
        Exception: internal_error,
    }
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    # Outside Starlette's own middleware, so the generation routes skip it (see AuthAndErrors).
    return AuthAndErrors(
        app,
        service.cfg.server.api_key,
        direct=generation,
        server=lambda: service.cfg.server,
        admin=service.admin_token,
        dialects=DIALECTS,
        session_valid=service.signer.session_valid,
    )
