"""How much text a request's prompt holds, which decides whether it is counted off the event loop."""

from __future__ import annotations

from tray_app.jobs.prompt_count import COUNT_INLINE_CHARS, prompt_chars


def test_messages_and_parts_count() -> None:
    body = {"messages": [{"role": "user", "content": "abc"}, {"role": "user", "content": [{"text": "de"}]}]}
    assert prompt_chars("chat", body) == 5
    assert prompt_chars("completion", {"prompt": "abcdef"}) == 6


def test_a_long_tools_list_and_tool_call_arguments_count_too() -> None:
    """A template renders every tool's definition into the prompt: 300 tools are a long prompt."""
    tool = {"type": "function", "function": {"name": "f", "description": "d" * 300, "parameters": {}}}
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [tool] * 300}
    assert prompt_chars("chat", body) > COUNT_INLINE_CHARS
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "x" * 70_000}}
    replayed = {"messages": [{"role": "assistant", "content": None, "tool_calls": [call]}]}
    assert prompt_chars("chat", replayed) == 70_000
