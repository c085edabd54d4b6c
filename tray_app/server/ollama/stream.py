"""Streamed answers: the router's server-sent events in, Ollama's NDJSON lines out (`StreamTranslator`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

from tray_app.server.ollama.answer import (
    Timing,
    answer_start,
    final_answer,
    ndjson_line,
    ollama_logprobs,
    ollama_tool_calls,
)
from tray_app.server.rewrite import event_object, events


class StreamTranslator:
    """The router's server-sent events for one request, as Ollama's NDJSON lines.

    Feed it the bytes as they come (`feed`), then `finish`; each returns the lines to send. Content goes
    out as it comes; tool calls (whose arguments stream in pieces) go out whole in one line when the call is
    complete, and `calls_written` hears of it as that line is handed out (only then can the client act on
    them); the last line is `done: true` with the counts and durations. An error event becomes Ollama's
    `{"error": "..."}` line and ends the stream."""

    def __init__(
        self,
        path_kind: Literal["chat", "generate"],
        model: str,
        timing: Timing,
        calls_written: Callable[[], None] = lambda: None,
    ) -> None:
        self.path_kind = path_kind
        self.model = model
        self.timing = timing
        self.calls_written = calls_written
        self.buffer = b""
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.calls_sent = False
        self.finish_reason: str | None = None
        self.tokens = 0
        self.ended = False

    def feed(self, data: bytes) -> bytes:
        found, self.buffer = events(self.buffer + data)
        out: list[bytes] = []
        for event in found:
            if not self.ended:
                out.extend(self._event(event))
        return b"".join(out)

    def finish(self) -> bytes:
        """Whatever is left when the router's stream ended; a stream cut short without its last event still
        ends with a line (an error: the client must not take a cut answer for a whole one)."""
        out = self.feed(b"\n\n") if self.buffer.strip() else b""
        if not self.ended:
            self.ended = True
            out += ndjson_line({"error": "the answer ended before it was complete"})
        return out

    def _event(self, event: bytes) -> list[bytes]:
        obj = event_object(event)
        if obj is None:
            return []
        if "error" in obj:
            self.ended = True
            error = obj["error"]
            message = error.get("message") if isinstance(error, dict) else error
            return [ndjson_line({"error": str(message or "the request failed")})]
        out: list[bytes] = []
        for choice in obj.get("choices") or []:
            out.extend(self._choice(choice))
        self.timing.note_answer(obj)
        if "failsoft" in obj:  # the router's last chunk: who served it, the counts
            self.ended = True
            self.timing.ended = time.monotonic_ns()
            out.extend(self._calls_line())
            final = final_answer(
                self.path_kind,
                self.model,
                "",
                [],
                self.finish_reason,
                obj.get("usage"),
                self.tokens,
                self.timing,
                obj.get("failsoft"),
            )
            out.append(ndjson_line(final))
        return out

    def _choice(self, choice: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        delta = choice.get("delta")
        thinking = (delta or {}).get("reasoning_content")
        if thinking:
            self.timing.token()
            self.tokens += 1
            out.append(ndjson_line(self._partial("", thinking)))
        text = choice.get("text") if delta is None else delta.get("content")
        if text:
            self.timing.token()
            self.tokens += 1
            self.text.append(text)
            line = self._partial(text)
            logprobs = ollama_logprobs(choice)
            if logprobs:
                line["logprobs"] = logprobs  # for this line's token, as Ollama streams them
            out.append(ndjson_line(line))
        for call in (delta or {}).get("tool_calls") or []:
            self.timing.token()
            index = int(call.get("index", 0))
            entry = self.calls.setdefault(index, {"id": "", "function": {"name": "", "arguments": ""}})
            if call.get("id"):
                entry["id"] = call["id"]
            function = call.get("function") or {}
            entry["function"]["name"] += function.get("name") or ""
            entry["function"]["arguments"] += function.get("arguments") or ""
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
            out.extend(self._calls_line())
        return out

    def _calls_line(self) -> list[bytes]:
        if not self.calls or self.calls_sent:
            return []
        self.calls_sent = True
        calls = [self.calls[index] for index in sorted(self.calls)]
        line = self._partial("")
        line["message"]["tool_calls"] = ollama_tool_calls(calls)
        self.calls_written()  # the tool calls' effects are the client's from here on
        return [ndjson_line(line)]

    def _partial(self, text: str, thinking: str = "") -> dict[str, Any]:
        line = answer_start(self.path_kind, self.model, text, thinking)
        line["done"] = False
        return line
