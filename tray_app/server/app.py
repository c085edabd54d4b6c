"""The HTTP face of the service: the OpenAI routes, background jobs and the control API (starlette)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tray_app import admin_token
from tray_app.budget.sizes import parse_size
from tray_app.config import ServerConfig
from tray_app.contract.events import RouteDecided
from tray_app.contract.roles import CHAT_ROLES
from tray_app.engine.tools import worker_tool_choice
from tray_app.host.library import LoadRefused
from tray_app.host.service import BACKGROUND_DEADLINE, Service
from tray_app.jobs import idempotency, policy
from tray_app.jobs.admission import QueueFull, QueueTimeout, requested_tokens
from tray_app.jobs.engine import retry_after_seconds
from tray_app.jobs.ids import new_request_id, random_seed
from tray_app.jobs.journal import StoredJob
from tray_app.jobs.outcomes import JobFailed, Piece
from tray_app.jobs.path_timing import FirstTokenPath
from tray_app.jobs.registry import Job, new_id, stored_summary
from tray_app.library.catalog import ModelEntry
from tray_app.server import control
from tray_app.server.anthropic.paths import error_body as anthropic_error
from tray_app.server.anthropic.paths import is_anthropic_path
from tray_app.server.embedding_requests import parse_embedding_request
from tray_app.server.errors import ApiError, bad_request, from_job_error, unavailable
from tray_app.server.event_stream import SSE_HEADERS, EventStreamResponse, Writer
from tray_app.server.health import HEALTH_PATHS, health_answer
from tray_app.server.ollama.paths import is_ollama_path
from tray_app.server.origin_guard import OriginGuard
from tray_app.server.requests import (
    Kind,
    ParsedRequest,
    check_model,
    check_model_name,
    keep_alive_option,
    parse_json_object,
    parse_request,
    stand_in_allowed,
)
from tray_app.server.streaming import include_usage, outcome_bytes, result_to_stream

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=8)
def _size(text: str) -> int:
    return parse_size(text)


Api = Literal["openai", "ollama", "anthropic"]


def api_of(path: str) -> Api:
    """Whose API a path belongs to: its errors come in that API's shape."""
    if is_ollama_path(path):
        return "ollama"
    return "anthropic" if is_anthropic_path(path) else "openai"


def error_response(error: ApiError, headers: dict[str, str] | None = None, api: Api = "openai") -> Response:
    """The error in the OpenAI format, in Ollama's (`{"error": "message"}`) or in Anthropic's."""
    if api == "ollama":
        body = json.dumps({"error": error.message}).encode()
    elif api == "anthropic":
        body = anthropic_error(error.status, error.message)
    else:
        body = error.body_bytes()
    return Response(
        body,
        status_code=error.status,
        media_type="application/json",
        headers={**error.headers, **(headers or {})},
    )


