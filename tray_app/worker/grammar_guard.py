"""Refuse a grammar llama.cpp cannot parse instead of crashing on it (see `tray_app.grammar_check`).

The check sits where llama-cpp-python builds the sampler, so it covers every grammar: one sent in the
request, one made from a JSON schema, one a chat handler makes for tool calls. The request then fails with a
message the router recognises as the request's own fault, and the worker keeps serving.
"""

from __future__ import annotations

from typing import Any

from llama_cpp import _internals

from tray_app.grammar_check import INVALID_GRAMMAR, grammar_error

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    original = _internals.LlamaSampler.add_grammar

    def add_grammar(self: Any, model: Any, grammar: Any) -> None:
        error = grammar_error(model.vocab, grammar._grammar, grammar._root)
        if error is not None:
            raise ValueError(f"{INVALID_GRAMMAR}: {error}")
        original(self, model, grammar)

    _internals.LlamaSampler.add_grammar = add_grammar  # type: ignore[method-assign]
    _installed = True
