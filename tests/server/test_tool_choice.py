"""Tool calling and structured output through the router and llama-server, with the real openai client:
every tool_choice (none, auto, required, named), streamed and not, parallel_tool_calls, response_format."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.support.helpers import base_settings
from tests.support.service import module_service
from tests.support.tools import ADD_TOOL, WEATHER_TOOL

pytestmark = pytest.mark.integration

QUESTION = [{"role": "user", "content": "What is 2 plus 3? Use the add tool."}]


svc = module_service(settings=base_settings())


def _streamed(client: openai.OpenAI, **request: Any) -> tuple[str, dict[int, dict[str, str]], str | None]:
    """Content, tool calls (by index: name and arguments, put together from the deltas), finish reason."""
    text, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(**request, stream=True):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            if delta.function is not None:
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    return text, calls, finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_a_forced_tool_call_whole_and_streamed(client: openai.OpenAI, choice: Any) -> None:
    request: dict[str, Any] = {
        "model": "default",
        "messages": QUESTION,
        "tools": [WEATHER_TOOL, ADD_TOOL] if choice == "required" else [ADD_TOOL, WEATHER_TOOL],
        "tool_choice": choice,
        "max_tokens": 60,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**request)
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls" and message.tool_calls
    (call,) = message.tool_calls  # one call: a forced call ends at its closing tag
    assert call.type == "function" and call.id
    if isinstance(choice, dict):
        assert call.function.name == "add"  # type: ignore[union-attr]
    arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
    assert isinstance(arguments, dict)

    _text, calls, finish = _streamed(client, **request)
    assert finish == "tool_calls" and len(calls) == 1
    assert calls[0]["name"] == call.function.name  # type: ignore[union-attr]
    assert json.loads(calls[0]["arguments"]) == arguments  # same seed, same weights: the same call


def test_auto_and_none_answer_in_the_openai_shape(client: openai.OpenAI) -> None:
    for choice in ("auto", "none"):
        request: dict[str, Any] = {
            "model": "default",
            "messages": [{"role": "user", "content": "Say hello."}],
            "tools": [WEATHER_TOOL],
            "tool_choice": choice,
            "max_tokens": 24,
            "temperature": 0,
        }
        whole = client.chat.completions.create(**request)
        message = whole.choices[0].message
        # auto: the model may call the tool or answer; either way one well-formed message.
        assert message.content or message.tool_calls
        if choice == "none":
            assert not message.tool_calls and message.content
        text, calls, finish = _streamed(client, **request)
        assert finish in ("stop", "length", "tool_calls") and (text or calls)


def test_parallel_tool_calls_when_the_client_allows_them(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model="default",
        messages=QUESTION,
        tools=[ADD_TOOL],
        tool_choice="required",
        parallel_tool_calls=True,
        max_tokens=80,
        temperature=0,
    )
    calls = answer.choices[0].message.tool_calls or []
    # The bundled small model repeats its call when nothing ends it: allowed here, so more than one.
    assert len(calls) >= 2 and all(call.function.name == "add" for call in calls)  # type: ignore[union-attr]


def test_the_tool_result_goes_back_and_the_model_answers(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model="default", messages=QUESTION, tools=[ADD_TOOL], tool_choice="required", max_tokens=60
    )
    (call,) = first.choices[0].message.tool_calls or []
    messages: list[Any] = [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    final = client.chat.completions.create(model="default", messages=messages, max_tokens=20, temperature=0)
    assert final.choices[0].message.content


@pytest.mark.parametrize("stream", [False, True])
def test_response_format_json_object_and_json_schema(client: openai.OpenAI, stream: bool) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
        "required": ["colour"],
    }
    formats: list[Any] = [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "pick", "schema": schema}},
    ]
    for response_format in formats:
        request: dict[str, Any] = {
            "model": "default",
            "messages": [{"role": "user", "content": "Pick a colour, as JSON."}],
            "response_format": response_format,
            "max_tokens": 200,
            "temperature": 0,
        }
        if stream:
            text, _calls, finish = _streamed(client, **request)
        else:
            choice = client.chat.completions.create(**request).choices[0]
            text, finish = choice.message.content or "", choice.finish_reason
        if response_format["type"] == "json_object" and finish == "length":
            # The small model can run on (the same key again and again) until max_tokens cuts the object:
            # the grammar held if what came is JSON as far as it goes.
            text = _closed(text)
        parsed = json.loads(text)
        assert isinstance(parsed, dict)
        if response_format["type"] == "json_schema":
            assert finish == "stop"
            assert parsed["colour"] in ("red", "green", "blue")


def _closed(prefix: str) -> str:
    """A cut JSON text made whole: the open string, a key waiting for its value, the open brackets closed.
    Text that was not JSON so far stays invalid (json.loads then fails)."""
    stack, in_string, escaped = [], False, False
    for char in prefix:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            stack.append("}" if char == "{" else "]")
        elif char in "}]" and stack:
            stack.pop()
    text = (prefix[:-1] if escaped else prefix) + ('"' if in_string else "")
    stripped = text.rstrip()
    if stripped.endswith(","):
        text = stripped[:-1]
    elif stripped.endswith(":"):
        text = stripped + " null"
    elif stack and stack[-1] == "}" and stripped.endswith('"') and _awaits_colon(stripped):
        text = stripped + ": null"
    return text + "".join(reversed(stack))


def _awaits_colon(text: str) -> bool:
    """Whether the last string in an object is a key with no colon yet (after `{` or `,`)."""
    body = text[: text.rstrip('"').rfind('"')].rstrip()
    return body.endswith(("{", ","))


@pytest.mark.parametrize(
    ("prefix", "whole"),
    [
        ('{\n "name": "John",\n "reservation": "12345', {"name": "John", "reservation": "12345"}),
        ('{"a": [1, 2', {"a": [1, 2]}),
        ('{"a": 1, "b', {"a": 1, "b": None}),
        ('{"a":', {"a": None}),
        ('{"a": "x\\"y', {"a": 'x"y'}),
    ],
)
def test_a_cut_json_object_is_closed_as_far_as_it_goes(prefix: str, whole: dict[str, Any]) -> None:
    assert json.loads(_closed(prefix)) == whole


def test_text_that_is_not_json_stays_invalid() -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(_closed("Sure! Here is a colour: red"))
