"""Ollama's routes: a thin adapter over the OpenAI router.

`/api/chat` and `/api/generate` build the OpenAI body (translate.py) and hand it to `Router.generate`, the
same path `/v1/chat/completions` takes: admission, failover, approvals, the identity headers and the journal
all apply unchanged. What the router answers is rewritten on its way out (`OllamaAnswer`): its event
stream as NDJSON lines, its JSON as Ollama's JSON, its errors as `{"error": "..."}` with the same status,
its `X-Failsoft-*` headers kept.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tray_app.host.service import Service
from tray_app.server.app import Router, read_body
from tray_app.server.errors import ApiError
from tray_app.server.ollama import paths
from tray_app.server.ollama.model_card import ModelCard, model_card
from tray_app.server.ollama.translate import (
    OLLAMA_VERSION,
    Kind,
    OllamaError,
    StreamTranslator,
    Timing,
    chat_request,
    embed_answer,
    embed_request,
    embeddings_answer,
    embeddings_request,
    generate_request,
    is_load_request,
    iso,
    load_answer,
    managed_in_config,
    model_name,
    openai_error,
    openai_result,
    parse_body,
    require_model,
)

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


class OllamaAnswer:
    """The router's answer to a translated request, rewritten into Ollama's shape as it is sent."""

    def __init__(self, inner: ASGIApp, path_kind: PathKind, model: str, timing: Timing) -> None:
        self.inner = inner
        self.path_kind = path_kind
        self.model = model
        self.timing = timing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        translator: StreamTranslator | None = None
        held: Message | None = None
        body: list[bytes] = []

        async def rewriting(message: Message) -> None:
            nonlocal translator, held
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                content_type = next((value for name, value in headers if name == b"content-type"), b"")
                if message["status"] == 200 and content_type.startswith(b"text/event-stream"):
                    translator = StreamTranslator(self.path_kind, self.model, self.timing)
                    await send({**message, "headers": _replace_type(headers, NDJSON)})
                else:
                    held = message  # a whole answer: rewritten once all of it is here
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            more = bool(message.get("more_body", False))
            if translator is not None:
                out = translator.feed(message.get("body", b""))
                if not more:
                    out += translator.finish()
                await send({"type": "http.response.body", "body": out, "more_body": more})
                return
            body.append(message.get("body", b""))
            if not more and held is not None:
                await self._send_whole(held, b"".join(body), send)

        await self.inner(scope, receive, rewriting)

    async def _send_whole(self, start: Message, data: bytes, send: Send) -> None:
        status = int(start["status"])
        headers = [(name, value) for name, value in start.get("headers", []) if name != b"content-length"]
        if status == 200:
            self.timing.ended = self.timing.ended or time.monotonic_ns()
            answer: dict[str, Any] = openai_result(self.path_kind, self.model, json.loads(data), self.timing)
            out = json.dumps(answer, ensure_ascii=False).encode()
        elif status == 499:
            out = data  # the client went away: nobody reads this
        else:
            out = openai_error(status, data).body_bytes()
        headers = [*_replace_type(headers, JSON), (b"content-length", str(len(out)).encode())]
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": out, "more_body": False})


def _replace_type(headers: list[tuple[bytes, bytes]], content_type: bytes) -> list[tuple[bytes, bytes]]:
    kept = [(name, value) for name, value in headers if name not in (b"content-type", b"content-length")]
    return [(b"content-type", content_type), *kept]


class OllamaRoutes:
    """Ollama's API for one service. `chat` and `generate` are POST handlers the outermost layer calls
    directly (as it does the OpenAI generation routes); the rest are ordinary Starlette routes."""

    def __init__(self, service: Service, router: Router) -> None:
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
            if is_load_request(path_kind, body):
                # Ollama's "load the model" (or, with keep_alive 0, "unload") call: the model is loaded.
                return JSONResponse(load_answer(path_kind, model, body))
            kind: Kind = "chat"
            if path_kind == "chat":
                openai = chat_request(body, self.svc.model_id)
            else:
                kind, openai = generate_request(body, self.svc.model_id)
        except OllamaError as error:
            return error_response(error)
        except ApiError as error:
            return error_response(_from_api_error(error))
        answer = await self.router.generate(request, kind, json.dumps(openai).encode())
        return OllamaAnswer(answer, path_kind, model, timing)

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
            model = require_model(body, self.svc.model_names)
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

    # ------------------------------------------------------------------------------ models
    async def _card(self) -> ModelCard:
        return await asyncio.to_thread(model_card, self.svc.model_path)

    def _listing(self, card: ModelCard) -> dict[str, Any]:
        name = model_name(self.svc.model_id)
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
        return JSONResponse({"models": [self._listing(await self._card())]})

    async def show(self, request: Request) -> Response:
        try:
            body = parse_body(await read_body(request, self.router.max_body))
            require_model(body, self.svc.model_names)
        except OllamaError as error:
            return error_response(error)
        except ApiError as error:
            return error_response(_from_api_error(error))
        card = await self._card()
        n_ctx = self.svc.plan_set.gpu.n_ctx_per_seq
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
                "capabilities": ["completion", "tools"],
                "modified_at": iso(card.modified),
            }
        )

    async def ps(self, request: Request) -> Response:
        """The model is loaded while a worker is ready: on the GPU worker (size_vram: what its plan puts on
        the device) or only on the CPU worker (size_vram 0)."""
        card = await self._card()
        gpu_ready = self.svc.worker_status("gpu")["state"] == "ready"
        cpu_ready = self.svc.worker_status("cpu")["state"] == "ready"
        if not (gpu_ready or cpu_ready):
            return JSONResponse({"models": []})
        if gpu_ready:
            plan = self.svc.plan_set.gpu
            size_vram = plan.weights_bytes + plan.kv_bytes + plan.compute_bytes
            size = size_vram + plan.host_weights_bytes + plan.host_kv_bytes
        else:
            plan = self.svc.plan_set.cpu
            size_vram = 0
            size = plan.weights_bytes + plan.kv_bytes + plan.compute_bytes
        entry = {
            **self._listing(card),
            "size": size,
            "size_vram": size_vram,
            "expires_at": (datetime.now(UTC) + FOREVER).isoformat().replace("+00:00", "Z"),
            "context_length": plan.n_ctx_per_seq,
        }
        return JSONResponse({"models": [entry]})

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
