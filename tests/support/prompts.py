"""A model's chat template and tokenizer, scripted, for the executor's fast tests (the real one is
tokenizer.TokenCounter, on the real model, in the tokenizer helper): a fixed prompt, and the tokens each
text has as given."""

from __future__ import annotations

from typing import Any


class ScriptedPrompts:
    """A text not given counts no tokens, so what the executor counted as it came stands."""

    def __init__(self, tokens: dict[str, int] | None = None) -> None:
        self.tokens = tokens or {}

    async def chat_prompt(self, messages: list[dict[str, Any]], tools: Any = None) -> tuple[str, list[str]]:
        return "<prompt>", []

    async def tokenize(self, text: str) -> list[int]:
        """One token per character: a prefix of the text is a prefix of its tokens, as with a real one."""
        return [ord(character) for character in text]

    async def count_text(self, text: str, *, special: bool = True, add_bos: bool = True) -> int:
        return self.tokens.get(text, 0)
