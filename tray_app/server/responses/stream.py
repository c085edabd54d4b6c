"""The router's server-sent chat chunks of one request as the Responses API's event stream.

Output items open as their first delta arrives and close when the next kind begins or the answer ends: a
thinking model's reasoning item, the message with its text, then one function call item per tool call
(`response.function_call_arguments.delta` as the arguments stream in). The end is `response.completed`
(`response.incomplete` when the token budget cut it), with the usage; an error event from the router is
`response.failed` with its message, and a stream cut short without its end is failed too. A function
call's late piece, after its item was done, is dropped.
"""

from __future__ import annotations

import json
import logging
from typing import Any, ClassVar

from tray_app.server.responses.translate import (
    call_item,
    finish,
    message_item,
    new_item_id,
    reasoning_item,
    response_shell,
    usage_of,
)
from tray_app.server.rewrite import ChunkReader, event_object, events

log = logging.getLogger(__name__)


class ResponsesStream(ChunkReader):
    """Feed it the router's SSE bytes as they come (`feed`), then `finish`; each returns events to send."""

    KINDS: ClassVar[dict[str, str]] = {"reasoning": "reasoning", "text": "message"}

    def __init__(self, request: dict[str, Any], response_id: str, model: str) -> None:
        self.shell = response_shell(request, response_id, model, "in_progress")
        self.buffer = b""
        self.sequence = 0
        self.started = False
        self.ended = False
        self.current: dict[str, Any] | None = None  # the open output item, as it will be when done
        self.calls: dict[int, dict[str, Any]] = {}  # tool-call index -> its item

    def feed(self, data: bytes) -> bytes:
        found, self.buffer = events(self.buffer + data)
        out: list[bytes] = self._start()
        for event in found:
            if event.startswith(b":") and not self.ended:
                out.append(event + b"\n\n")  # the router's keep-alive: a comment every reader skips
            elif not self.ended:
                out += self._event(event)
        return b"".join(out)

    def finish(self) -> bytes:
        out = self.feed(b"\n\n") if self.buffer.strip() else b"".join(self._start())
        if not self.ended:
            out += b"".join(self._failed("the answer ended before it was complete", "stream_cut"))
        return out

    # ------------------------------------------------------------------------------------- events
    def _emit(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()

    def _start(self) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        snapshot = dict(self.shell)
        return [
            self._emit("response.created", response=snapshot),
            self._emit("response.in_progress", response=snapshot),
        ]

    def _event(self, event: bytes) -> list[bytes]:
        obj = event_object(event)
        if obj is None:
            return []
        if "error" in obj:
            error = obj["error"] if isinstance(obj["error"], dict) else {"message": str(obj["error"])}
            return self._failed(
                str(error.get("message") or "the request failed"), str(error.get("code") or "")
            )
        out: list[bytes] = []
        if obj.get("model"):
            self.shell["model"] = obj["model"]
        for choice in obj.get("choices") or []:
            out += self.read_choice(choice)
        if "failsoft" in obj:  # the router's last chunk: who served it, and the usage
            out += self._close()
            self.shell["usage"] = usage_of(obj.get("usage"))
            self.shell["failsoft"] = obj["failsoft"]
            finish(self.shell, self.finish_reason)
            self.ended = True
            kind = "response.completed" if self.shell["status"] == "completed" else "response.incomplete"
            out.append(self._emit(kind, response=self.shell))
        return out

    def text_delta(self, kind: str, text: str) -> list[bytes]:
        out: list[bytes] = []
        if self.current is None or self.current["type"] != kind:
            out += self._close()
            out += self._open(kind)
        item = self.current
        assert item is not None
        part = item["content"][0]
        part["text"] += text
        event = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra: dict[str, Any] = {} if kind == "reasoning" else {"logprobs": []}
        out.append(self._emit(event, **self._at(item), content_index=0, delta=text, **extra))
        return out

    def _at(self, item: dict[str, Any]) -> dict[str, Any]:
        """Where an event's item is: its id and its place in the output."""
        return {"item_id": item["id"], "output_index": self.shell["output"].index(item)}

    def _open(self, kind: str) -> list[bytes]:
        item = (
            reasoning_item(new_item_id("rs"), "")
            if kind == "reasoning"
            else message_item(new_item_id("msg"), "", "in_progress")
        )
        self.current = item
        self.shell["output"].append(item)
        index = len(self.shell["output"]) - 1
        empty = {**item, "content": []}
        out = [self._emit("response.output_item.added", output_index=index, item=empty)]
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            added = {**self._at(item), "content_index": 0}
            out.append(self._emit("response.content_part.added", **added, part=part))
        return out

    def call_delta(self, call: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        number = int(call.get("index", 0))
        item = self.calls.get(number)
        function = call.get("function") or {}
        if item is not None and item is not self.current:
            # Its item is done (another began): a done item takes no more deltas.
            log.warning("a function call's delta came after its item was done; dropped")
            return out
        if item is None:
            out += self._close()
            item = call_item(
                new_item_id("fc"), {"id": call.get("id"), "function": {"name": function.get("name")}}
            )
            item["status"] = "in_progress"
            self.calls[number] = self.current = item
            self.shell["output"].append(item)
            index = len(self.shell["output"]) - 1
            out.append(self._emit("response.output_item.added", output_index=index, item=dict(item)))
        if function.get("arguments"):
            item["arguments"] += function["arguments"]
            delta = function["arguments"]
            out.append(self._emit("response.function_call_arguments.delta", **self._at(item), delta=delta))
        return out

    def _close(self) -> list[bytes]:
        """The open item is done: its closing events, in the order OpenAI sends them."""
        item, self.current = self.current, None
        if item is None:
            return []
        at = self._at(item)
        out: list[bytes] = []
        if item["type"] == "reasoning":
            text = item["content"][0]["text"]
            out.append(self._emit("response.reasoning_text.done", **at, content_index=0, text=text))
        elif item["type"] == "message":
            part = item["content"][0]
            item["status"] = "completed"
            done = {**at, "content_index": 0}
            out.append(self._emit("response.output_text.done", **done, text=part["text"], logprobs=[]))
            out.append(self._emit("response.content_part.done", **done, part=part))
        else:
            item["status"] = "completed"
            arguments = item["arguments"]
            out.append(self._emit("response.function_call_arguments.done", **at, arguments=arguments))
        out.append(self._emit("response.output_item.done", output_index=at["output_index"], item=item))
        return out

    def _failed(self, message: str, code: str) -> list[bytes]:
        self.ended = True
        self.shell["status"] = "failed"
        self.shell["error"] = {"code": code or "server_error", "message": message}
        return [*self._close(), self._emit("response.failed", response=self.shell)]
