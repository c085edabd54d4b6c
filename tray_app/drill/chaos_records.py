"""What one request of the chaos mix received, and how each dialect's stream is read into it.

Outcomes: `completed` (a whole answer), `incomplete` (an answer without its end: cut short), `error` (the
service ended it on purpose and said why), `refused` (an engine field, refused as it must be), `accepted`
(an engine field let through), `left` (the client went away on purpose), `dropped` (the service dropped a
client that stopped reading) and `lost` (no answer and no reason: a transport error, a timeout)."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

Outcome = Literal["completed", "incomplete", "error", "refused", "accepted", "left", "dropped", "lost"]
JOB_HEADER = "x-failsoft-job"
TOKEN_HEADER = "x-failsoft-job-token"


@dataclass
class Sent:
    kind: str
    outcome: Outcome | None = None
    job_id: str = ""
    token: str = ""  # the job's read token (its creator's)
    status: int = 0
    code: str = ""  # a controlled error's code (or Anthropic's error type)
    ends: int = 0  # end events seen: `[DONE]`, `message_stop`, `done: true`
    content: bool = False  # text or a tool call reached the client
    tool_heads: Counter[int] = field(default_factory=Counter)  # tool call index -> times it began
    tool_at: float | None = None  # when the first tool call reached the client
    key: str = ""  # Idempotency-Key
    replay: bool = False  # the same request again under its key: it must name the first one's job
    detail: str = ""
    started_at: float = field(default_factory=time.time)

    @property
    def repeated_tool_calls(self) -> int:
        return sum(count - 1 for count in self.tool_heads.values() if count > 1)

    def headers_seen(self, headers: Any) -> None:
        self.job_id = self.job_id or str(headers.get(JOB_HEADER) or "")
        self.token = self.token or str(headers.get(TOKEN_HEADER) or "")

    def tool_delivered(self, index: int) -> None:
        self.tool_heads[index] += 1
        self.content = True
        self.tool_at = self.tool_at or time.time()

    def ended_stream(self) -> None:
        """The stream is over: an error said why, an end event made it whole, anything else cut it short."""
        if self.outcome is not None:
            return
        if self.ends:
            self.outcome = "completed"
        else:
            self.outcome = "incomplete" if self.content else "lost"
            self.detail = self.detail or "the stream ended without its end event"


def error_of(sent: Sent, status: int, raw: bytes) -> None:
    """An HTTP error answer: controlled when its body names a code (OpenAI), a type (Anthropic) or says
    something (Ollama's `{"error": "..."}`); lost otherwise."""
    sent.status = status
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if not _controlled_error(sent, error):
        sent.outcome, sent.detail = "lost", f"HTTP {status} without a reason: {raw[:200]!r}"


def _stream_error(sent: Sent, error: Any) -> None:
    if not _controlled_error(sent, error):
        sent.outcome, sent.detail = "lost", f"an error event without a reason: {error!r}"


def _controlled_error(sent: Sent, error: Any) -> bool:
    """Record `error` as a controlled one when it gives a reason: a code or type (OpenAI, Anthropic) or a
    message (Ollama's bare string). False when it gives none; the caller says how it was lost."""
    if isinstance(error, dict) and (error.get("code") or error.get("type")):
        sent.outcome, sent.code = "error", str(error.get("code") or error.get("type"))
        sent.detail = str(error.get("message") or "")[:200]
        return True
    if isinstance(error, str) and error:
        sent.outcome, sent.code, sent.detail = "error", "ollama_error", error[:200]
        return True
    return False


def read_openai(sent: Sent, line: str) -> None:
    """One line of an OpenAI chat stream (`data: {...}` chunks, `data: [DONE]` last)."""
    if not line.startswith("data: "):
        return
    payload = line[len("data: ") :]
    if payload == "[DONE]":
        sent.ends += 1
        return
    obj = json.loads(payload)
    if "error" in obj:
        _stream_error(sent, obj["error"])
        return
    for choice in obj.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content"):
            sent.content = True
        for call in delta.get("tool_calls") or []:
            # A call's first piece carries its id and name; the rest only pieces of its arguments.
            if call.get("id") or (call.get("function") or {}).get("name"):
                sent.tool_delivered(int(call.get("index", 0)))


def read_anthropic(sent: Sent, line: str) -> None:
    """One line of a Messages stream: `data:` lines carry the event's type; `message_stop` ends it."""
    if not line.startswith("data: "):
        return
    obj = json.loads(line[len("data: ") :])
    kind = obj.get("type")
    if kind == "message_stop":
        sent.ends += 1
    elif kind == "error":
        _stream_error(sent, obj.get("error") or {})
    elif kind == "content_block_delta":
        sent.content = True
    elif kind == "content_block_start" and (obj.get("content_block") or {}).get("type") == "tool_use":
        sent.tool_delivered(int(obj.get("index", 0)))


def read_ollama(sent: Sent, line: str) -> None:
    """One NDJSON line of an Ollama stream: content pieces, then `done: true`; or `{"error": ...}`."""
    if not line.strip():
        return
    obj = json.loads(line)
    if "error" in obj:
        _stream_error(sent, obj["error"])
        return
    message = obj.get("message") or {}
    if message.get("content"):
        sent.content = True
    for index, _ in enumerate(message.get("tool_calls") or []):
        sent.tool_delivered(index)
    if obj.get("done") is True:
        sent.ends += 1


def plain_answer(sent: Sent, message: dict[str, Any]) -> None:
    """A whole (non-streamed) chat answer: completed when it has text or a tool call."""
    for index, _ in enumerate(message.get("tool_calls") or []):
        sent.tool_delivered(index)
    if message.get("content"):
        sent.content = True
    sent.ends = 1
    sent.outcome = "completed" if sent.content else "incomplete"
    if not sent.content:
        sent.detail = "an answer with neither text nor a tool call"
