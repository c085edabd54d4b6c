"""Tool calling and structured output through the router and llama-server, with the real openai client:
every tool_choice (none, auto, required, named), streamed and not, parallel_tool_calls, response_format."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.helpers import base_settings, client_for
from tests.support.service import ServiceHandle, running_service
from tests.support.tools import WEATHER_TOOL
from tray_app.drill.scenarios import ADD_TOOL

pytestmark = pytest.mark.integration

QUESTION = [{"role": "user", "content": "What is 2 plus 3? Use the add tool."}]


@pytest.fixture(scope="module")
def svc(module_root: Path) -> Iterator[ServiceHandle]:
    with running_service(module_root, settings=base_settings()) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(svc: ServiceHandle) -> openai.OpenAI:
    return client_for(svc)


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
            "max_tokens": 200,  # the object whole: a cut one is not JSON
            "temperature": 0,
        }
        if stream:
            text, _calls, _finish = _streamed(client, **request)
        else:
            text = client.chat.completions.create(**request).choices[0].message.content or ""
        parsed = json.loads(text)
        assert isinstance(parsed, dict)
        if response_format["type"] == "json_schema":
            assert parsed["colour"] in ("red", "green", "blue")
