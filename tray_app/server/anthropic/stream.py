"""The router's server-sent chat chunks of one request as the Messages API's event stream.

`message_start`, then one content block at a time: a thinking model's `thinking` block, the `text` block,
then one `tool_use` block per tool call (its arguments as `input_json_delta`), each opened by
`content_block_start` as its first delta arrives and closed by `content_block_stop` when the next kind
begins or the answer ends. The end is `message_delta` (the stop reason and the usage) and `message_stop`;
an error event from the router is Anthropic's `error` event with its message, and a stream cut short
without its end is an error too. Each of the router's keep-alive comments is a `ping`, as Anthropic sends,
once `message_start` is out (before it, one that waits for a first chunk stays a comment: a Messages stream
begins with `message_start`). A tool call's late piece, after its block was closed, is dropped: a closed
block takes no more deltas.
"""

from __future__ import annotations

import json
import logging
from typing import Any, ClassVar

from tray_app.server.anthropic.translate import stop_reason, usage_of
from tray_app.server.rewrite import ChunkReader, event_object, events

log = logging.getLogger(__name__)


def stream_error_type(openai_type: Any) -> str:
    """The Anthropic error type of an error event (the router's are in OpenAI's types)."""
    if openai_type in ("invalid_request_error", "rate_limit_error"):
        return str(openai_type)
    return "overloaded_error" if openai_type == "service_unavailable" else "api_error"


class MessagesStream(ChunkReader):
    """Feed it the router's SSE bytes as they come (`feed`), then `finish`; each returns events to send."""

    KINDS: ClassVar[dict[str, str]] = {"reasoning": "thinking", "text": "text"}

    def __init__(self, request: dict[str, Any], message_id: str) -> None:
        self.request = request
        self.message_id = message_id
        self.buffer = b""
        self.started = False
        self.ended = False
        self.blocks = 0  # content blocks opened so far
        self.current: tuple[str, int] | None = None  # the open block: its kind and index
        self.calls: dict[int, int] = {}  # tool-call index -> its block's index

    def feed(self, data: bytes) -> bytes:
        found, self.buffer = events(self.buffer + data)
        out: list[bytes] = []
        for event in found:
            obj = event_object(event)
            if obj is not None and not self.ended:
                out += self._start(str(obj.get("model") or ""))
                out += self._event(obj)
            elif event.startswith(b":") and not self.ended:
                # The router's keep-alive, as Anthropic's API sends it; before message_start, as it came.
                out.append(self._emit("ping") if self.started else event + b"\n\n")
        return b"".join(out)

    def finish(self) -> bytes:
        out = self.feed(b"\n\n") if self.buffer.strip() else b""
        if not self.ended:
            out += b"".join(
                [*self._start(""), *self._error("api_error", "the answer ended before it was complete")]
            )
        return out

    # ------------------------------------------------------------------------------------- events
    @staticmethod
    def _emit(kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, **fields}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()

    def _start(self, model: str) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": model or str(self.request.get("model") or ""),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage_of(None),
        }
        return [self._emit("message_start", message=message)]

    def _event(self, obj: dict[str, Any]) -> list[bytes]:
        if "error" in obj:
            error = obj["error"] if isinstance(obj["error"], dict) else {"message": str(obj["error"])}
            return self._error(stream_error_type(error.get("type")), str(error.get("message") or ""))
        out: list[bytes] = []
        for choice in obj.get("choices") or []:
            out += self.read_choice(choice)
        if "failsoft" in obj:  # the router's last chunk: who served it, and the usage
            out += self._close()
            usage = usage_of(obj.get("usage"))
            reason = stop_reason(self.finish_reason or "stop", self.request, usage["output_tokens"])
            delta = {"stop_reason": reason, "stop_sequence": None}
            out.append(self._emit("message_delta", delta=delta, usage=usage, failsoft=obj["failsoft"]))
            out.append(self._emit("message_stop"))
            self.ended = True
        return out

    def text_delta(self, kind: str, text: str) -> list[bytes]:
        out: list[bytes] = []
        if self.current is None or self.current[0] != kind:
            out += self._close()
            block = (
                {"type": "thinking", "thinking": "", "signature": ""}
                if kind == "thinking"
                else {"type": "text", "text": ""}
            )
            out += self._open(kind, block)
        assert self.current is not None
        delta = (
            {"type": "thinking_delta", "thinking": text}
            if kind == "thinking"
            else {"type": "text_delta", "text": text}
        )
        out.append(self._emit("content_block_delta", index=self.current[1], delta=delta))
        return out

    def call_delta(self, call: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        number = int(call.get("index", 0))
        function = call.get("function") or {}
        if number in self.calls and self.current != ("tool_use", self.calls[number]):
            log.warning("a tool call's delta came after its block was closed; dropped")
            return out
        if number not in self.calls:
            out += self._close()
            block = {
                "type": "tool_use",
                "id": str(call.get("id") or ""),
                "name": str(function.get("name") or ""),
                "input": {},
            }
            out += self._open("tool_use", block)
            assert self.current is not None
            self.calls[number] = self.current[1]
        if function.get("arguments"):
            delta = {"type": "input_json_delta", "partial_json": function["arguments"]}
            out.append(self._emit("content_block_delta", index=self.calls[number], delta=delta))
        return out

    def _open(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        self.current = (kind, self.blocks)
        self.blocks += 1
        return [self._emit("content_block_start", index=self.current[1], content_block=block)]

    def _close(self) -> list[bytes]:
        block, self.current = self.current, None
        return [] if block is None else [self._emit("content_block_stop", index=block[1])]

    def _error(self, kind: str, message: str) -> list[bytes]:
        self.ended = True
        error = {"type": kind, "message": message or "the request failed"}
        return [self._emit("error", error=error)]
