"""Streamed completions without a thread hop per token.

llama-cpp-python's server streams by fetching every chunk through `iterate_in_threadpool` (one thread-pool
round trip per token), checking `request.is_disconnected()` per token, and writing through sse-starlette's
task group. The router always streams from its workers, so that cost lands on every request: for a 1-token
answer the worker spent about 3.1 ms of CPU streaming against 1.8 ms answering the same request whole.

Here one thread runs the whole generation and hands each encoded event to the event loop; the loop writes
whatever has arrived in one write. Everything else is llama-cpp-python's own: the same request models, the
same `prepare_request_resources` (logit bias, grammar, min_tokens), the same model locks, held until the
generating thread has stopped. A body its schema rejects, and every non-streamed request, go to its app
unchanged, so errors keep its wording.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import llama_cpp
import llama_cpp.server.app as llama_server
from llama_cpp.server.types import CreateChatCompletionRequest, CreateCompletionRequest
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tray_app.worker.errors import openai_error
from tray_app.worker.stream_errors import error_chunk

# What llama-cpp-python's routes leave out of the request before calling the model (server/app.py).
_COMPLETION_EXCLUDE = frozenset({"n", "best_of", "logit_bias_type", "user", "min_tokens"})
_CHAT_EXCLUDE = frozenset({"n", "logit_bias_type", "user", "min_tokens"})

_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"x-accel-buffering", b"no"),
]
_DONE = b"data: [DONE]\n\n"
_END = object()  # the generating thread has stopped
# Inside a JSON string the quotes would be escaped, so this only finds keys; the schema has the last word.
_STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')


def event(chunk: Any) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


class _Route:
    def __init__(
        self,
        request_model: type[CreateCompletionRequest] | type[CreateChatCompletionRequest],
        exclude: frozenset[str],
        call: Callable[..., Any],
    ) -> None:
        self.request_model = request_model
        self.exclude = exclude
        self.call = call


_ROUTES = {
    "/v1/chat/completions": _Route(
        CreateChatCompletionRequest, _CHAT_EXCLUDE, llama_cpp.Llama.create_chat_completion
    ),
    "/v1/completions": _Route(CreateCompletionRequest, _COMPLETION_EXCLUDE, llama_cpp.Llama.__call__),
}


def handles(scope: Scope) -> bool:
    return scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in _ROUTES


async def serve(scope: Scope, receive: Receive, send: Send, model_app: ASGIApp) -> None:
    """Stream a valid `stream: true` request here; hand anything else to `model_app` with its body."""
    raw, disconnected = await _read_body(receive)
    if disconnected:
        return
    route = _ROUTES[scope["path"]]
    body = _streamed_request(raw, route.request_model)
    if body is None:
        await model_app(scope, _replay(raw, receive), send)
        return
    kwargs = body.model_dump(exclude=set(route.exclude))
    async with contextlib.asynccontextmanager(llama_server.get_llama_proxy)() as proxy:
        try:
            llama = llama_server.prepare_request_resources(body, proxy, body.model, kwargs)
        except HTTPException as error:
            status = error.status_code
            kind = "invalid_request_error" if status < 500 else "internal_server_error"
            await openai_error(status, str(error.detail), kind)(scope, receive, send)
            return
        except ValueError as error:  # a value llama-cpp-python refuses while preparing (a logit bias)
            await openai_error(400, str(error), "invalid_request_error")(scope, receive, send)
            return
        await _stream(route.call, llama, kwargs, receive, send)


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"", True
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts), False


def _streamed_request(raw: bytes, request_model: type[BaseModel]) -> Any:
    """The parsed request when it asks for a stream and its schema accepts it; otherwise None."""
    if _STREAM_TRUE.search(raw) is None:
        return None  # a cheap look first: validating a non-streamed body here would double its cost
    try:
        body: Any = request_model.model_validate_json(raw)
    except ValidationError:
        return None
    if not body.stream:
        return None
    if isinstance(body, CreateCompletionRequest) and isinstance(body.prompt, list):
        if len(body.prompt) > 1:
            return None  # llama-cpp-python refuses several prompts; let it say so
        body.prompt = body.prompt[0] if body.prompt else ""
    return body


def _replay(raw: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return replay


async def _stream(
    call: Callable[..., Any], llama: llama_cpp.Llama, kwargs: dict[str, Any], receive: Receive, send: Send
) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Queue[Any] = asyncio.Queue()
    stop = threading.Event()

    def hand_over(item: Any) -> None:
        loop.call_soon_threadsafe(ready.put_nowait, item)

    def generate() -> None:
        try:
            chunks: Iterator[Any] = call(llama, **kwargs)
            try:
                for chunk in chunks:
                    hand_over(event(chunk))
                    if stop.is_set():
                        break
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()  # ends llama-cpp-python's generator (and its sampling) where it stands
            if not stop.is_set():
                hand_over(_DONE)
        except Exception as error:
            traceback.print_exc()
            hand_over(event(error_chunk(error)) + _DONE)
        finally:
            hand_over(_END)

    async def watch_disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        stop.set()

    generating = loop.run_in_executor(None, generate)
    watcher = asyncio.ensure_future(watch_disconnect())
    started = False
    try:
        while True:
            items = [await ready.get()]
            while not ready.empty():
                items.append(ready.get_nowait())
            finished = items[-1] is _END
            data = b"".join(item for item in items if item is not _END)
            if stop.is_set():
                break
            if not started:
                await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
                started = True
            await send({"type": "http.response.body", "body": data, "more_body": not finished})
            if finished:
                break
    finally:
        stop.set()
        watcher.cancel()
        # The model's lock is released when this returns: the thread must have let go of the model first.
        await asyncio.shield(generating)
