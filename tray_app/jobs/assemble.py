"""Turn a worker's stream of chunks into the plain OpenAI answer (the router always streams upstream), and
the shapes of OpenAI's stream chunks."""

from __future__ import annotations

import time
from typing import Any


class Assembler:
    """Accumulates chunks of one kind ("chat" or "completion") into the non-streamed response object."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.id = ""
        self.created = 0
        self.model = ""
        self.content: list[str] = []
        self.reasoning: list[str] = []  # a thinking model's reasoning, parted from the answer by llama-server
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        # Tokens generated: one per chunk with output as the chunks come, made exact by llama-server's count
        # at the end of each attempt (a tool call's arguments come several tokens to a chunk).
        self.tokens = 0
        self._attempt_start = 0  # `tokens` when the current attempt began (see begin_attempt)
        self._resumed = False  # the current attempt continues an answer: its prompt holds that answer
        # The prompt as the worker read it (its tokens, and how many of them its cache already held).
        self._worker_prompt: tuple[int, int] | None = None
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None  # llama-server's own, from its last chunk
        self.logprobs: list[dict[str, Any]] = []  # a chat's per-token log probabilities, when asked for
        self.role = "assistant"

    def feed(self, obj: dict[str, Any]) -> None:
        self.id = self.id or str(obj.get("id", ""))
        self.created = self.created or int(obj.get("created") or time.time())
        self.model = self.model or str(obj.get("model", ""))
        if obj.get("usage") and not self._resumed:
            # A resumed attempt's counts are its own request's (a prompt holding the answer so far, the
            # rest of the answer): the whole answer's are counted here instead (_usage).
            self.usage = obj["usage"]
        for choice in obj.get("choices") or []:
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            if self.kind == "completion":
                text = choice.get("text") or ""
                if text:
                    self.content.append(text)
                    self.tokens += 1
                continue
            logprobs = choice.get("logprobs")
            if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
                self.logprobs.extend(logprobs["content"])
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                self.reasoning.append(delta["reasoning_content"])
                self.tokens += 1
            if delta.get("content"):
                self.content.append(delta["content"])
                self.tokens += 1
            for call in delta.get("tool_calls") or []:
                self._add_tool_call(call)
                self.tokens += 1
        # After the chunk's own output: llama-server's counts at an attempt's end include it.
        timings = obj.get("timings")
        if timings:
            self.timings = timings
            generated = timings.get("predicted_n")
            if isinstance(generated, int) and generated >= 0:
                self.tokens = self._attempt_start + generated
            cached, read = timings.get("cache_n"), timings.get("prompt_n")
            if not self._resumed and isinstance(cached, int) and isinstance(read, int):
                self._worker_prompt = (cached + read, cached)

    def begin_attempt(self, resumed: bool = False) -> None:
        """A new attempt's chunks follow: llama-server's count at its end covers only them. `resumed`: it
        continues the answer so far, so its prompt is not the request's."""
        self._attempt_start = self.tokens
        self._resumed = resumed
        if resumed:
            self.usage = None  # an earlier attempt's counts, of an answer it did not finish

    def _add_tool_call(self, call: dict[str, Any]) -> None:
        index = int(call.get("index", 0))
        entry = self.tool_calls.setdefault(
            index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if call.get("id"):
            entry["id"] = call["id"]
        function = call.get("function") or {}
        if function.get("name"):
            entry["function"]["name"] = function["name"]
        if function.get("arguments"):
            entry["function"]["arguments"] += function["arguments"]

    @property
    def text(self) -> str:
        return "".join(self.content)

    @property
    def has_tool_calls(self) -> bool:
        return bool(self.tool_calls)

    def _usage(self, prompt_tokens: int) -> dict[str, Any]:
        """The token counts: the worker's own for the prompt where it read the request's (the router's
        count, `prompt_tokens`, for an answer resumed elsewhere), with the part its cache held."""
        if self._worker_prompt is None:
            return {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": self.tokens,
                "total_tokens": prompt_tokens + self.tokens,
            }
        prompt, cached = self._worker_prompt
        return {
            "prompt_tokens": prompt,
            "completion_tokens": self.tokens,
            "total_tokens": prompt + self.tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def result(self, prompt_tokens: int, failsoft: dict[str, Any]) -> dict[str, Any]:
        usage = self.usage or self._usage(prompt_tokens)
        if self.kind == "completion":
            choice: dict[str, Any] = {
                "index": 0,
                "text": self.text,
                "logprobs": None,
                "finish_reason": self.finish_reason or "stop",
            }
            obj = "text_completion"
        else:
            message: dict[str, Any] = {"role": self.role, "content": self.text or None}
            if self.reasoning:
                message["reasoning_content"] = "".join(self.reasoning)
            if self.tool_calls:
                message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
            choice = {
                "index": 0,
                "message": message,
                "logprobs": {"content": self.logprobs} if self.logprobs else None,
                "finish_reason": self.finish_reason or "stop",
            }
            obj = "chat.completion"
        answer = {
            **_openai_object(self.id, obj, self.created, self.model, [choice]),
            "usage": usage,
            "failsoft": failsoft,
        }
        if self.timings is not None:
            answer["timings"] = self.timings  # as llama-server's own answer has them (the last attempt's)
        return answer


def _openai_object(
    object_id: str, kind: str, created: int, model: str, choices: list[dict[str, Any]]
) -> dict[str, Any]:
    """What every OpenAI completion object opens with, a whole answer or a stream chunk."""
    return {"id": object_id, "object": kind, "created": created, "model": model, "choices": choices}


def chat_chunk(
    chunk_id: str, created: int, model: str, delta: dict[str, Any], finish: str | None
) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return _openai_object(chunk_id, "chat.completion.chunk", created, model, [choice])


def completion_chunk(
    chunk_id: str, created: int, model: str, text: str, finish: str | None
) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return _openai_object(chunk_id, "text_completion", created, model, [choice])
