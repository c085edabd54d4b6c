"""`POST /v1/responses`: the request translated into a chat completion the router serves (see translate), its
answer rewritten into the Responses shape as it is sent."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tray_app.server.app import Router, error_response, read_body
from tray_app.server.errors import ApiError, bad_request
from tray_app.server.responses.stream import ResponsesStream
from tray_app.server.responses.translate import chat_request, error_of, response_of

PATH = "/v1/responses"


class ResponsesRoute:
    def __init__(self, router: Router) -> None:
        self.router = router

    async def create(self, request: Request) -> ASGIApp:
        try:
            raw = await read_body(request, self.router.max_body)
            try:
                body = json.loads(raw)
            except ValueError:
                raise bad_request("the body is not valid JSON") from None
            if not isinstance(body, dict):
                raise bad_request("the body must be a JSON object")
            chat = chat_request(body)
        except ApiError as error:
            return error_response(error)
        answer = await self.router.generate(request, "chat", json.dumps(chat).encode())
        return ResponsesAnswer(answer, body)


def _response_id(headers: list[tuple[bytes, bytes]]) -> str:
    """The job's id makes the response's: one id for one request, as X-Failsoft-Job names it."""
    job = next((value.decode("latin-1") for name, value in headers if name == b"x-failsoft-job"), "")
    return f"resp_{job.removeprefix('job-')}" if job else "resp_unknown"


class ResponsesAnswer:
    """The router's answer to a translated request, rewritten into the Responses shape as it is sent."""

    def __init__(self, inner: ASGIApp, request: dict[str, Any]) -> None:
        self.inner = inner
        self.request = request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stream: ResponsesStream | None = None
        held: Message | None = None
        body: list[bytes] = []

        async def rewriting(message: Message) -> None:
            nonlocal stream, held
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                content_type = next((value for name, value in headers if name == b"content-type"), b"")
                if message["status"] == 200 and content_type.startswith(b"text/event-stream"):
                    stream = ResponsesStream(
                        self.request, _response_id(headers), str(self.request.get("model"))
                    )
                    await send(message)
                else:
                    held = message  # a whole answer: rewritten once all of it is here
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            more = bool(message.get("more_body", False))
            if stream is not None:
                out = stream.feed(message.get("body", b""))
                if not more:
                    out += stream.finish()
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
            answer = response_of(self.request, json.loads(data), _response_id(headers))
            out = json.dumps(answer, ensure_ascii=False).encode()
        elif status == 499:
            out = data  # the client went away: nobody reads this
        else:
            out = error_of(status, data)
        headers.append((b"content-length", str(len(out)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": out, "more_body": False})
