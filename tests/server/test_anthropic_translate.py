"""The Messages API's translation (fast tier): requests into chat completions, the router's answers and event
streams back into Anthropic's shapes (tray_app.server.anthropic), and its errors from every layer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tray_app.jobs.assemble import chat_chunk
from tray_app.server.anthropic.paths import DIALECT as ANTHROPIC
from tray_app.server.anthropic.stream import MessagesStream
from tray_app.server.anthropic.translate import chat_request, error_message, message_of
from tray_app.server.dialect import dialect_for
from tray_app.server.errors import ApiError, bad_request
from tray_app.server.http import error_response
from tray_app.server.ollama.paths import DIALECT as OLLAMA
from tray_app.server.routes import DIALECTS
from tray_app.server.streaming import DONE, failsoft_chunk, sse

FAILSOFT = {"worker": "gpu", "attempts": 1}


def test_a_conversation_with_tool_use_becomes_the_chat_it_stands_for() -> None:
    body = {
        "model": "default",
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Add 2"}, {"type": "text", "text": "and 3."}],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I add.", "signature": "s"},
                    {"type": "text", "text": "Adding."},
                    {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 2, "b": 3}},
                    {"type": "tool_use", "id": "t2", "name": "add", "input": {"a": 0, "b": 0}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "5"},
                    {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "0"}]},
                    {"type": "text", "text": "Say the sum."},
                ],
            },
        ],
        "tools": [{"name": "add", "description": "Adds.", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "add", "disable_parallel_tool_use": True},
        "max_tokens": 40,
        "stop_sequences": ["END"],
        "temperature": 0.2,
        "top_k": 5,
        "thinking": {"type": "disabled"},
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
        "metadata": {"user_id": "u"},
        "stream": True,
    }
    chat = chat_request(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 2\nand 3."},
        {
            "role": "assistant",
            "content": "Adding.",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                },
                {
                    "id": "t2",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 0, "b": 0}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "5"},
        {"role": "tool", "tool_call_id": "t2", "content": "0"},
        {"role": "user", "content": "Say the sum."},
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {"name": "add", "parameters": {"type": "object"}, "description": "Adds."},
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert chat["parallel_tool_calls"] is False
    assert (chat["max_tokens"], chat["stop"], chat["temperature"], chat["top_k"]) == (40, ["END"], 0.2, 5)
    assert chat["reasoning_effort"] == "none"
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": {"type": "object"}},
    }
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert "metadata" not in chat


def test_defaults_follow_anthropics() -> None:
    tools = [{"name": "add", "input_schema": {"type": "object"}}]
    chat = chat_request({"messages": [{"role": "user", "content": "Hi"}], "tools": tools})
    assert chat["messages"] == [{"role": "user", "content": "Hi"}]
    assert chat["parallel_tool_calls"] is True and "tool_choice" not in chat  # several calls a turn may make
    assert chat["stream"] is False and "max_tokens" not in chat
    assert (
        chat_request({"messages": [{"role": "user", "content": "Hi"}], "tool_choice": {"type": "any"}})[
            "tool_choice"
        ]
        == "required"
    )
    counted = chat_request({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 0}, counting=True)
    assert "max_tokens" not in counted and "stream" not in counted


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0]",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "tool_use"}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": "x"}], "system": 5}, "system"),
        (
            {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search_20250305"}]},
            "tools[0]",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "some"}}, "tool_choice"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "mcp_servers": [{"url": "u"}]}, "mcp_servers"),
        ({"messages": [{"role": "user", "content": "x"}], "stop_sequences": [1]}, "stop_sequences"),
        (
            {"messages": [{"role": "user", "content": "x"}], "output_config": {"format": {"type": "regex"}}},
            "output_config.format",
        ),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as refused:
        chat_request(body)
    assert refused.value.status == 400 and refused.value.param == param


def _result(message: dict[str, Any], finish: str, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": "c",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 7, "completion_tokens": completion_tokens},
        "failsoft": FAILSOFT,
    }


def test_prompt_tokens_from_the_workers_cache_are_cache_reads() -> None:
    result = _result({"content": "x"}, "stop", 2)
    result["usage"]["prompt_tokens_details"] = {"cached_tokens": 5}
    usage = message_of({}, result, "msg_1")["usage"]
    assert (usage["input_tokens"], usage["cache_read_input_tokens"], usage["output_tokens"]) == (2, 5, 2)


def test_a_whole_answer_becomes_a_message_with_its_blocks() -> None:
    call = {"id": "t1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}
    result = _result({"content": "Five.", "reasoning_content": "2+3", "tool_calls": [call]}, "tool_calls", 9)
    message = message_of({"max_tokens": 50}, result, "msg_1")
    assert message["content"] == [
        {"type": "thinking", "thinking": "2+3", "signature": ""},
        {"type": "text", "text": "Five."},
        {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 2}},
    ]
    assert (message["id"], message["type"], message["role"], message["model"]) == (
        "msg_1",
        "message",
        "assistant",
        "m",
    )
    assert message["stop_reason"] == "tool_use" and message["stop_sequence"] is None
    assert message["usage"]["input_tokens"] == 7 and message["usage"]["output_tokens"] == 9
    assert message["failsoft"] == FAILSOFT


@pytest.mark.parametrize(
    ("finish", "tokens", "reason"),
    [
        ("stop", 3, "end_turn"),
        ("length", 10, "max_tokens"),  # the client's own budget
        ("length", 4, "model_context_window_exceeded"),  # fitted to what the slot's context left
    ],
)
def test_the_stop_reason_says_what_ended_the_answer(finish: str, tokens: int, reason: str) -> None:
    message = message_of({"max_tokens": 10}, _result({"content": "x"}, finish, tokens), "msg_1")
    assert message["stop_reason"] == reason


def _events(data: bytes) -> list[dict[str, Any]]:
    events = []
    for block in (block for block in data.split(b"\n\n") if block):
        name, payload = block.split(b"\n")
        event = json.loads(payload[len(b"data: ") :])
        assert name == b"event: " + event["type"].encode()
        events.append(event)
    return events


def test_a_stream_becomes_message_events_in_order() -> None:
    chunks = [
        chat_chunk("c", 1, "m", {"role": "assistant", "reasoning_content": "Sum"}, None),
        chat_chunk("c", 1, "m", {"content": "Calling"}, None),
        chat_chunk(
            "c",
            1,
            "m",
            {"tool_calls": [{"index": 0, "id": "t1", "function": {"name": "add", "arguments": '{"a"'}}]},
            None,
        ),
        chat_chunk("c", 1, "m", {"tool_calls": [{"index": 0, "function": {"arguments": ": 2}"}}]}, None),
        chat_chunk(
            "c", 1, "m", {"tool_calls": [{"index": 1, "id": "t2", "function": {"name": "add"}}]}, None
        ),
        chat_chunk("c", 1, "m", {}, "tool_calls"),
        failsoft_chunk("chat", "c", 1, "m", FAILSOFT, {"prompt_tokens": 4, "completion_tokens": 6}),
    ]
    data = b"".join(sse(chunk) for chunk in chunks) + DONE
    stream = MessagesStream({"max_tokens": 50}, "msg_1")
    out = b"".join(stream.feed(data[i : i + 9]) for i in range(0, len(data), 9)) + stream.finish()
    events = _events(out)
    assert [(event["type"], event.get("index")) for event in events] == [
        ("message_start", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_delta", 2),
        ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("content_block_start", 3),
        ("content_block_stop", 3),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert events[0]["message"]["id"] == "msg_1" and events[0]["message"]["model"] == "m"
    assert [events[i]["content_block"]["type"] for i in (1, 4, 7, 11)] == [
        "thinking",
        "text",
        "tool_use",
        "tool_use",
    ]
    assert events[2]["delta"] == {"type": "thinking_delta", "thinking": "Sum"}
    assert events[5]["delta"] == {"type": "text_delta", "text": "Calling"}
    assert events[7]["content_block"] == {"type": "tool_use", "id": "t1", "name": "add", "input": {}}
    assert [events[i]["delta"]["partial_json"] for i in (8, 9)] == ['{"a"', ": 2}"]
    end = events[-2]
    assert end["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert (end["usage"]["input_tokens"], end["usage"]["output_tokens"]) == (4, 6)
    assert end["failsoft"] == FAILSOFT


def test_an_error_or_a_cut_stream_ends_with_an_error_event() -> None:
    failed = MessagesStream({}, "msg_1")
    data = sse(chat_chunk("c", 1, "m", {"content": "Hi"}, None)) + sse(
        {"error": {"message": "no worker", "type": "service_unavailable", "code": "crash_abort"}}
    )
    events = _events(failed.feed(data) + failed.finish())
    assert [event["type"] for event in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "error",
    ]
    assert events[-1]["error"] == {"type": "overloaded_error", "message": "no worker"}
    cut = MessagesStream({}, "msg_2")
    events = _events(cut.feed(sse(chat_chunk("c", 1, "m", {"content": "Hi"}, None))) + cut.finish())
    assert events[-1]["type"] == "error" and events[-1]["error"]["type"] == "api_error"
    nothing = MessagesStream({"model": "default"}, "msg_3")
    events = _events(nothing.finish())
    assert [event["type"] for event in events] == ["message_start", "error"]


def test_a_prompt_too_long_says_so_in_the_words_clients_look_for() -> None:
    too_long = ApiError(400, "needs 9000 tokens, fits 8192", code="context_length_exceeded").body_bytes()
    assert error_message(400, too_long) == "prompt is too long: needs 9000 tokens, fits 8192"
    assert error_message(503, ApiError(503, "the GPU is gone").body_bytes()) == "the GPU is gone"
    assert error_message(502, b"bad gateway") == "bad gateway"


def test_errors_of_every_layer_come_in_the_callers_shape() -> None:
    assert [
        dialect_for(path, DIALECTS).name
        for path in ("/v1/messages", "/v1/messages/count_tokens", "/api/chat", "/v1/models")
    ] == [
        "anthropic",
        "anthropic",
        "ollama",
        "openai",
    ]
    error = bad_request("'x' is wrong", "x")
    anthropic = json.loads(error_response(error, api=ANTHROPIC).body)
    assert anthropic == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "'x' is wrong"},
    }
    assert json.loads(error_response(error, api=OLLAMA).body) == {"error": "'x' is wrong"}
    assert json.loads(error_response(error).body)["error"]["param"] == "x"
    overloaded = json.loads(error_response(ApiError(503, "busy"), api=ANTHROPIC).body)
    assert overloaded["error"]["type"] == "overloaded_error"


def test_the_routers_keep_alive_is_a_ping_once_message_start_is_out() -> None:
    stream = MessagesStream({}, "msg_1")
    # Before the first chunk (a job awaiting approval): a comment, never a ping ahead of message_start.
    waiting = stream.feed(b": keepalive\n\n")
    assert waiting == b": keepalive\n\n"
    first = stream.feed(sse(chat_chunk("c", 1, "m", {"content": "Hi"}, None)) + b": keepalive\n\n")
    types = [event["type"] for event in _events(first)]
    assert types[0] == "message_start" and types[-1] == "ping"


def test_a_late_delta_of_a_closed_tool_use_block_is_dropped() -> None:
    def call(index: int, arguments: str) -> dict[str, Any]:
        function = {"name": "add", "arguments": arguments}
        return chat_chunk(
            "c", 1, "m", {"tool_calls": [{"index": index, "id": f"t{index}", "function": function}]}, None
        )

    chunks = [
        call(0, '{"a": 1}'),
        call(1, '{"a": 2}'),
        call(0, ', "late": true'),  # after block 0 was closed
        chat_chunk("c", 1, "m", {}, "tool_calls"),
        failsoft_chunk("chat", "c", 1, "m", FAILSOFT, {"prompt_tokens": 4, "completion_tokens": 4}),
    ]
    stream = MessagesStream({}, "msg_1")
    events = _events(stream.feed(b"".join(sse(chunk) for chunk in chunks) + DONE) + stream.finish())
    stopped: set[int] = set()
    for event in events:
        if event["type"] == "content_block_stop":
            stopped.add(event["index"])
        elif event["type"] == "content_block_delta":
            assert event["index"] not in stopped, event  # never into a closed block
    deltas = [event["delta"]["partial_json"] for event in events if event["type"] == "content_block_delta"]
    assert deltas == ['{"a": 1}', '{"a": 2}']