Handler = Callable[[Request], Awaitable[ASGIApp]]
INTERNAL_ERROR = ApiError(500, "internal error in the router", type="server_error", code="internal_error")
# The scope key of a request's arrival at the application (time.perf_counter()), where the router's own time
# on a stream's way to its first token starts (jobs.path_timing).
RECEIVED_AT = "failsoft.received_at"


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
    ) -> None:
        self.app = app
        self.api_key = api_key
        self.admin = admin  # the control API's token (tray_app.admin_token); "" refuses every admin route
        self.direct = direct or {}
        if server is None:
            fixed = ServerConfig(api_key=api_key)
            server = lambda: fixed  # noqa: E731
        self.guard = OriginGuard(server, api_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope[RECEIVED_AT] = time.perf_counter()
        verdict = self.guard.check(scope)
        api = api_of(scope["path"])  # refused in the shape the caller's API uses
        if verdict.error is not None:
            await error_response(verdict.error, api=api)(scope, receive, send)
            return
        if verdict.preflight:
            await Response(status_code=204, headers=_headers(verdict.cors_headers))(scope, receive, send)
            return
        if verdict.cors_headers:
            send = _with_headers(send, verdict.cors_headers)
        if self.api_key and scope["path"] not in HEALTH_PATHS and not self._authorized(scope):
            error = ApiError(
                401,
                "Incorrect or missing API key (send Authorization: Bearer <key>, or x-api-key: <key>)",
                code="invalid_api_key",
            )
            await error_response(error, {"WWW-Authenticate": "Bearer"}, api)(scope, receive, send)
            return
        if admin_token.needs_token(scope["path"]) and not self._admin(scope):
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
        except Exception:
            log.exception("unhandled error on %s", scope.get("path"))
            if started:
                raise
            await error_response(INTERNAL_ERROR, api=api)(scope, receive, send)

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


def job_headers(job: Job, complete: bool = True) -> dict[str, str]:
    headers = {"X-Request-Id": job.request_id, "X-Failsoft-Job": job.id}
    if job.model:  # who answers: named before the first token, never left for the client to guess
        headers["X-Failsoft-Model"] = job.model
        headers["X-Failsoft-Device"] = job.route if job.route in ("gpu", "cpu") else ""
    if complete:
        headers["X-Failsoft-Worker"] = job.worker or ""
        headers["X-Failsoft-Attempts"] = str(job.attempts)
    return headers


def _journal_unavailable(failure: str | None) -> ApiError:
    reason = failure or "the journal did not confirm the write in time"
    return unavailable(f"background jobs are not taken: {reason}", "journal_unavailable", retry_after=60)


def _effects_delivered(key: str, job_id: str) -> ApiError:
    return ApiError(
        409,
        f"the request with Idempotency-Key {key!r} (job {job_id}) failed after its tool call reached the "
        "client, so the tool's action may have run; it is not run again under this key. Send a new "
        "Idempotency-Key to run it again.",
        code="idempotency_key_effects_delivered",
        param="Idempotency-Key",
    )


def _worker_compatible(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the model's chat template takes it: content is a string
    (OpenAI clients send null next to tool calls, and arrays of text parts), and `developer` (OpenAI's newer
    name for the system role) is `system`, the role chat templates know."""
    content = message.get("content")
    if content is None and message.get("role") == "assistant":
        message = {**message, "content": ""}
    elif isinstance(content, list):
        message = {**message, "content": "\n".join(part.get("text", "") for part in content)}
    if message.get("role") == "developer":
        message = {**message, "role": "system"}
    return message


class Router:
    """The OpenAI routes. One instance per service; handlers are bound methods."""

    def __init__(self, service: Service) -> None:
        self.svc = service

    @property
    def max_body(self) -> int:
        return _size(self.svc.cfg.server.max_body)  # read each time: a config reload may change it

    # ------------------------------------------------------------------------------ helpers
    def _deadline_seconds(self, request: Request) -> float:
        value = request.headers.get("x-failsoft-deadline")
        if value is None:
            return self.svc.cfg.failover.deadline
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not 0 < seconds <= BACKGROUND_DEADLINE:
            raise ApiError(
                400,
                "X-Failsoft-Deadline must be a number of seconds > 0",
                param="X-Failsoft-Deadline",
                code="invalid_deadline",
            )
        return seconds

    def _made_under(self, key: str) -> tuple[Job | None, StoredJob | None]:
        """The latest job made under this Idempotency-Key: live, or else from the journal (24 h)."""
        live = self.svc.registry.by_key(key)
        if live is not None:
            return live, None
        return None, self.svc.journal.job_by_key(key, time.time() - idempotency.RETENTION_SECONDS)

    def _idempotent_answer(self, key: str, parsed: ParsedRequest) -> ASGIApp | None:
        """The stored answer, a 409/422, or None when this request is new under its key."""
        live, stored = self._made_under(key)
        previous = live or stored
        record = idempotency.record_of(previous) if previous is not None else None
        stored_result = previous.result if previous is not None else None
        verdict = idempotency.decide(record, parsed.body_hash, time.time())
        if verdict == "new" or record is None:
            return None
        if verdict == "effects_delivered":
            raise _effects_delivered(key, record.job_id)
        if verdict == "mismatch":
            raise ApiError(
                422,
                f"Idempotency-Key {key!r} was used with a different request body",
                code="idempotency_key_reused",
                param="Idempotency-Key",
            )
        if verdict == "in_progress":
            raise ApiError(
                409,
                f"a request with Idempotency-Key {key!r} is still running (job {record.job_id})",
                code="idempotency_key_in_progress",
                param="Idempotency-Key",
                headers={"Retry-After": "1"},
            )
        if stored_result is None:
            return None  # completed without a stored answer (cannot happen): treat as new
        headers = {"X-Failsoft-Job": record.job_id, "Idempotent-Replayed": "true"}
        failsoft = stored_result.get("failsoft") or {}
        headers["X-Failsoft-Worker"] = str(failsoft.get("worker") or "")
        headers["X-Failsoft-Attempts"] = str(failsoft.get("attempts") or 0)
        if parsed.stream:
            pieces = result_to_stream(parsed.kind, stored_result, include_usage(parsed.body))
            return StreamingResponse(
                iter(pieces), media_type="text/event-stream", headers={**SSE_HEADERS, **headers}
            )
        return Response(json.dumps(stored_result), media_type="application/json", headers=headers)

    def _model(self, name: str | None) -> ModelEntry:
        """The model a request names (none: the main model); 404 listing what exists otherwise."""
        entry = self.svc.catalog.find(name)
        if entry is None:
            check_model_name(name, self.svc.model_names)  # raises the 404 with the names
            raise AssertionError("unreachable")
        return entry

    def _new_job(self, request: Request, parsed: ParsedRequest, *, background: bool, deadline: float) -> Job:
        job = self._make_job(
            request, parsed, self._model(parsed.model), background=background, deadline=deadline
        )
        self.svc.registry.add(job)  # registers its Idempotency-Key too
        return job

    def _as_workers_take(self, kind: Kind, body: dict[str, Any], entry: ModelEntry) -> dict[str, Any]:
        """A chat's messages and tool choice as the workers' template and llama-server take them."""
        if kind != "chat":
            return body
        body = {**body, "messages": [_worker_compatible(message) for message in body["messages"]]}
        return worker_tool_choice(body, self.svc.tool_call_opener_for(entry.name))

    def count_chat(self, raw: bytes) -> int:
        """The prompt tokens of a chat request (`raw`, OpenAI's shape) on the model it names, counted as
        admission counts them; ApiError (400, 404) when the request is not one the router would take."""
        parsed = parse_request("chat", raw)
        check_model(parsed, self.svc.model_names)
        entry = self._model(parsed.model)
        return self.svc.count_prompt("chat", self._as_workers_take("chat", parsed.body, entry), entry.name)

    def _make_job(
        self,
        request: Request,
        parsed: ParsedRequest,
        entry: ModelEntry,
        *,
        background: bool,
        deadline: float,
        fit_budget: bool = False,
    ) -> Job:
        """The job for this request, checked and counted, not registered yet. `fit_budget`: a `max_tokens`
        larger than the slot's context leaves is an upper bound, not a claim (Anthropic's clients send
        their models' output limits); the job gets what the context leaves."""
        key = request.headers.get("idempotency-key")
        body = dict(parsed.body)
        keep_alive = keep_alive_option(body.pop("keep_alive", None))
        may_stand_in = stand_in_allowed(
            request.headers.get("x-failsoft-stand-in"), body.pop("stand_in", None)
        )
        body = self._as_workers_take(parsed.kind, body, entry)
        # Otherwise llama.cpp names the model by its file path in every chunk.
        body["model"] = entry.name
        if body.get("seed") is None:
            # Pinned before the first attempt, so a replay on the same weights samples the same way.
            body["seed"] = random_seed()
        if body.get("logprobs") is True and body.get("top_logprobs") == 0:
            # llama-server gives no log probabilities at all for 0 alternatives; one is the nearest it does.
            body["top_logprobs"] = 1
        grammar = body.get("grammar")
        if grammar and (problem := self.svc.tokens.grammar_error(grammar)) is not None:
            # Refused with the parser's own words before any worker sees it (tray_app.jobs.grammar_check).
            raise bad_request(f"'grammar' is not valid GBNF: {problem}", "grammar", code="invalid_grammar")
        prompt_tokens = self.svc.count_prompt(parsed.kind, body, entry.name)
        if prompt_tokens == 0:
            # Nothing to continue from: this model adds no start token to an empty prompt.
            raise bad_request("the prompt is empty", "prompt", code="empty_prompt")
        roles = self.svc.library.roles(entry)
        if not roles:
            devices = ", ".join(entry.devices)
            raise unavailable(
                f"{entry.name} has no worker here (devices: {devices})", "no_worker_for_model", 30
            )
        n_ctx = self.context_per_slot(entry)
        max_tokens = requested_tokens(prompt_tokens, parsed.max_tokens, n_ctx)
        if fit_budget:
            max_tokens = self._fitted_budget(entry, prompt_tokens, max_tokens)
        if max_tokens != parsed.max_tokens:
            body["max_tokens"] = max_tokens  # the budget admission counted is the one the worker gets
        stream = parsed.stream and not background
        received = request.scope.get(RECEIVED_AT)
        job = Job(
            id=new_id("job"),
            request_id=request.headers.get("x-request-id") or new_request_id(),
            kind=parsed.kind,
            body=body,
            stream=stream,
            background=background,
            body_hash=parsed.body_hash if key else "",  # compared under an Idempotency-Key only
            idempotency_key=key,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            deadline=time.monotonic() + deadline,
            path=FirstTokenPath(received) if stream and received is not None else None,
            asked_model=entry.name,
            models=dict.fromkeys(roles, entry.name),
            roles=roles,
            may_stand_in=may_stand_in,
        )
        self.svc.library.touch(entry.name, keep_alive)
        return job

    def _fitted_budget(self, entry: ModelEntry, prompt_tokens: int, max_tokens: int) -> int:
        """`max_tokens` as an upper bound: at most what the slot that can read the prompt leaves, a GPU
        slot's if the prompt fits one, else the CPU's (where admission then sends it)."""
        library = self.svc.library
        cpu = self.svc.plan_set.cpu.n_ctx_per_seq if entry.main else library.n_ctx_per_seq(entry, "cpu")
        for n_ctx in (self.context_per_slot(entry), cpu):
            if prompt_tokens < n_ctx:
                return min(max_tokens, n_ctx - prompt_tokens)
        return max_tokens  # no slot reads this prompt: admission refuses it, naming the prompt

    def context_per_slot(self, entry: ModelEntry) -> int:
        """The context one request may use: the GPU plan's per slot (the CPU's for a CPU-only model)."""
        if entry.main:
            return self.svc.plan_set.gpu.n_ctx_per_seq
        library = self.svc.library
        return library.n_ctx_per_seq(entry, "gpu") or library.n_ctx_per_seq(entry, "cpu")

    async def _route(self, job: Job, deadline: float) -> policy.Decision:
        entry = self._model(job.asked_model)
        n_ctx = self.context_per_slot(entry)
        request = policy.RouteRequest(
            job.prompt_tokens, job.max_tokens, n_ctx, await self._gpu_available(job, entry, n_ctx), deadline
        )
        decision = policy.route_on_gpu(request)
        if decision is None:
            decision = await self._stand_in_route(job)
        if decision is None:
            cpu = await self.svc.cpu_state(deadline, job.worker_role("cpu"))
            decision = policy.decide_route(request, cpu, self.svc.executor.settings.policy)
        route = "refused" if decision.refused else decision.action
        self.svc.bus.publish(RouteDecided(job_id=job.id, route=route, reason=decision.reason))
        return decision

    async def _gpu_available(self, job: Job, entry: ModelEntry, n_ctx: int) -> bool:
        """Whether the job's model can answer on the GPU: the main model's worker is up; another model's
        is loaded now if the request fits it (making room by unloading idle models, see host.library)."""
        if entry.main:
            return self._gpu_worker_up(job)
        role = job.worker_role("gpu")
        if role is None or self.svc.workers.get(role) is None:
            return False
        if job.prompt_tokens + job.max_tokens > n_ctx:
            return False
        wait = min(max(job.time_left(), 0.0), self.svc.cfg.supervisor.start_timeout)
        try:
            return await self.svc.library.load(entry, "gpu", wait)
        except LoadRefused as refused:
            self.svc.registry.name_fallback(job, refused.code)
            return False

    def _gpu_worker_up(self, job: Job) -> bool:
        role = job.worker_role("gpu")
        worker = self.svc.workers.get(role) if role else None
        return worker is not None and worker.state not in ("failed", "stopped")

    def _start_at_once(self, job: Job, entry: ModelEntry, deadline: float) -> float | None:
        """The GPU slot, taken, when the route is plain and free: the main model, its GPU worker up, the
        request within the GPU's context, a slot free now. None: the full route and admission decide."""
        if not entry.main:
            return None
        gpu = policy.RouteRequest(
            job.prompt_tokens,
            job.max_tokens,
            self.context_per_slot(entry),
            self._gpu_worker_up(job),
            deadline,
        )
        if policy.route_on_gpu(gpu) is None:
            return None
        return self.svc.slots.try_acquire(job.worker_role("gpu") or "gpu")

    async def _stand_in_route(self, job: Job) -> policy.Decision | None:
        """The ladder's middle rung at admission: the asked model cannot use the GPU, its stand-in can."""
        stand_in = await self.svc.stand_in(job)
        if stand_in is None:
            return None
        fits = stand_in.prompt_tokens + job.max_tokens <= stand_in.n_ctx_per_seq
        if not policy.stand_in_first(policy.StandInCase(allowed=True, available=True, fits=fits)):
            return None
        self.svc.registry.substitute(
            job, stand_in.model, stand_in.gpu_role, stand_in.prompt_tokens, policy.STAND_IN
        )
        return policy.Decision("gpu", policy.STAND_IN)

    def _refusal(self, job: Job, decision: policy.Decision) -> ApiError:
        if decision.reason == policy.CONTEXT_EXCEEDED:
            error = ApiError(
                400,
                f"This request is too long for this service: {decision.detail}",
                code=policy.CONTEXT_EXCEEDED,
                param="messages" if job.kind == "chat" else "prompt",
            )
        else:
            error = unavailable(
                f"cannot run this request: {decision.reason} ({decision.detail})",
                decision.reason,
                5,
                job_id=job.id,
                reason=decision.reason,
            )
        self.svc.registry.fail(
            job, "failed", {**error.body()["error"], "status": error.status}, decision.reason
        )
        self.svc.metrics.requests.labels(route="refused", outcome=decision.reason).inc()
        return error

    async def _admit(self, job: Job, role: str) -> float:
        wait = min(self.svc.cfg.server.queue_timeout, max(job.time_left(), 0.0))
        try:
            return await self.svc.slots.acquire(role, job.id, wait)
        except QueueFull as full:
            error = ApiError(
                429,
                f"too many requests waiting ({full.depth}); try again later",
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(full.retry_after)},
            )
        except QueueTimeout as timeout:
            error = ApiError(
                429,
                f"no free worker slot in time: {timeout}",
                type="rate_limit_error",
                code="queue_timeout",
                headers={"Retry-After": str(timeout.retry_after)},
            )
        self.svc.registry.fail(job, "failed", {**error.body()["error"], "status": error.status}, error.code)
        self.svc.metrics.requests.labels(route=role, outcome=str(error.code)).inc()
        raise error

    # ------------------------------------------------------------------------------ handlers
    async def chat(self, request: Request) -> ASGIApp:
        return await self._openai(request, "chat")

    async def completions(self, request: Request) -> ASGIApp:
        return await self._openai(request, "completion")

    async def _openai(self, request: Request, kind: Kind) -> ASGIApp:
        try:
            raw = await read_body(request, self.max_body)
        except ApiError as error:
            return error_response(error)
        return await self.generate(request, kind, raw)

    async def generate(
        self, request: Request, kind: Kind, raw: bytes, *, fit_budget: bool = False
    ) -> ASGIApp:
        """Serve an OpenAI request whose body was already read (`raw`): the OpenAI routes, and the routes
        of the other APIs with the body they translated into OpenAI's. Headers and disconnects come from
        `request`. `fit_budget`: see _make_job."""
        try:
            parsed = parse_request(kind, raw)
            check_model(parsed, self.svc.model_names)
            deadline = self._deadline_seconds(request)
            key = request.headers.get("idempotency-key")
            if key:
                stored = self._idempotent_answer(key, parsed)
                if stored is not None:
                    return stored
            entry = self._model(parsed.model)
            job = self._make_job(
                request, parsed, entry, background=False, deadline=deadline, fit_budget=fit_budget
            )
            held = self._start_at_once(job, entry, deadline)
            if held is not None:
                # The worker starts on it first; the job's journal entry and events follow in this same
                # turn of the event loop (nothing can look the job up in between), off the token's path.
                self.svc.executor.dispatch(job)
                self.svc.registry.add(job)
                self.svc.bus.publish(RouteDecided(job_id=job.id, route="gpu", reason=""))
                return await self._answer(request, job, held)
            self.svc.registry.add(job)  # registers its Idempotency-Key too
            decision = await self._route(job, deadline)
            if decision.refused:
                raise self._refusal(job, decision)
            if decision.action == "approval":
                self.svc.registry.name_fallback(job, decision.reason)
                offer = await self.svc.stand_in(job, offer=True)
                backlog_full = self.svc.executor.request_approval(
                    job, decision, offer.model if offer else None
                )
                if backlog_full is not None:
                    raise self._refusal(job, backlog_full)
                return await self._answer(request, job, None, approval=decision.reason)
            self.svc.registry.set_route(job, decision.action, decision.reason or None)
            held = await self._admit(job, job.worker_role(job.route) or job.route)
        except ApiError as error:
            return error_response(error)
        self.svc.executor.dispatch(job)  # the worker starts on it while the job's task is being set up
        return await self._answer(request, job, held)

    async def _answer(self, request: Request, job: Job, held: float | None, approval: str = "") -> ASGIApp:
        if job.stream:
            return self._stream(job, held, approval)
        if approval:
            job.task = asyncio.create_task(self._wait_approval(job, approval))
        else:
            self.svc.spawn(job, held)
        assert job.task is not None
        watcher = asyncio.create_task(wait_for_disconnect(request.receive))
        try:
            await asyncio.wait({job.task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if not job.task.done():
            job.task.cancel()  # the client is gone: stop the generation now
            self.svc.metrics.requests.labels(route=job.route, outcome="cancelled").inc()
            return Response(status_code=499)
        self.svc.metrics.requests.labels(route=job.worker or job.route, outcome=job.state).inc()
        if job.state == "completed" and job.result is not None:
            return Response(json.dumps(job.result), media_type="application/json", headers=job_headers(job))
        error = dict(job.error or {"message": "the job ended without an answer", "code": job.state})
        status = int(error.pop("status", 503))
        headers = job_headers(job)
        if status == 503:
            headers["Retry-After"] = str(retry_after_seconds(job.estimated_seconds))
        return Response(
            json.dumps({"error": error}), status_code=status, media_type="application/json", headers=headers
        )

    async def _wait_approval(self, job: Job, reason: str) -> None:
        async for _ in self.svc.executor.wait_for_final(job, False, reason):
            pass

    def _stream(self, job: Job, held: float | None, approval: str) -> EventStreamResponse:
        writer = Writer()
        executor = self.svc.executor

        async def pump() -> None:
            timed = job.path is None  # the first output's way is recorded once
            try:
                source = (
                    executor.wait_for_final(job, True, approval)
                    if approval
                    else executor.run(job, deliver=True, held_slot=held)
                )
                # Closed however the pump ends: a cancel that lands in a blocked write to the client (it
                # left, or stopped reading) must still end the job and free its slot, in the generator.
                async with contextlib.aclosing(source):
                    async for piece in source:
                        # Finished and Ended are always a job's last outcome: they end the response. A
                        # piece with no output (a finish) waits for what comes next: one write, not two.
                        # (The role comes attached to the first token already, see Executor._attempt.)
                        output = not isinstance(piece, Piece) or piece.output
                        written = await writer.write(
                            outcome_bytes(job, piece), hold=not output, last=not isinstance(piece, Piece)
                        )
                        if not timed and isinstance(piece, Piece) and piece.output:
                            timed = True
                            self._first_output_written(job, written)
            finally:
                writer.close()

        job.task = asyncio.create_task(pump(), name=f"stream-{job.id}")

        def stop_job() -> None:
            if job.task is not None and not job.task.done():
                job.task.cancel()  # the client went away mid-stream

        def count() -> None:
            stop_job()  # the response ended early (an error while writing): nobody reads the job any more
            self.svc.metrics.requests.labels(route=job.worker or job.route, outcome=job.state).inc()

        stall = self.svc.executor.settings.stall_seconds

        def drop_stalled_client() -> None:
            log.warning("job %s: the client read nothing for %.0f s; dropped", job.id, stall)
            self.svc.registry.fail(
                job,
                "cancelled",
                {"message": f"the client stopped reading for {stall:.0f} s", "code": "client_stalled"},
                "client_disconnected",  # dropped by the router: the slot is free again
            )
            stop_job()

        return EventStreamResponse(
            writer,
            job_headers(job, False),
            on_disconnect=stop_job,
            on_end=count,
            keepalive=self.svc.cfg.server.keepalive_seconds,
            stall=stall,
            on_stall=drop_stalled_client,
        )

    def _first_output_written(self, job: Job, written: bool) -> None:
        """The stream's first output went to the client (`written`: now, not kept for the status line): the
        router's own time on its way is recorded if the first attempt brought it (see jobs.path_timing)."""
        path = job.path
        if written and path is not None and path.from_worker:
            self.svc.path_timings.record(path, time.perf_counter())

    async def embeddings(self, request: Request) -> ASGIApp:
        try:
            raw = await read_body(request, self.max_body)
        except ApiError as error:
            return error_response(error)
        return await self.embed(request, raw)

    async def embed(self, request: Request, raw: bytes) -> Response:
        """Serve an embeddings request whose body was already read: `/v1/embeddings`, and Ollama's
        `/api/embed` with the body it translated. The answer carries the identity headers and object."""
        job: Job | None = None
        try:
            parsed = parse_embedding_request(raw)
            check_model_name(parsed.model, self.svc.model_names)
            deadline = self._deadline_seconds(request)
            job = Job(
                id=new_id("job"),
                request_id=request.headers.get("x-request-id") or new_request_id(),
                kind="embedding",
                body=parsed.body,
                stream=False,
                background=False,
                body_hash="",  # compared under an Idempotency-Key only, and an embedding takes none
                idempotency_key=None,  # nothing to protect: an embedding has no effects
                prompt_tokens=0,
                max_tokens=0,
                deadline=time.monotonic() + deadline,
            )
            self.svc.registry.add(job)
            answer = await self.svc.embeddings.run(job)
        except JobFailed as failed:
            return error_response(from_job_error(failed.error), job_headers(job) if job else None)
        except ApiError as error:
            return error_response(error, job_headers(job) if job else None)
        outcome = "completed" if job.state == "completed" else job.state
        self.svc.metrics.requests.labels(route=f"embed-{job.worker}", outcome=outcome).inc()
        return Response(json.dumps(answer), media_type="application/json", headers=job_headers(job))

    async def health(self, request: Request) -> Response:
        states: dict[str, str] = {role: self.svc.worker_status(role)["state"] for role in CHAT_ROLES}
        status, body = health_answer(states, self.svc.plan_set.device.simulated)
        return JSONResponse(body, status_code=status)

    async def models(self, request: Request) -> Response:
        """Every model a request may name, the main one first, each with where it is loaded now."""
        statuses = self.svc.library.status(self.svc.plan_set, self.svc.slots.in_flight)
        started = datetime.fromtimestamp(self.svc.started_at, UTC).isoformat().replace("+00:00", "Z")
        data = []
        for status in statuses:
            extra: dict[str, Any] = {
                "path": status["path"],
                "aliases": [name for name in status["aliases"] if "/" not in name and "\\" not in name],
                "main": status["main"],
                "where": status["where"],
                "devices": status["devices"],
                "stand_in": status["stand_in"],
            }
            if status["main"]:
                extra["caps"] = self.svc.caps()
            data.append(
                {
                    "id": status["name"],
                    "object": "model",
                    "created": int(self.svc.started_at),
                    "owned_by": "failsoft",
                    # Anthropic's fields beside OpenAI's: its SDKs list models from the same path.
                    "type": "model",
                    "display_name": status["name"],
                    "created_at": started,
                    "failsoft": extra,
                }
            )
        first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
        page = {"has_more": False, "first_id": first, "last_id": last}  # Anthropic's one page
        return JSONResponse({"object": "list", "data": data, **page})

    # ------------------------------------------------------------------------------ background jobs
    async def create_job(self, request: Request) -> Response:
        try:
            if self.svc.journal.failure is not None:
                raise _journal_unavailable(self.svc.journal.failure)
            raw = await read_body(request, self.max_body)
            body = parse_json_object(raw)
            kind: Kind = "completion" if "prompt" in body and "messages" not in body else "chat"
            parsed = parse_request(kind, raw)
            check_model(parsed, self.svc.model_names)
            key = request.headers.get("idempotency-key")
            if key:
                existing = self._existing_job(key, parsed)
                if existing is not None:
                    return existing
            limit = self.svc.cfg.server.jobs_max
            if self.svc.registry.background_pending() >= limit:
                raise ApiError(
                    429,
                    f"{limit} background jobs are already waiting or running (server.jobs_max); "
                    "try again later",
                    type="rate_limit_error",
                    code="too_many_jobs",
                    headers={"Retry-After": "30"},
                )
            # No await between the key check and _new_job (which registers the key): a second request with
            # the same key finds this job.
            job = self._new_job(request, parsed, background=True, deadline=BACKGROUND_DEADLINE)
            decision = await self._route(job, BACKGROUND_DEADLINE)
            if decision.refused:
                raise self._refusal(job, decision)
            if decision.action == "approval":
                offer = await self.svc.stand_in(job, offer=True)
                backlog_full = self.svc.executor.request_approval(
                    job, decision, offer.model if offer else None
                )
                if backlog_full is not None:
                    raise self._refusal(job, backlog_full)
            else:
                self.svc.registry.set_route(job, decision.action)
                self.svc.spawn(job)
        except ApiError as error:
            return error_response(error)
        # Accepted work is durable before the client hears it was accepted; if it cannot be, it is not.
        if not await asyncio.to_thread(self.svc.journal.flush):
            self.svc.registry.fail(
                job, "failed", {"message": "the journal could not store it", "code": "journal_failed"}, ""
            )
            if job.task is not None and not job.task.done():
                job.task.cancel()
            return error_response(_journal_unavailable(self.svc.journal.failure))
        summary = {"object": "job", **job.summary()}
        return JSONResponse(summary, status_code=202, headers=job_headers(job, False))

    def _existing_job(self, key: str, parsed: ParsedRequest) -> Response | None:
        """`Idempotency-Key` on /v1/jobs, with the rules chat uses (idempotency.decide): the same key and body
        give the job already made under it (202 while it is unfinished, 200 once completed; never a second
        job), another body is 422; a key whose job ended without an answer may make a new one."""
        live, stored = self._made_under(key)
        previous = live or stored
        record = idempotency.record_of(previous) if previous is not None else None
        background = previous.background if previous is not None else True
        summary: dict[str, Any] = {}  # a JobSummary, or the journal's fuller record
        if live is not None:
            summary = dict(live.summary())
        elif stored is not None:
            summary = stored_summary(stored, self.svc.journal.attempts(stored.id))
        verdict = idempotency.decide(record, parsed.body_hash, time.time())
        if verdict == "new" or record is None:
            return None
        if verdict == "effects_delivered":
            raise _effects_delivered(key, record.job_id)
        if verdict == "mismatch" or not background:
            raise ApiError(
                422,
                f"Idempotency-Key {key!r} was used with a different request"
                + ("" if background else " (not a background job)"),
                code="idempotency_key_reused",
                param="Idempotency-Key",
            )
        headers = {
            "X-Request-Id": str(summary.get("request_id") or ""),
            "X-Failsoft-Job": record.job_id,
            "Idempotent-Replayed": "true",
        }
        status = 202 if verdict == "in_progress" else 200
        return JSONResponse({"object": "job", **summary}, status_code=status, headers=headers)

    async def get_job(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        job = self.svc.registry.get(job_id)
        await asyncio.to_thread(self.svc.journal.flush)
        attempts = self.svc.journal.attempts(job_id)
        if job is not None:
            return JSONResponse({"object": "job", **job.summary(), "attempt_log": attempts})
        stored = self.svc.journal.job(job_id)
        if stored is None:
            return error_response(ApiError(404, f"no job {job_id}", code="job_not_found"))
        return JSONResponse({"object": "job", **stored_summary(stored, attempts)})

    async def delete_job(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        job = self.svc.registry.get(job_id)
        if job is None:
            return error_response(ApiError(404, f"no live job {job_id}", code="job_not_found"))
        if not job.final:
            self.svc.registry.fail(
                job,
                "cancelled",
                {"message": "cancelled by request", "code": "cancelled"},
                "cancelled_by_request",
            )
            if job.task is not None and not job.task.done():
                job.task.cancel()
        return JSONResponse({"object": "job", **job.summary()})


async def not_found(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")
    message = f"{request.method} {request.url.path}: {detail}"
    if status == 404 and _served(request, "/v1" + request.url.path):
        # llama-server also answers its own formats here (/completions, /embeddings): this router
        # speaks OpenAI's, under /v1.
        message += f". OpenAI's API is under /v1 here: {request.method} /v1{request.url.path}"
    error = ApiError(status, message, code=code)
    return error_response(error, api=api_of(request.url.path))


def _served(request: Request, path: str) -> bool:
    return any(getattr(route, "path", None) == path for route in request.app.routes)


def create_app(service: Service, *, manage_lifecycle: bool = True) -> ASGIApp:
    """The ASGI app. With `manage_lifecycle`, starting the app starts the service (workers and all)."""
    # Both build on Router: imported once it exists.
    from tray_app.server.anthropic.paths import COUNT_TOKENS, MESSAGES
    from tray_app.server.anthropic.routes import MessagesRoutes
    from tray_app.server.ollama.routes import OllamaRoutes
    from tray_app.server.responses.routes import PATH as RESPONSES
    from tray_app.server.responses.routes import ResponsesRoute

    router = Router(service)
    ollama = OllamaRoutes(service, router)
    responses = ResponsesRoute(router)
    messages = MessagesRoutes(router)
    ctl = control.Control(service)
    retention = service.cfg.journal
    if (retention.retention_days, retention.max_jobs) != (
        service.journal.retention_days,
        service.journal.max_jobs,
    ):
        service.journal.set_retention(retention.retention_days, retention.max_jobs)
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
        Route("/v1/jobs", router.create_job, methods=["POST"]),
        Route("/v1/jobs/{job_id}", router.get_job, methods=["GET"]),
        Route("/v1/jobs/{job_id}", router.delete_job, methods=["DELETE"]),
        *ctl.routes(),
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

    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        HTTPException: not_found,
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
    )
