"""`POST /v1/messages`: the request translated into a chat completion the router serves (see translate), its
answer rewritten into the Messages shape as it is sent; `POST /v1/messages/count_tokens`: the prompt's
tokens, counted as admission counts them."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp

from tray_app.server.anthropic.paths import DIALECT, error_body
from tray_app.server.anthropic.stream import MessagesStream
from tray_app.server.anthropic.translate import (
    chat_request,
    counted_request,
    error_message,
    message_id,
    message_of,
)
from tray_app.server.errors import ApiError
from tray_app.server.http import error_response, read_translated
from tray_app.server.openai import Router
from tray_app.server.rewrite import Headers, RewrittenAnswer, header


class MessagesRoutes:
    def __init__(self, router: Router) -> None:
        self.router = router

    async def create(self, request: Request) -> ASGIApp:
        try:
            body, raw = await read_translated(request, self.router.max_body, chat_request)
        except ApiError as error:
            return error_response(error, api=DIALECT)
        answer = await self.router.generate(request, "chat", raw, fit_budget=True)
        return MessagesAnswer(answer, body)

    async def count_tokens(self, request: Request) -> ASGIApp:
        try:
            _, raw = await read_translated(request, self.router.max_body, counted_request)
            tokens = await self.router.count_chat(raw)
        except ApiError as error:
            return error_response(error, api=DIALECT)
        return JSONResponse({"input_tokens": tokens})


class MessagesAnswer(RewrittenAnswer):
    """The router's answer to a translated request, rewritten into the Messages shape as it is sent."""

    def __init__(self, inner: ASGIApp, request: dict[str, Any]) -> None:
        super().__init__(inner)
        self.request = request

    def stream(self, headers: Headers) -> tuple[MessagesStream, Headers]:
        return MessagesStream(self.request, message_id(header(headers, b"x-failsoft-job"))), headers

    def whole(self, status: int, headers: Headers, data: bytes) -> tuple[bytes, Headers]:
        if status == 200:
            message = message_id(header(headers, b"x-failsoft-job"))
            answer = message_of(self.request, json.loads(data), message)
            return json.dumps(answer, ensure_ascii=False).encode(), headers
        if status == 499:
            return data, headers  # the client went away: nobody reads this
        return error_body(status, error_message(status, data)), headers
