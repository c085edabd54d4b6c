"""The chat format a worker uses when the config names none.

Checked with the bundled SmolLM2: llama-cpp-python's "chatml-function-calling" handler gives
grammar-constrained `tool_calls` for a forced `tool_choice`, but for plain chat it drops the model's own
default system prompt, and without a system message the small model then degrades (it repeats itself). So a
chatml model gets both: requests that carry tools go to "chatml-function-calling", all others to the model's
own template.
"""

from __future__ import annotations

from typing import Any

from llama_cpp import Llama, llama_chat_format

FUNCTION_CALLING_FORMAT = "chatml-function-calling"
_CHATML_MARK = "<|im_start|>"


def is_chatml(llama: Llama) -> bool:
    template = llama.metadata.get("tokenizer.chat_template") or ""
    return _CHATML_MARK in template


def use_tools_with_chatml(llama: Llama) -> str:
    """Route tool requests to the function-calling handler; returns the format name reported in /health."""
    own_format = llama.chat_format or "chat_template.default"
    own = llama._chat_handlers.get(own_format) or llama_chat_format.get_chat_completion_handler(own_format)
    tools = llama_chat_format.get_chat_completion_handler(FUNCTION_CALLING_FORMAT)

    def handler(**kwargs: Any) -> Any:
        wants_tools = bool(kwargs.get("tools") or kwargs.get("functions"))
        return (tools if wants_tools else own)(**kwargs)

    llama.chat_handler = handler
    return f"{own_format}+{FUNCTION_CALLING_FORMAT}"
