"""The Responses API's translation (fast tier): requests into chat completions, the router's answers and
event streams back into Responses (tray_app.server.responses)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tray_app.contract.vocabulary import RESPONSE_NOTE
from tray_app.jobs.assemble import chat_chunk
from tray_app.jobs.registry import worker_fields
from tray_app.server.errors import ApiError
from tray_app.server.responses.stream import ResponsesStream
from tray_app.server.responses.translate import (
    chat_request,
    history_of,
    response_of,
    retrieved,
    stored_response,
)
from tray_app.server.streaming import DONE, failsoft_chunk, sse

FAILSOFT = {"worker": "gpu", "attempts": 1}


def test_input_items_become_the_chat_they_stand_for() -> None:
    body = {
        "model": "default",
        "instructions": "Be brief.",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Add 2 "},
                    {"type": "input_text", "text": "and 3."},
                ],
            },
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a":2,"b":3}'},
            {"type": "function_call", "call_id": "c2", "name": "add", "arguments": '{"a":0,"b":0}'},
            {"type": "function_call_output", "call_id": "c1", "output": "5"},
            {"type": "message", "role": "developer", "content": "Say the sum."},
        ],
        "tools": [{"type": "function", "name": "add", "parameters": {"type": "object"}, "strict": True}],
        "tool_choice": {"type": "function", "name": "add"},
        "max_output_tokens": 40,
        "text": {
            "format": {"type": "json_schema", "name": "sum", "schema": {"type": "object"}, "strict": True}
        },
        "reasoning": {"effort": "none"},
        "store": False,
        "stream": True,
    }
    chat = chat_request(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 2 and 3."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":2,"b":3}'}},
                {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a":0,"b":0}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "developer", "content": "Say the sum."},
    ]
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert chat["max_tokens"] == 40 and chat["reasoning_effort"] == "none"
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "sum", "schema": {"type": "object"}, "strict": True},
    }
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert chat_request({"input": "Hi"})["messages"] == [{"role": "user", "content": "Hi"}]


def test_a_translated_body_notes_its_instructions_and_storage_for_the_router_alone() -> None:
    chat = chat_request({"input": "Hi", "instructions": "Be brief.", "store": False})
    assert chat[RESPONSE_NOTE] == {
        "instructions": True,
        "messages": 2,
        "store": False,
        "request": {"instructions": "Be brief.", "store": False},  # what a retrieved response echoes
    }
    assert not stored_response(chat)
    assert stored_response(chat_request({"input": "Hi"}))  # store is OpenAI's default
    assert RESPONSE_NOTE not in worker_fields("chat", chat) and "stream_options" not in worker_fields(
        "chat", chat
    )


def test_a_stored_response_continues_without_its_instructions_with_its_answer() -> None:
    stored = chat_request({"input": "What is 2 plus 3?", "instructions": "Use tools."})
    # A forced call's opening tag, which the router adds for the worker, is not the conversation's.
    stored["messages"].append({"role": "assistant", "content": "<tool_call>\n"})
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":2,"b":3}'}}
    result = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}
    history = history_of(stored, result)
    assert history == [
        {"role": "user", "content": "What is 2 plus 3?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    follow = {
        "input": [{"type": "function_call_output", "call_id": "c1", "output": "5"}],
        "instructions": "Hi",
    }
    assert chat_request(follow, history)["messages"] == [
        {"role": "system", "content": "Hi"},
        *history,
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]
    # Without instructions of its own, a first system message is the conversation's and stays.
    plain = chat_request(
        {"input": [{"role": "system", "content": "Rules."}, {"role": "user", "content": "Hi"}]}
    )
    answered = {"choices": [{"message": {"content": "Hello."}}]}
    assert [m["content"] for m in history_of(plain, answered)] == ["Rules.", "Hi", "Hello."]


@pytest.mark.parametrize(
    ("state", "status"),
    [
        ("queued", "queued"),
        ("running", "in_progress"),
        ("awaiting_approval", "in_progress"),
        ("cancelled", "cancelled"),
    ],
)
def test_a_stored_response_not_completed_is_retrieved_with_its_status(state: str, status: str) -> None:
    chat = chat_request({"model": "default", "input": "Hi", "temperature": 0.5, "metadata": {"k": "v"}})
    answer = retrieved(chat, state, None, None, "resp_1", 1700000000.0)
    assert (answer["id"], answer["status"], answer["output"]) == ("resp_1", status, [])
    assert answer["temperature"] == 0.5 and answer["metadata"] == {"k": "v"}  # as asked
    assert answer["created_at"] == 1700000000 and answer["error"] is None


def test_a_failed_stored_response_is_retrieved_with_its_error() -> None:
    chat = chat_request({"input": "Hi"})
    error = {"message": "the CPU fallback was refused", "code": "fallback_refused"}
    answer = retrieved(chat, "failed", None, error, "resp_1", 0.0)
    assert answer["status"] == "failed" and answer["error"] == error
    from_journal = retrieved(chat, "rejected", None, "rejected by the user", "resp_1", 0.0)
    assert from_journal["error"] == {"code": "server_error", "message": "rejected by the user"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({"input": "x", "background": True}, "background"),
        ({"input": []}, "input"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content"),
        ({"input": "x", "tools": [{"type": "file_search"}]}, "tools"),
        ({"input": "x", "tool_choice": "any"}, "tool_choice"),
        ({"input": "x", "text": {"format": {"type": "grammar"}}}, "text.format"),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as refused:
        chat_request(body)
    assert refused.value.status == 400 and refused.value.param == param


def test_a_whole_answer_becomes_a_response_with_its_items() -> None:
    result = {
        "id": "c",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Five.",
                    "reasoning_content": "2+3",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
                    ],
                },
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3},
        "failsoft": FAILSOFT,
    }
    response = response_of({"input": "x", "max_output_tokens": 3}, result, "resp_1")
    assert [item["type"] for item in response["output"]] == ["reasoning", "message", "function_call"]
    assert response["output"][1]["content"][0]["text"] == "Five."
    assert response["output"][2]["call_id"] == "c1" and response["output"][2]["name"] == "add"
    assert response["status"] == "incomplete" and response["incomplete_details"] == {
        "reason": "max_output_tokens"
    }
    assert response["usage"]["total_tokens"] == 10 and response["max_output_tokens"] == 3
    assert response["failsoft"] == FAILSOFT


def _events(data: bytes) -> list[dict[str, Any]]:
    blocks = [block for block in data.split(b"\n\n") if block]
    events = []
    for block in blocks:
        name, payload = block.split(b"\n")
        event = json.loads(payload[len(b"data: ") :])
        assert name == b"event: " + event["type"].encode()
        events.append(event)
    return events


def test_a_stream_becomes_response_events_in_order() -> None:
    chunks = [
        chat_chunk("c", 1, "m", {"role": "assistant", "content": None}, None),
        chat_chunk("c", 1, "m", {"reasoning_content": "Sum"}, None),
        chat_chunk("c", 1, "m", {"content": "Calling"}, None),
        chat_chunk(
            "c",
            1,
            "m",
            {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "add", "arguments": '{"a"'}}]},
            None,
        ),
        chat_chunk("c", 1, "m", {"tool_calls": [{"index": 0, "function": {"arguments": ": 2}"}}]}, None),
        chat_chunk("c", 1, "m", {}, "tool_calls"),
        failsoft_chunk("chat", "c", 1, "m", FAILSOFT, {"prompt_tokens": 4, "completion_tokens": 4}),
    ]
    data = b"".join(sse(chunk) for chunk in chunks) + DONE
    stream = ResponsesStream({"input": "x"}, "resp_1", "default")
    out = b"".join(stream.feed(data[i : i + 9]) for i in range(0, len(data), 9)) + stream.finish()
    events = _events(out)
    assert [event["type"] for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["reasoning", "message", "function_call"]
    assert final["output"][2]["arguments"] == '{"a": 2}' and final["output"][2]["status"] == "completed"
    assert final["usage"]["output_tokens"] == 4 and final["failsoft"] == FAILSOFT
    assert [event["output_index"] for event in events if event["type"] == "response.output_item.added"] == [
        0,
        1,
        2,
    ]


def test_an_error_or_a_cut_stream_fails_the_response() -> None:
    failed = ResponsesStream({"input": "x"}, "resp_1", "default")
    data = sse(chat_chunk("c", 1, "m", {"content": "Hi"}, None)) + sse(
        {"error": {"message": "GPU gone", "code": "crash_abort"}}
    )
    events = _events(failed.feed(data) + failed.finish())
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"] == {"code": "crash_abort", "message": "GPU gone"}
    assert "response.output_item.done" in [event["type"] for event in events]  # the open message is closed
    cut = ResponsesStream({"input": "x"}, "resp_2", "default")
    events = _events(cut.feed(sse(chat_chunk("c", 1, "m", {"content": "Hi"}, None))) + cut.finish())
    assert events[-1]["type"] == "response.failed" and events[-1]["response"]["error"]["code"] == "stream_cut"


def test_the_routers_keep_alive_passes_as_a_comment() -> None:
    stream = ResponsesStream({"input": "x"}, "resp_1", "default")
    out = stream.feed(b": keepalive\n\n")
    assert out.endswith(b"\n\n: keepalive\n\n")  # after response.created and in_progress
    assert stream.feed(b": keepalive\n\n") == b": keepalive\n\n"


def _call(index: int, arguments: str, name: str = "") -> dict[str, Any]:
    function = {"arguments": arguments, **({"name": name} if name else {})}
    return chat_chunk(
        "c", 1, "m", {"tool_calls": [{"index": index, "id": f"c{index}", "function": function}]}, None
    )


def test_a_late_delta_of_a_done_function_call_is_dropped() -> None:
    chunks = [
        _call(0, '{"a": 1}', "add"),
        _call(1, '{"a": 2}', "add"),
        _call(0, ', "late": true'),  # after item 0 was done
        chat_chunk("c", 1, "m", {}, "tool_calls"),
        failsoft_chunk("chat", "c", 1, "m", FAILSOFT, {"prompt_tokens": 4, "completion_tokens": 4}),
    ]
    stream = ResponsesStream({"input": "x"}, "resp_1", "default")
    events = _events(stream.feed(b"".join(sse(chunk) for chunk in chunks) + DONE) + stream.finish())
    done_at = {
        event["output_index"]: n for n, event in enumerate(events) if event["type"].endswith("item.done")
    }
    for n, event in enumerate(events):
        if event["type"] == "response.function_call_arguments.delta":
            assert n < done_at[event["output_index"]], event  # never after its item was done
    final = events[-1]["response"]
    assert [item["arguments"] for item in final["output"]] == ['{"a": 1}', '{"a": 2}']
