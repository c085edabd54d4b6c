"""`POST /v1/responses`: the request translated into a chat completion the router serves (see translate), its
answer rewritten into the Responses shape as it is sent."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp

from tray_app.server.app import Router, error_response, read_translated
from tray_app.server.errors import ApiError
from tray_app.server.responses.stream import ResponsesStream
from tray_app.server.responses.translate import chat_request, error_of, response_of
from tray_app.server.rewrite import Headers, RewrittenAnswer, header

PATH = "/v1/responses"


class ResponsesRoute:
    def __init__(self, router: Router) -> None:
        self.router = router

    async def create(self, request: Request) -> ASGIApp:
        try:
            body, raw = await read_translated(request, self.router.max_body, chat_request)
        except ApiError as error:
            return error_response(error)
        answer = await self.router.generate(request, "chat", raw)
        return ResponsesAnswer(answer, body)


def _response_id(headers: Headers) -> str:
    """The job's id makes the response's: one id for one request, as X-Failsoft-Job names it."""
    job = header(headers, b"x-failsoft-job")
    return f"resp_{job.removeprefix('job-')}" if job else "resp_unknown"


class ResponsesAnswer(RewrittenAnswer):
    """The router's answer to a translated request, rewritten into the Responses shape as it is sent."""

    def __init__(self, inner: ASGIApp, request: dict[str, Any]) -> None:
        super().__init__(inner)
        self.request = request

    def stream(self, headers: Headers) -> tuple[ResponsesStream, Headers]:
        model = str(self.request.get("model") or "")
        return ResponsesStream(self.request, _response_id(headers), model), headers

    def whole(self, status: int, headers: Headers, data: bytes) -> tuple[bytes, Headers]:
        if status == 200:
            answer = response_of(self.request, json.loads(data), _response_id(headers))
            return json.dumps(answer, ensure_ascii=False).encode(), headers
        if status == 499:
            return data, headers  # the client went away: nobody reads this
        return error_of(status, data), headers
