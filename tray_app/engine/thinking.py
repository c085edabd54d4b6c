"""Whether a model thinks: its workers' chat template opens a reasoning block, which llama-server parts
from the answer as `reasoning_content` (its default `--reasoning-format`). The router passes that on in
OpenAI's shape; Ollama's API needs to know up front, to answer `think` as Ollama does and to list the
"thinking" capability.

Judged from the template's text: the reasoning tags and switches of the thinking templates in use (Qwen3,
DeepSeek-R1 and their kin: `<think>`, or the `</think>` an R1 template cuts earlier answers at,
`enable_thinking`, `reasoning_content`; gpt-oss: its analysis channel). llama-server's own analysis (its
template autoparser) is not exposed over HTTP at this commit.
"""

from __future__ import annotations

import functools
from pathlib import Path

from tray_app.engine.tools import is_template_file, template_for

MARKS = ("<think>", "</think>", "enable_thinking", "reasoning_content", "<|channel|>")


def template_thinks(template: str) -> bool:
    return any(mark in template for mark in MARKS)


@functools.cache
def model_thinks(model_template: str, configured_chat_format: str) -> bool:
    """Whether the workers of a model whose GGUF carries `model_template` (with this configured
    `chat_format`) think."""
    chat_format = template_for(model_template, configured_chat_format)
    if not chat_format:
        return template_thinks(model_template)
    if is_template_file(chat_format):
        try:
            return template_thinks(Path(chat_format).read_text(encoding="utf-8", errors="replace"))
        except OSError:
            return False  # the worker cannot start with it either, and says so
    return False  # a built-in llama.cpp template named in the config: not judged here
