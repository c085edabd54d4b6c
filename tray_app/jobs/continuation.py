"""Resuming a thinking model's streamed answer on another worker: llama-server continues a trailing assistant
message (its reasoning and its text so far) and parts what follows into reasoning and answer as usual.

A continuation through the raw completion endpoint cannot do that: its text would come back unparted, the
rest of the reasoning and the model's closing tag arriving as answer text. llama-server at this commit
starts a continued message's stream by repeating it (it parses the prefill together with the new tokens), so
what the client already has is cut from the front of each field before anything goes out.
"""

from __future__ import annotations

from typing import Any

FIELDS = ("reasoning_content", "content")


def continuation_messages(
    messages: list[dict[str, Any]], reasoning: str, content: str
) -> list[dict[str, Any]]:
    """The request's messages with the answer so far as the assistant message llama-server continues."""
    return [*messages, {"role": "assistant", "content": content, "reasoning_content": reasoning}]


class EchoedPrefix:
    """Cuts the repeated answer-so-far from the front of a continued stream's deltas, field by field."""

    def __init__(self, reasoning: str, content: str) -> None:
        self._left = {"reasoning_content": reasoning, "content": content}

    def cut(self, delta: dict[str, Any]) -> dict[str, Any]:
        """`delta` without what the client already has. Where the repeat differs from what was delivered
        (llama-server may re-part whitespace at the reasoning's end), the cutting stops at the first
        difference: new text is never dropped, at most a few characters arrive twice."""
        if not any(self._left.values()):
            return delta
        out = dict(delta)
        for field in FIELDS:
            left, text = self._left[field], out.get(field)
            if not left or not isinstance(text, str) or not text:
                continue
            same = _common_prefix(left, text)
            if same == len(text) and same < len(left):
                self._left[field] = left[same:]  # all of it repeated: more of the repeat may follow
                del out[field]
                continue
            self._left[field] = ""
            out[field] = text[same:]
            if not out[field]:
                del out[field]
        if out.get("content") and self._left["reasoning_content"]:
            self._left["reasoning_content"] = ""  # the answer has begun: the reasoning's repeat is over
        return out


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for index in range(n):
        if a[index] != b[index]:
            return index
    return n
