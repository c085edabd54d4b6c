"""The router's answer to a translated request (Ollama's API, OpenAI's Responses API), rewritten into the
caller's API as it is sent: an event stream piece by piece as it comes, a whole answer once all of it is
here. Also the reading of the router's own server-sent events, which both rewriters take apart."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Protocol

from starlette.types import ASGIApp, Message, Receive, Scope, Send

Headers = list[tuple[bytes, bytes]]


class StreamRewriter(Protocol):
    def feed(self, data: bytes) -> bytes: ...

    def finish(self) -> bytes: ...


class RewrittenAnswer(ABC):
    """Subclasses say how: `stream` (a rewriter for an event stream, and the headers it goes out with) and
    `whole` (a whole answer's bytes, and its headers)."""

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner

    @abstractmethod
    def stream(self, headers: Headers) -> tuple[StreamRewriter, Headers]:
        """The rewriter for an event stream answered with `headers`, and the headers it goes out with."""

    @abstractmethod
    def whole(self, status: int, headers: Headers, data: bytes) -> tuple[bytes, Headers]:
        """A whole answer (`status`, `headers`, its bytes) in the caller's API: its bytes and headers."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rewriter: StreamRewriter | None = None
        held: Message | None = None
        body: list[bytes] = []

        async def rewriting(message: Message) -> None:
            nonlocal rewriter, held
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                content_type = next((value for name, value in headers if name == b"content-type"), b"")
                if message["status"] == 200 and content_type.startswith(b"text/event-stream"):
                    rewriter, headers = self.stream(headers)
                    await send({**message, "headers": headers})
                else:
                    held = message  # a whole answer: rewritten once all of it is here
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            more = bool(message.get("more_body", False))
            if rewriter is not None:
                out = rewriter.feed(message.get("body", b""))
                if not more:
                    out += rewriter.finish()
                await send({"type": "http.response.body", "body": out, "more_body": more})
                return
            body.append(message.get("body", b""))
            if not more and held is not None:
                await self._send_whole(held, b"".join(body), send)

        await self.inner(scope, receive, rewriting)

    async def _send_whole(self, start: Message, data: bytes, send: Send) -> None:
        headers = [(name, value) for name, value in start.get("headers", []) if name != b"content-length"]
        out, headers = self.whole(int(start["status"]), headers, data)
        headers = [*headers, (b"content-length", str(len(out)).encode())]
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": out, "more_body": False})


def header(headers: Headers, name: bytes) -> str:
    return next((value.decode("latin-1") for key, value in headers if key == name), "")


def events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """The complete server-sent events at the start of `buffer`, and what is left of it."""
    found = []
    while (end := buffer.find(b"\n\n")) >= 0:
        found.append(buffer[:end])
        buffer = buffer[end + 2 :]
    return found, buffer


def event_object(event: bytes) -> dict[str, Any] | None:
    """The JSON object one of the router's events carries; None for [DONE] and anything else."""
    payload = b"".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
    if not payload or payload == b"[DONE]":
        return None
    try:
        obj = json.loads(payload)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


class ChunkReader(ABC):
    """The part the event-stream rewriters share: each choice of a router's chat chunk read in turn, its
    reasoning and text as `text_delta` of the caller's kinds for them (`KINDS`), its tool calls as
    `call_delta`, its finish reason kept."""

    KINDS: ClassVar[dict[str, str]]  # "reasoning" and "text" -> what the caller's API names them
    finish_reason: str | None = None

    def read_choice(self, choice: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        for kind, value in delta_parts(choice):
            out += self.call_delta(value) if kind == "tool_call" else self.text_delta(self.KINDS[kind], value)
        self.finish_reason = choice.get("finish_reason") or self.finish_reason
        return out

    @abstractmethod
    def text_delta(self, kind: str, text: str) -> list[bytes]:
        """Events for text of this kind: its item or block opened if it is not the open one."""

    @abstractmethod
    def call_delta(self, call: dict[str, Any]) -> list[bytes]:
        """Events for a tool call's delta: its item or block opened at its first."""


def delta_parts(choice: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """What one choice of a router's chat chunk adds, in the order it comes: ("reasoning", text),
    ("text", text), then ("tool_call", call) for each call."""
    delta = choice.get("delta") or {}
    if delta.get("reasoning_content"):
        yield "reasoning", delta["reasoning_content"]
    if delta.get("content"):
        yield "text", delta["content"]
    for call in delta.get("tool_calls") or []:
        yield "tool_call", call


def cached_tokens(usage: dict[str, Any]) -> int:
    """The prompt tokens a worker's cache held, from a chat's usage (`prompt_tokens_details`)."""
    details = usage.get("prompt_tokens_details")
    return int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0


class NamedAsAsked(RewrittenAnswer):
    """An answer whose model the client named as Ollama's clients do (`name:latest`): it names the model as
    asked, as Ollama's own OpenAI routes answer, wherever it names the library's model (`served`); a stand-in
    that answered instead keeps its own name."""

    def __init__(self, inner: ASGIApp, served: str, asked: str) -> None:
        super().__init__(inner)
        self.served = served
        self.asked = asked

    def stream(self, headers: Headers) -> tuple[StreamRewriter, Headers]:
        return _Renamer(self._renamed), headers

    def whole(self, status: int, headers: Headers, data: bytes) -> tuple[bytes, Headers]:
        if status != 200:
            return data, headers
        try:
            answer = json.loads(data)
        except ValueError:
            return data, headers
        return (json.dumps(self._renamed(answer)).encode() if isinstance(answer, dict) else data), headers

    def _renamed(self, obj: dict[str, Any]) -> dict[str, Any]:
        if obj.get("model") == self.served:
            obj["model"] = self.asked
        return obj


class _Renamer:
    """Each event of a stream with its object passed through `rename`; comments and [DONE] as they are."""

    def __init__(self, rename: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.rename = rename
        self.buffer = b""

    def feed(self, data: bytes) -> bytes:
        found, self.buffer = events(self.buffer + data)
        out = []
        for event in found:
            obj = event_object(event) if event.startswith(b"data:") else None
            out.append(b"data: " + json.dumps(self.rename(obj)).encode() if obj is not None else event)
        return b"".join(event + b"\n\n" for event in out)

    def finish(self) -> bytes:
        rest, self.buffer = self.buffer, b""
        return rest
