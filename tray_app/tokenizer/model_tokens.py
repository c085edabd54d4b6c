"""One model's tokenizer and chat template as the service uses them: each call a request to the tokenizer
helper (tokenizer.process), awaited, so neither a long prompt nor a crash of the native code holds the
service's event loop. The jobs engine takes it as its `Prompts` (jobs.worker_port)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tray_app.tokenizer.chat_parts import chat_extras, message_text
from tray_app.tokenizer.count_cache import CountCache, text_bytes
from tray_app.tokenizer.process import TokenizerProcess

# What the kept counts' keys may hold, as in the helper's own (tokenizer.counter): bounded by bytes.
CONTENT_CACHE_BYTES = 32 * 1024 * 1024
FRAMING_CACHE_BYTES = 4 * 1024 * 1024


def _key_bytes(key: tuple[tuple[str, ...], str]) -> int:
    roles, extras = key
    return sys.getsizeof(roles) + sum(sys.getsizeof(role) for role in roles) + sys.getsizeof(extras)


@dataclass(frozen=True)
class PromptCheck:
    """A request's prompt as its model reads it: its tokens, or why its grammar is refused."""

    tokens: int
    grammar_error: str | None = None


class ModelTokens:
    """A chat is counted in pieces (chat_parts: the framing of its roles and tools, each message's text),
    each piece's count kept here once known: a conversation resends its earlier turns, so most requests
    ask the helper for their newest message only, and a request seen before does not ask it at all."""

    def __init__(self, helper: TokenizerProcess, model_path: Path, chat_format: str = "") -> None:
        self.helper = helper
        self.model_path = model_path
        self.chat_format = chat_format
        self._model = (str(model_path), chat_format)
        self._framing: CountCache[tuple[tuple[str, ...], str]] = CountCache(FRAMING_CACHE_BYTES, _key_bytes)
        self._content: CountCache[str] = CountCache(CONTENT_CACHE_BYTES, text_bytes)

    async def check(self, kind: str, body: dict[str, Any], grammar: str | None = None) -> PromptCheck:
        """Count a chat's (`kind` "chat") or a completion's prompt tokens, after checking `grammar` with
        llama.cpp's own parser: one request to the helper."""
        answer = await self.helper.request(
            self._model, "check", {"kind": kind, "body": body, "grammar": grammar}
        )
        if answer["grammar_error"] is not None:
            return PromptCheck(0, str(answer["grammar_error"]))
        return PromptCheck(int(answer["tokens"]))

    async def count(self, kind: str, body: dict[str, Any]) -> int:
        """A chat's (`kind` "chat") or a completion's prompt tokens, as admission counts them."""
        if kind != "chat":
            return (await self.check(kind, body)).tokens
        messages = body["messages"]
        roles = tuple(str(message.get("role")) for message in messages)
        extras = chat_extras(body)
        framing_key = (roles, json.dumps(extras, sort_keys=True) if extras else "")
        framing = self._framing.get(framing_key)
        texts = [message_text(message) for message in messages]
        known = {text: count for text in set(texts) if (count := self._content.get(text)) is not None}
        missing = [text for text in dict.fromkeys(texts) if text not in known]
        if framing is None or missing:
            args = {"roles": list(roles), "extras": extras if framing is None else None, "texts": missing}
            answer = await self.helper.request(self._model, "count_parts", args)
            if framing is None:
                framing = int(answer["framing"])
                self._framing.put(framing_key, framing)
            for text, count in zip(missing, answer["texts"], strict=True):
                known[text] = int(count)
                self._content.put(text, int(count))
        return framing + sum(known[text] for text in texts)

    async def grammar_error(self, grammar: str) -> str | None:
        """None when llama.cpp's parser accepts this GBNF grammar; otherwise what it said."""
        return (await self.check("completion", {"prompt": ""}, grammar)).grammar_error

    async def count_texts(self, texts: list[str]) -> list[int]:
        """Each text's tokens as a prompt (start and special tokens in): an embeddings request's inputs."""
        return [
            int(count) for count in await self.helper.request(self._model, "count_texts", {"texts": texts})
        ]

    async def count_text(self, text: str, *, special: bool = True, add_bos: bool = True) -> int:
        args = {"text": text, "special": special, "add_bos": add_bos}
        return int(await self.helper.request(self._model, "count_text", args))

    async def tokenize(self, text: str) -> list[int]:
        return [int(token) for token in await self.helper.request(self._model, "tokenize", {"text": text})]

    async def chat_prompt(self, messages: list[dict[str, Any]], tools: Any = None) -> tuple[str, list[str]]:
        prompt, stops = await self.helper.request(
            self._model, "chat_prompt", {"messages": messages, "tools": tools}
        )
        return str(prompt), [str(stop) for stop in stops]

    async def load(self) -> None:
        """Have the helper load this model's vocabulary now (TokenizerFailed "model" when it cannot)."""
        await self.helper.request(self._model, "load", {})
