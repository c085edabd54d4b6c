"""One model's tokenizer and chat template as the service uses them: each call a request to the tokenizer
helper (tokenizer.process), awaited, so neither a long prompt nor a crash of the native code holds the
service's event loop. The jobs engine takes it as its `Prompts` (jobs.worker_port)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tray_app.tokenizer.process import TokenizerProcess


@dataclass(frozen=True)
class PromptCheck:
    """A request's prompt as its model reads it: its tokens, or why its grammar is refused."""

    tokens: int
    grammar_error: str | None = None


class ModelTokens:
    def __init__(self, helper: TokenizerProcess, model_path: Path, chat_format: str = "") -> None:
        self.helper = helper
        self.model_path = model_path
        self.chat_format = chat_format
        self._model = (str(model_path), chat_format)

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
        return (await self.check(kind, body)).tokens

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
