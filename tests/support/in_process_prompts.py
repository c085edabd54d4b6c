"""The `Prompts` port (jobs.worker_port) for the fast tier: over a TokenCounter in the test's own process,
or a fixed count. The service itself always asks the tokenizer helper process (tray_app.tokenizer)."""

from __future__ import annotations

from typing import Any

from tray_app.tokenizer.counter import TokenCounter


class CounterPrompts:
    """The model's real tokenizer, template and grammar parser, called in this process."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter

    async def count(self, kind: str, body: dict[str, Any]) -> int:
        return self.counter.count_chat(body) if kind == "chat" else self.counter.count_completion(body)

    async def grammar_error(self, grammar: str) -> str | None:
        return self.counter.grammar_error(grammar)

    async def count_texts(self, texts: list[str]) -> list[int]:
        return [self.counter.count_text(text) for text in texts]

    async def chat_prompt(self, messages: list[dict[str, Any]], tools: Any = None) -> tuple[str, list[str]]:
        return self.counter.chat_prompt(messages, tools)

    async def count_text(self, text: str, *, special: bool = True, add_bos: bool = True) -> int:
        return self.counter.count_text(text, special=special, add_bos=add_bos)

    async def tokenize(self, text: str) -> list[int]:
        return self.counter.tokenize(text)


class FixedPrompts:
    """Every prompt is `tokens` long and every grammar valid; a chat renders as its contents joined."""

    def __init__(self, tokens: int = 5) -> None:
        self.tokens = tokens

    async def count(self, kind: str, body: dict[str, Any]) -> int:
        return self.tokens

    async def grammar_error(self, grammar: str) -> str | None:
        return None

    async def count_texts(self, texts: list[str]) -> list[int]:
        return [self.tokens for _ in texts]

    async def chat_prompt(self, messages: list[dict[str, Any]], tools: Any = None) -> tuple[str, list[str]]:
        return "".join(str(m.get("content") or "") for m in messages), []

    async def count_text(self, text: str, *, special: bool = True, add_bos: bool = True) -> int:
        return max(len(text.split()), 1)

    async def tokenize(self, text: str) -> list[int]:
        return list(range(max(len(text.split()), 1)))
