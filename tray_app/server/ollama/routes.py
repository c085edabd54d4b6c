"""Ollama's routes: a thin adapter over the OpenAI router.

`/api/chat` and `/api/generate` build the OpenAI body (request.py) and hand it to `Router.generate`, the
same path `/v1/chat/completions` takes: admission, failover, approvals, the identity headers and the journal
all apply unchanged. What the router answers is rewritten on its way out (`OllamaAnswer`): its event
stream as NDJSON lines, its JSON as Ollama's JSON, its errors as `{"error": "..."}` with the same status,
its `X-Failsoft-*` headers kept.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from tray_app.budget.model_info import inspect_model
from tray_app.budget.plan import Plan
from tray_app.engine.thinking import model_thinks
from tray_app.library.catalog import ModelEntry
from tray_app.library.errors import LoadRefused
from tray_app.server.errors import ApiError
from tray_app.server.http import read_body
from tray_app.server.ollama import paths
from tray_app.server.ollama.answer import (
    Timing,
    embed_answer,
    embeddings_answer,
    iso,
    load_answer,
    openai_result,
)
from tray_app.server.ollama.errors import OllamaError, openai_error
from tray_app.server.ollama.model_card import ModelCard, model_card
from tray_app.server.ollama.names import (
    OLLAMA_VERSION,
    capabilities,
    managed_in_config,
    model_name,
    not_found,
    require_model,
)
from tray_app.server.ollama.request import (
    Kind,
    chat_request,
    embed_request,
    embeddings_request,
    generate_request,
    is_load_request,
    is_zero_keep_alive,
    parse_body,
)
from tray_app.server.ollama.stream import StreamTranslator
from tray_app.server.openai import Router
from tray_app.server.ports import GenerationView
from tray_app.server.rewrite import Headers, RewrittenAnswer, header

PathKind = Literal["chat", "generate"]
NDJSON = b"application/x-ndjson"
JSON = b"application/json; charset=utf-8"
# What Ollama writes as the expiry of a model kept loaded for good (keep_alive < 0): now + Go's longest
# duration. Both workers keep the model for as long as the service runs.
FOREVER = timedelta(microseconds=(2**63 - 1) // 1000)


def error_response(error: OllamaError) -> Response:
    return Response(
        error.body_bytes(), status_code=error.status, media_type="application/json", headers=error.headers
    )


def _from_api_error(error: ApiError) -> OllamaError:
    return OllamaError(error.status, error.message, error.headers)


class OllamaAnswer(RewrittenAnswer):
    """The router's answer to a translated request, rewritten into Ollama's shape as it is sent."""

    def __init__(
        self,
        inner: ASGIApp,
        path_kind: PathKind,
        model: str,
        timing: Timing,
        calls_written: Callable[[str], None] = lambda job_id: None,
    ) -> None:
        super().__init__(inner)
        self.path_kind = path_kind
        self.model = model
        self.timing = timing
        self.calls_written = calls_written  # told the job's id when its tool calls go out

    def stream(self, headers: Headers) -> tuple[StreamTranslator, Headers]:
        job_id = header(headers, b"x-failsoft-job")
        translator = StreamTranslator(
            self.path_kind, self.model, self.timing, lambda: self.calls_written(job_id)
        )
        return translator, _replace_type(headers, NDJSON)

    def whole(self, status: int, headers: Headers, data: bytes) -> tuple[bytes, Headers]:
        if status == 200:
            self.timing.ended = self.timing.ended or time.monotonic_ns()
            answer: dict[str, Any] = openai_result(self.path_kind, self.model, json.loads(data), self.timing)
            out = json.dumps(answer, ensure_ascii=False).encode()
        elif status == 499:
            out = data  # the client went away: nobody reads this
        else:
            out = openai_error(status, data).body_bytes()
        return out, _replace_type(headers, JSON)


def _replace_type(headers: list[tuple[bytes, bytes]], content_type: bytes) -> list[tuple[bytes, bytes]]:
    kept = [(name, value) for name, value in headers if name not in (b"content-type", b"content-length")]
    return [(b"content-type", content_type), *kept]


class OllamaRoutes:
    """Ollama's API for one service. `chat` and `generate` are POST handlers the outermost layer calls
    directly (as it does the OpenAI generation routes); the rest are ordinary Starlette routes."""

    def __init__(self, service: GenerationView, router: Router) -> None:
        self.svc = service
        self.router = router

    # ------------------------------------------------------------------------------ generation
    async def chat(self, request: Request) -> ASGIApp:
        return await self._generate(request, "chat")

    async def generate(self, request: Request) -> ASGIApp:
        return await self._generate(request, "generate")

    async def _generate(self, request: Request, path_kind: PathKind) -> ASGIApp:
        timing = Timing()
        try:
            body = parse_body(await read_body(request, self.router.max_body))
            model = require_model(body, self.svc.model_names)
            entry = self._entry(model)
            if is_load_request(path_kind, body):
                # Ollama's "load the model" call (with keep_alive 0, "unload"): the main model is always
                # loaded; another model is loaded (or unloaded) now.
                await self._load_or_unload(entry, body)
                return JSONResponse(load_answer(path_kind, model, body))
            kind: Kind = "chat"
            thinks = model_thinks(inspect_model(entry.path).chat_template, entry.chat_format)
            if path_kind == "chat":
                openai = chat_request(body, entry.name, thinks)
            else:
                kind, openai = generate_request(body, entry.name, thinks)
            if body.get("keep_alive") is not None:
                openai["keep_alive"] = body["keep_alive"]  # the router takes it (and checks it)
        except OllamaError as error:
            return error_response(error)
        except ApiError as error:
            return error_response(_from_api_error(error))
        # Tool calls leave whole, when complete (StreamTranslator): delivered when that line is written.
        answer = await self.router.generate(request, kind, json.dumps(openai).encode(), holds_tool_calls=True)
        return OllamaAnswer(answer, path_kind, model, timing, self._calls_written)

    def _calls_written(self, job_id: str) -> None:
        job = self.svc.jobs.get(job_id)
        if job is not None:
            self.svc.jobs.note_delivered(job)

    # ------------------------------------------------------------------------------ embeddings
    async def embed(self, request: Request) -> Response:
        return await self._embed(request, legacy=False)

    async def embeddings(self, request: Request) -> Response:
        return await self._embed(request, legacy=True)

    async def _embed(self, request: Request, *, legacy: bool) -> Response:
        """/api/embed (and the older /api/embeddings) through the router's /v1/embeddings path: the same
        embeddings workers, failover and identity headers."""
        timing = Timing()
        try:
            body = parse_body(await read_body(request, self.router.max_body))
            model = require_model(body, set(self.svc.catalog.main.names()))  # embeddings: the main model
            translate = embeddings_request if legacy else embed_request
            openai = translate(body, self.svc.model_id)
        except OllamaError as error:
            return error_response(error)
        except ApiError as error:
            return error_response(_from_api_error(error))
        answer = await self.router.embed(request, json.dumps(openai).encode())
        identity = {name: value for name, value in answer.headers.items() if name.startswith("x-")}
        if answer.status_code != 200:
            refused = openai_error(answer.status_code, bytes(answer.body))
            refused.headers.update(identity)
            return error_response(refused)
        vectors = json.loads(bytes(answer.body))
        shaped = embeddings_answer(vectors) if legacy else embed_answer(model, vectors, timing)
        return JSONResponse(shaped, headers=identity)

    def _entry(self, name: str) -> ModelEntry:
        """The library's model an Ollama name means (any case, with or without `:latest`)."""
        entry = self.svc.catalog.find(name) if name.strip() else None
        if entry is None:
            raise not_found(name)
        return entry

    async def _load_or_unload(self, entry: ModelEntry, body: dict[str, Any]) -> None:
        library = self.svc.library
        if entry.main:
            return
        if is_zero_keep_alive(body.get("keep_alive")):
            await library.unload(entry.name, if_idle=True)  # a model with requests in flight stays
            return
        roles = library.roles(entry)
        wait = self.svc.cfg.supervisor.start_timeout
        refusals: list[str] = []
        for device in [device for device in ("gpu", "cpu") if device in roles] or ["gpu"]:
            try:
                await library.load(entry, device, wait)
                return
            except LoadRefused as refused:
                refusals.append(str(refused))  # the GPU has no room now: the CPU next, if it may run there
        # Refused on every device it may run on: "not now" (room may come free), in Ollama's error shape.
        raise OllamaError(503, "; ".join(refusals), {"Retry-After": "30"})

    # ------------------------------------------------------------------------------ models
    async def _card(self, entry: ModelEntry | None = None) -> ModelCard:
        return await asyncio.to_thread(model_card, (entry or self.svc.catalog.main).path)

    def _listing(self, card: ModelCard, entry: ModelEntry | None = None) -> dict[str, Any]:
        name = model_name((entry or self.svc.catalog.main).name)
        return {
            "name": name,
            "model": name,
            "modified_at": iso(card.modified),
            "size": card.size,
            "digest": card.digest,
            "details": card.details(),
        }

    async def root(self, request: Request) -> Response:
        return PlainTextResponse("Ollama is running")

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": OLLAMA_VERSION})

    async def tags(self, request: Request) -> Response:
        """Every model a request may name: the main one, then the library's."""
        entries = self.svc.catalog.entries
        return JSONResponse({"models": [self._listing(await self._card(entry), entry) for entry in entries]})

    async def show(self, request: Request) -> Response:
        try:
            body = parse_body(await read_body(request, self.router.max_body))
            entry = self._entry(require_model(body, self.svc.model_names))
        except OllamaError as error:
            return error_response(error)
        except ApiError as error:
            return error_response(_from_api_error(error))
        card = await self._card(entry)
        n_ctx = self.router.context_per_slot(entry.name)
        parameters = f"num_ctx                        {n_ctx}"
        modelfile = (
            f"# Modelfile generated by Failsoft (models are set in its config file)\n"
            f"FROM {card.path}\nPARAMETER num_ctx {n_ctx}\n"
        )
        if card.chat_template:
            modelfile += f'TEMPLATE """{card.chat_template}"""\n'
        return JSONResponse(
            {
                "modelfile": modelfile,
                "parameters": parameters,
                "template": card.chat_template,
                "details": card.details(),
                "model_info": card.model_info,
                "capabilities": capabilities(
                    model_thinks(inspect_model(entry.path).chat_template, entry.chat_format)
                ),
                "modified_at": iso(card.modified),
            }
        )

    async def ps(self, request: Request) -> Response:
        """The models loaded now: on a GPU worker (size_vram: what its plan puts on the device) or only on
        a CPU worker (size_vram 0); expires_at from each one's keep-alive (the main model's: never)."""
        loaded = []
        for status in self.svc.library.status(self.svc.plan_set, self.svc.jobs.in_flight):
            if status["where"] in ("not loaded", "loading"):
                continue
            entry = self._entry(status["name"])
            plan = self._loaded_plan(entry, on_gpu="gpu" in status["where"])
            size_vram = status["vram_bytes"]
            size = plan.weights_bytes + plan.kv_bytes + plan.compute_bytes + plan.host_weights_bytes
            unload_in = status["unload_in"]
            expires = FOREVER if unload_in is None else timedelta(seconds=unload_in)
            loaded.append(
                {
                    **self._listing(await self._card(entry), entry),
                    "size": max(size, size_vram),
                    "size_vram": size_vram,
                    "expires_at": (datetime.now(UTC) + expires).isoformat().replace("+00:00", "Z"),
                    "context_length": plan.n_ctx_per_seq,
                }
            )
        return JSONResponse({"models": loaded})

    def _loaded_plan(self, entry: ModelEntry, *, on_gpu: bool) -> Plan:
        if entry.main:
            return self.svc.plan_set.gpu if on_gpu else self.svc.plan_set.cpu
        plans = self.svc.library.plans[entry.name]
        plan = plans.gpu if on_gpu else plans.cpu
        return plan or plans.cpu or self.svc.plan_set.cpu

    async def managed(self, request: Request) -> Response:
        """pull, push, create, copy, delete, blobs: models are set in the config file."""
        return error_response(managed_in_config(self.svc.model_names))

    def routes(self, post_only: Any) -> list[Route]:
        """The Starlette routes; `post_only` stands for the generation paths, which the outermost layer
        dispatches itself (listed so other methods get a 405)."""
        return [
            Route("/", self.root, methods=["GET"]),  # GET routes answer HEAD too
            Route("/api/version", self.version, methods=["GET"]),
            Route("/api/tags", self.tags, methods=["GET"]),
            Route("/api/show", self.show, methods=["POST"]),
            Route("/api/ps", self.ps, methods=["GET"]),
            Route(paths.CHAT, post_only, methods=["POST"]),
            Route(paths.GENERATE, post_only, methods=["POST"]),
            Route(paths.EMBED[0], self.embed, methods=["POST"]),
            Route(paths.EMBED[1], self.embeddings, methods=["POST"]),
            *(
                Route(path, self.managed, methods=["DELETE" if path == "/api/delete" else "POST"])
                for path in paths.MODEL_MANAGEMENT
            ),
            Route(paths.BLOBS_PREFIX + "{digest}", self.managed, methods=["POST", "HEAD"]),
        ]

    def direct(self) -> dict[str, Any]:
        return {paths.CHAT: self.chat, paths.GENERATE: self.generate}
