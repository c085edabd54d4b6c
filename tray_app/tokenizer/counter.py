"""The model's tokenizer and its workers' chat template, loaded from the GGUF (vocabulary only), and
llama.cpp's grammar parser: native code. It runs in the tokenizer helper process (tokenizer.helper), never
in the service's own; tests also call it directly."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tray_app.engine.llama_log import capture_llama_log
from tray_app.engine.tools import workers_template
from tray_app.tokenizer import grammar
from tray_app.tokenizer.chat_parts import chat_extras, message_text
from tray_app.tokenizer.count_cache import CountCache, text_bytes

DEFAULT_CHAT_TEMPLATE_STOP = "<|im_end|>"
# What the cached counts' keys may hold: messages' texts, and role shapes with tool lists (an agent sends the
# same few again and again). Bounded by bytes: a key is as long as the text it counts.
CONTENT_CACHE_BYTES = 32 * 1024 * 1024
FRAMING_CACHE_BYTES = 4 * 1024 * 1024


class TokenCounter:
    """The model's tokenizer and its workers' chat template, loaded once (vocab only: no weights, fast to
    load). The template is the one the workers render (`chat_format` as configured, see
    engine.tools.template_for): a prompt counted or continued here is the prompt the worker saw. A built-in
    llama.cpp template named in the config has no Jinja text here: the model's own stands in for it."""

    def __init__(self, model_path: Path, chat_format: str = "") -> None:
        # Imported here so the pure parts of this module load without the native library.
        import llama_cpp
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        # Captured, not printed: a vocab-only load warns that its 512-token context exceeds the model's
        # training context (unknown without the weights: 0); a load that fails says why in the error.
        with capture_llama_log() as load_log:
            try:
                self._llama = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)
            except ValueError as error:
                said = " ".join(load_log.text.split())[-400:]
                raise ValueError(f"{error}: {said}" if said else str(error)) from None
        self._llama_cpp = llama_cpp
        self._vocab = self._llama._model.vocab
        self._framing_cache: CountCache[tuple[tuple[str, ...], str]] = CountCache(
            FRAMING_CACHE_BYTES, _framing_bytes
        )
        self._content_cache: CountCache[str] = CountCache(CONTENT_CACHE_BYTES, text_bytes)
        metadata: dict[str, str] = self._llama.metadata
        template = workers_template(metadata.get("tokenizer.chat_template") or "", chat_format)
        self._formatter: Jinja2ChatFormatter | None = None
        if template:
            vocab = self._llama
            eos = vocab._model.token_get_text(vocab.token_eos()) if vocab.token_eos() != -1 else ""
            bos = vocab._model.token_get_text(vocab.token_bos()) if vocab.token_bos() != -1 else ""
            self._formatter = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)

    def grammar_error(self, grammar_text: str) -> str | None:
        """None when llama.cpp's parser accepts this GBNF grammar; otherwise what it said."""
        return grammar.grammar_error(self._vocab, grammar_text)

    def count_text(self, text: str, *, special: bool = True, add_bos: bool = True) -> int:
        data = text.encode("utf-8")
        capacity = len(data) + 8  # never more tokens than bytes, plus BOS/EOS
        buffer = (self._llama_cpp.llama_token * capacity)()
        count = self._llama_cpp.llama_tokenize(
            self._vocab, data, len(data), buffer, capacity, add_bos, special
        )
        return abs(int(count))

    def tokenize(self, text: str) -> list[int]:
        """`text`'s tokens as llama-server makes them of a prompt string (start token, special tokens
        parsed): a prefix of them sent as token ids shares its cache with the string sent later."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buffer = (self._llama_cpp.llama_token * capacity)()
        count = self._llama_cpp.llama_tokenize(self._vocab, data, len(data), buffer, capacity, True, True)
        return list(buffer[: max(int(count), 0)])

    def _framing(self, roles: tuple[str, ...], tools: Any = None) -> int:
        """Tokens the chat template adds around messages with these roles, and the tools it renders
        (cached: the same few shapes and tool lists recur), counted by rendering it once with empty
        messages."""
        key = (roles, json.dumps(tools) if tools else "")
        cached = self._framing_cache.get(key)
        if cached is None:
            empty = [{"role": role, "content": ""} for role in roles]
            prompt, _ = self.chat_prompt(empty, tools)
            cached = self.count_text(prompt)
            if tools and prompt == self.chat_prompt(empty)[0]:
                # A template that does not write tools: llama-server describes them itself, in JSON.
                cached += self._content_tokens(json.dumps(tools))
            self._framing_cache.put(key, cached)
        return cached

    def _content_tokens(self, text: str) -> int:
        """Tokens of one message's text; cached, since a conversation resends its earlier turns."""
        cached = self._content_cache.get(text)
        if cached is None:
            cached = self.count_text(text, special=False, add_bos=False)
            self._content_cache.put(text, cached)
        return cached

    def chat_prompt(self, messages: list[dict[str, Any]], tools: Any = None) -> tuple[str, list[str]]:
        """The prompt the worker's template makes of these messages (and `tools`, where the template
        renders them), ready for the answer, and its stops."""
        if self._formatter is None:
            text = "".join(f"<|im_start|>{m.get('role')}\n{message_text(m)}<|im_end|>\n" for m in messages)
            return text + "<|im_start|>assistant\n", [DEFAULT_CHAT_TEMPLATE_STOP]
        plain: Any = [{**m, "content": message_text(m)} for m in messages]
        result = self._formatter(messages=plain, tools=tools or None)
        stops = result.stop if isinstance(result.stop, list) else [result.stop] if result.stop else []
        return result.prompt, stops

    def count_chat(self, body: dict[str, Any]) -> int:
        """The prompt's tokens: the template's framing for these roles and tools plus each message's own
        tokens. Counting the pieces (cached) instead of the rendered whole keeps admission well under a
        millisecond; a merge across a piece boundary can make it differ from the exact count by a token."""
        messages = body["messages"]
        total = self.framing_tokens(tuple(str(m.get("role")) for m in messages), chat_extras(body))
        return total + sum(self.content_tokens(message_text(m)) for m in messages)

    def framing_tokens(self, roles: tuple[str, ...], extras: dict[str, Any]) -> int:
        """What a chat's prompt holds beside its messages' texts: the template's framing for these roles and
        the tools it renders, plus what the template does not render (the tools without a template here, a
        forced tool choice: its call's opening, see engine.tools; old-style functions), whose JSON size is
        a fair token estimate. A response format becomes a grammar, not prompt text."""
        tools = extras.get("tools")
        total = self._framing(roles, tools if self._formatter else None)
        rendered = ("tools",) if self._formatter else ()
        for name, value in extras.items():
            if name not in rendered:
                total += self._content_tokens(json.dumps(value))
        return total

    def content_tokens(self, text: str) -> int:
        """One message's text's tokens, as count_chat counts them (cached)."""
        return self._content_tokens(text)

    @property
    def cached_bytes(self) -> int:
        """What the cached counts' keys hold, in bytes (at most CONTENT_CACHE_BYTES + FRAMING_CACHE_BYTES)."""
        return self._content_cache.held_bytes + self._framing_cache.held_bytes

    def count_completion(self, body: dict[str, Any]) -> int:
        prompt = body["prompt"]
        return self.count_text(prompt if isinstance(prompt, str) else "".join(prompt))


def _framing_bytes(key: tuple[tuple[str, ...], str]) -> int:
    roles, tools = key
    return sys.getsizeof(roles) + sum(sys.getsizeof(role) for role in roles) + sys.getsizeof(tools)
