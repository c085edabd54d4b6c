"""`POST /v1/responses`: the request translated into a chat completion the router serves (see translate), its
answer rewritten into the Responses shape as it is sent."""

from __future__ import annotations

import hmac
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp

from tray_app.jobs.intake import LiveOrStored
from tray_app.server.errors import ApiError, bad_request
from tray_app.server.http import error_response, read_translated
from tray_app.server.openai import Router
from tray_app.server.responses.stream import ResponsesStream
from tray_app.server.responses.translate import (
    chat_request,
    error_of,
    history_of,
    response_of,
    retrieved,
    stored_response,
)
from tray_app.server.rewrite import Headers, RewrittenAnswer, header

PATH = "/v1/responses"


class ResponsesRoute:
    def __init__(self, router: Router) -> None:
        self.router = router

    async def create(self, request: Request) -> ASGIApp:
        try:
            body, raw = await read_translated(request, self.router.max_body, self._chat_request)
        except ApiError as error:
            return error_response(error)
        answer = await self.router.generate(request, "chat", raw)
        return ResponsesAnswer(answer, body)

    async def count_input_tokens(self, request: Request) -> Response:
        """`POST /v1/responses/input_tokens`: the prompt tokens the request would take, counted as admission
        counts them (with the stored conversation it continues, if it names one)."""
        try:
            _, raw = await read_translated(request, self.router.max_body, self._chat_request)
            tokens = await self.router.count_chat(raw)
        except ApiError as error:
            return error_response(error)
        return JSONResponse({"object": "response.input_tokens", "input_tokens": tokens})

    def _chat_request(self, body: dict[str, Any]) -> dict[str, Any]:
        previous = body.get("previous_response_id")
        return chat_request(body, None if previous is None else self._history(previous))

    async def retrieve(self, request: Request) -> Response:
        response_id = request.path_params["response_id"]
        job = self._stored(response_id)
        if job is None:
            message = f"Response with id '{response_id}' not found."
            return error_response(ApiError(404, message, param="response_id", code="not_found"))
        answer = retrieved(job.body, job.state, job.result, job.error, response_id, job.created_at)
        return JSONResponse(answer)

    def _history(self, previous: Any) -> list[dict[str, Any]]:
        """The conversation the stored response `previous` ends; 404 as OpenAI's when there is none: never
        stored (`store: false`), not completed, or gone past the journal's retention."""
        if not isinstance(previous, str):
            raise bad_request("'previous_response_id' must be a string", "previous_response_id")
        job = self._stored(previous)
        if job is None or job.state != "completed" or job.result is None:
            message = f"Previous response with id '{previous}' not found."
            raise ApiError(404, message, param="previous_response_id", code="previous_response_not_found")
        return history_of(job.body, job.result)

    def _stored(self, response_id: str) -> LiveOrStored | None:
        """The job behind a stored response (None: no such response, not this id's (its read token is part
        of the id: the job's own id, which the event stream shows, is not enough), or `store: false`)."""
        job_hex, _, token = response_id.removeprefix("resp_").partition("_")
        if not response_id.startswith("resp_") or not token:
            return None
        job_id = "job-" + job_hex
        # A job that just ended is held in memory; the journal keeps older ones.
        job = self.router.jobs.stored(job_id)
        if job is None or job.kind != "chat" or not stored_response(job.body):
            return None
        if not job.read_token or not hmac.compare_digest(token.encode(), job.read_token.encode()):
            return None
        return job


def _response_id(headers: Headers) -> str:
    """The job's id and its read token make the response's: one id for one request, as X-Failsoft-Job
    names it, readable back only by whoever holds the whole id."""
    job = header(headers, b"x-failsoft-job")
    token = header(headers, b"x-failsoft-job-token")
    return f"resp_{job.removeprefix('job-')}_{token}" if job and token else "resp_unknown"


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
