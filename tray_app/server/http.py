"""The HTTP pieces every route shares: the outermost layer (who may call, CORS, errors in the caller's API's
shape), reading bodies within a size limit, a job's identity headers, and the error answers."""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from tray_app.config import ServerConfig
from tray_app.jobs.registry import Job
from tray_app.reach import admin_token
from tray_app.server.dialect import OPENAI, Dialect, dialect_for
from tray_app.server.errors import ApiError
from tray_app.server.health import HEALTH_PATHS
from tray_app.server.origin_guard import OriginGuard
from tray_app.server.requests import parse_json_object
from tray_app.server.status_page import session

log = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[ASGIApp]]
INTERNAL_ERROR = ApiError(500, "internal error in the router", type="server_error", code="internal_error")
# The scope key of a request's arrival at the application (time.perf_counter()), where the router's own time
# on a stream's way to its first token starts (jobs.path_timing).
RECEIVED_AT = "failsoft.received_at"


def error_response(error: ApiError, headers: dict[str, str] | None = None, api: Dialect = OPENAI) -> Response:
    """The error in the OpenAI format, or in the shape of the API the request came in (`api`)."""
    return Response(
        api.error_body(error.status, error.message, error.body_bytes()),
        status_code=error.status,
        media_type="application/json",
        headers={**error.headers, **(headers or {})},
    )


class AuthAndErrors:
    """Outermost layer: who may call (Host, Origin, the API key; see origin_guard), JSON-only control
    requests, CORS for allowed origins, and an OpenAI-format answer for anything unexpected.

    The generation routes (`direct`, by path, POST only) are called from here rather than through
    Starlette's routing and middleware: they carry every token, and those layers cost them a fixed share of
    each request and of every chunk. Everything else goes to `app`."""

    def __init__(
        self,
        app: ASGIApp,
        api_key: str,
        direct: dict[str, Handler] | None = None,
        server: Callable[[], ServerConfig] | None = None,
        admin: str = "",
        dialects: tuple[Dialect, ...] = (),
        session_valid: Callable[[str], bool] | None = None,
    ) -> None:
        self.app = app
        self.session_valid = session_valid  # the status page's login cookie (reach.capability.Signer)
        self.api_key = api_key
        self.admin = admin  # the control API's token (reach/admin_token.py); "" refuses every admin route
        self.dialects = dialects  # refusals come in the caller's API's error shape
        self.direct = direct or {}
        if server is None:
            fixed = ServerConfig(api_key=api_key)
            server = lambda: fixed  # noqa: E731
        self.guard = OriginGuard(server, api_key)
        if isinstance(app, Starlette):
            # An ApiError a route lets out (e.g. read_body's 413) is that answer, in the caller's API's shape,
            # never a 500.
            app.add_exception_handler(ApiError, self._api_error)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope[RECEIVED_AT] = time.perf_counter()
        verdict = self.guard.check(scope)
        api = dialect_for(scope["path"], self.dialects)  # refused in the shape the caller's API uses
        if verdict.error is not None:
            await error_response(verdict.error, api=api)(scope, receive, send)
            return
        if verdict.preflight:
            await Response(status_code=204, headers=_headers(verdict.cors_headers))(scope, receive, send)
            return
        if verdict.cors_headers:
            send = _with_headers(send, verdict.cors_headers)
        # The status page's login stands for the owner: the API key and the admin token both (on what the
        # request may ride on it for: session.has_session).
        logged_in = self.session_valid is not None and session.has_session(
            scope, self.guard.server(), self.session_valid
        )
        if (
            self.api_key
            and scope["path"] not in HEALTH_PATHS
            and not session.is_page_path(scope["path"])
            and not logged_in
            and not self._authorized(scope)
        ):
            error = ApiError(
                401,
                "Incorrect or missing API key (send Authorization: Bearer <key>, or x-api-key: <key>)",
                code="invalid_api_key",
            )
            await error_response(error, {"WWW-Authenticate": "Bearer"}, api)(scope, receive, send)
            return
        if admin_token.needs_token(scope["path"]) and not logged_in and not self._admin(scope):
            error = ApiError(
                401,
                f"this control route needs the admin token: send {admin_token.HEADER}: <token>, read from "
                f"the file {admin_token.FILE_NAME} in Failsoft's data folder (the tray and the failsoft "
                "commands do this)",
                code="admin_token_required",
            )
            await error_response(error, api=api)(scope, receive, send)
            return
        refused = OriginGuard.check_control_body(scope)
        if refused is not None:
            await error_response(refused, api=api)(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            handler = self.direct.get(scope["path"]) if scope["method"] == "POST" else None
            if handler is not None:
                response = await handler(Request(scope, receive))
                await response(scope, receive, tracking_send)
            else:
                await self.app(scope, receive, tracking_send)
        except ApiError as error:
            if started:
                raise
            await error_response(error, api=api)(scope, receive, send)
        except Exception:
            log.exception("unhandled error on %s", scope.get("path"))
            if started:
                raise
            await error_response(INTERNAL_ERROR, api=api)(scope, receive, send)

    async def _api_error(self, request: Request, exc: Exception) -> Response:
        error = exc if isinstance(exc, ApiError) else INTERNAL_ERROR
        return error_response(error, api=dialect_for(request.url.path, self.dialects))

    def _admin(self, scope: Scope) -> bool:
        header = admin_token.HEADER.lower().encode("ascii")
        sent = next((value for name, value in scope.get("headers", []) if name == header), None)
        return admin_token.matches(sent, self.admin)

    def _authorized(self, scope: Scope) -> bool:
        """The key as a bearer token, or in `x-api-key` (where Anthropic's clients send it)."""
        expected = self.api_key.encode("utf-8")
        for name, value in scope.get("headers", []):
            # Compared as bytes: a token with non-ASCII characters is a wrong key (401), not an error.
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), expected):
                    return True
            elif name == b"x-api-key" and hmac.compare_digest(value.strip(), expected):
                return True
        return False


