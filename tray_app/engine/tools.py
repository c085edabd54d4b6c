"""Tool calling through llama-server (`--jinja`): the chat template a model needs for it, and how the router
words `tool_choice` for it.

llama-server builds a grammar from the chat template's own tool-call syntax. A chatml model whose template
has no tools (SmolLM2) gets a ChatML template with Hermes-style `<tool_call>` blocks
(resources/templates/chatml-tools.jinja), which llama.cpp's template analysis recognises.

At the vendored commit llama-server takes `tool_choice` only as a string ("none", "auto", "required"); an
object naming a function falls back to "auto" with a warning. So a named choice goes to the worker as
"required" with only that tool, which its grammar then allows. "required" still lets a model write text
before its call, and a small model may never get to it; with the bundled template the router starts the
answer with the call's opening tag (an assistant prefill, which llama-server continues), so the grammar
holds from the first token. The grammar then allows one call after another, and a small model keeps
repeating the first (`parallel_tool_calls: false` does not narrow it at this commit): a forced call ends at
its closing tag unless the client explicitly allows parallel calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tray_app import paths

CHATML_TOOLS_TEMPLATE = paths.RESOURCES_DIR / "templates" / "chatml-tools.jinja"
CHATML_TOOL_CALL_OPENER = "<tool_call>\n"
CHATML_TOOL_CALL_CLOSER = "</tool_call>"


def template_for(own_template: str, configured: str) -> str:
    """The worker's `chat_format`: the configured one, else the bundled tool template for a chatml model
    whose own template knows no tools, else "" (the model's own)."""
    if configured:
        return configured
    if "<|im_start|>" in own_template and "tool" not in own_template:
        return str(CHATML_TOOLS_TEMPLATE)
    return ""


def workers_template(own_template: str, configured: str) -> str:
    """The Jinja text the workers render: a template file's (the configured one, or the bundled tool
    template that template_for picks), else the model's own."""
    chat_format = template_for(own_template, configured)
    if is_template_file(chat_format):
        return Path(chat_format).read_text(encoding="utf-8")
    return own_template


def is_template_file(chat_format: str) -> bool:
    return chat_format.endswith(".jinja") or "/" in chat_format


def tool_call_opener(chat_format: str) -> str:
    """The text that starts a tool call in this worker's template, when the router knows it ("" if not)."""
    if chat_format and Path(chat_format) == CHATML_TOOLS_TEMPLATE:
        return CHATML_TOOL_CALL_OPENER
    return ""


def worker_tool_choice(body: dict[str, Any], opener: str) -> dict[str, Any]:
    """The request as llama-server takes its tool choice (see the module's docstring); unchanged when the
    request has no tools or lets the model choose."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not tools or choice in (None, "auto", "none"):
        return body
    body = dict(body)
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        body["tools"] = [tool for tool in tools if (tool.get("function") or {}).get("name") == name]
        body["tool_choice"] = "required"
    single = body.get("parallel_tool_calls") is not True
    if single:
        body["parallel_tool_calls"] = False  # one call per block in the grammar
    if opener:
        body["messages"] = [*body["messages"], {"role": "assistant", "content": opener}]
        if single:
            stop = body.get("stop")
            stops = [stop] if isinstance(stop, str) else list(stop or [])
            body["stop"] = [*stops, CHATML_TOOL_CALL_CLOSER]  # and one block
    return body