def _headers(pairs: tuple[tuple[bytes, bytes], ...]) -> dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in pairs}


def _with_headers(send: Send, extra: tuple[tuple[bytes, bytes], ...]) -> Send:
    """`send` with `extra` headers added to the response start (CORS for an allowed origin)."""

    async def sending(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return sending


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or 413 as soon as it is known to be larger than `limit`."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise _too_large(limit)
    # From the ASGI messages themselves: Starlette's request.stream() costs each request a fixed share
    # before it can go to its worker.
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def read_translated(
    request: Request, limit: int, translate: Callable[[dict[str, Any]], dict[str, Any]]
) -> tuple[dict[str, Any], bytes]:
    """The body of a request in another API (a JSON object), and the OpenAI request it translates into:
    ApiError (400, 413) when it cannot be read or translated."""
    body = parse_json_object(await read_body(request, limit))
    return body, json.dumps(translate(body)).encode()


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is larger than {limit} bytes", code="request_too_large")


async def wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


JOB_TOKEN_HEADER = "X-Failsoft-Job-Token"


def job_headers(job: Job, complete: bool = True) -> dict[str, str]:
    """Who answers, and the job's read token: only its creator gets it, and reads the job back with it."""
    headers = {"X-Request-Id": job.request_id, "X-Failsoft-Job": job.id, JOB_TOKEN_HEADER: job.read_token}
    if job.model:  # who answers: named before the first token, never left for the client to guess
        headers["X-Failsoft-Model"] = job.model
        headers["X-Failsoft-Device"] = job.route if job.route in ("gpu", "cpu") else ""
    if complete:
        headers["X-Failsoft-Worker"] = job.worker or ""
        headers["X-Failsoft-Attempts"] = str(job.attempts)
    return headers


async def not_found(request: Request, exc: Exception, dialects: tuple[Dialect, ...] = ()) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")
    message = f"{request.method} {request.url.path}: {detail}"
    if status == 404 and _served(request, "/v1" + request.url.path):
        # llama-server also answers its own formats here (/completions, /embeddings): this router
        # speaks OpenAI's, under /v1.
        message += f". OpenAI's API is under /v1 here: {request.method} /v1{request.url.path}"
    error = ApiError(status, message, code=code)
    return error_response(error, api=dialect_for(request.url.path, dialects))


def _served(request: Request, path: str) -> bool:
    return any(getattr(route, "path", None) == path for route in request.app.routes)
