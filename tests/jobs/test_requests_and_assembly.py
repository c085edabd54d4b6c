"""Request checking (400 naming the field) and assembling a streamed answer into the plain one."""

from __future__ import annotations

import json

import pytest

from tray_app.jobs.assemble import Assembler
from tray_app.server.errors import ApiError
from tray_app.server.requests import check_model, parse_request
from tray_app.server.streaming import result_to_stream

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [1]}, "messages[0]"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({**CHAT, "max_tokens": "ten"}, "max_tokens"),
        ({**CHAT, "max_tokens": 0}, "max_tokens"),
        ({**CHAT, "max_tokens": True}, "max_tokens"),
        ({**CHAT, "temperature": "hot"}, "temperature"),
        ({**CHAT, "stream": "yes"}, "stream"),
        ({**CHAT, "seed": 1.5}, "seed"),
        ({**CHAT, "seed": 2**63}, "seed"),  # the journal keeps seeds as 64-bit integers
        ({**CHAT, "seed": -(2**63) - 1}, "seed"),
        ({**CHAT, "stop": [1]}, "stop"),
        ({**CHAT, "n": 2}, "n"),
        ({**CHAT, "tools": {"a": 1}}, "tools"),
        ({**CHAT, "model": 3}, "model"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        ({"messages": [{"role": "tool", "tool_call_id": "1"}]}, "messages[0].content"),
        ({**CHAT, "logprobs": 3}, "logprobs"),
        ({**CHAT, "grammar": ["root"]}, "grammar"),
        ({**CHAT, "logit_bias": {"abc": 5}}, "logit_bias"),
        ({**CHAT, "logit_bias": {"12": "up"}}, "logit_bias"),
        ({**CHAT, "logit_bias": [1]}, "logit_bias"),
        (
            {**CHAT, "response_format": {"type": "json_schema", "json_schema": {}}},
            "response_format.json_schema",
        ),
    ],
)
def test_wrong_chat_fields_are_400_naming_the_field(body: dict[str, object], param: str) -> None:
    with pytest.raises(ApiError) as error:
        parse_request("chat", json.dumps(body).encode())
    assert error.value.status == 400
    assert error.value.param == param


@pytest.mark.parametrize("body", [{"prompt": "hi", "logprobs": 0}, {"prompt": "hi", "logprobs": 5}])
def test_completion_log_probabilities_are_refused_up_front(body: dict[str, object]) -> None:
    # llama-server gives them in the chat format only, not in the legacy completions one.
    with pytest.raises(ApiError) as error:
        parse_request("completion", json.dumps(body).encode())
    assert (error.value.status, error.value.code, error.value.param) == (400, "unsupported_value", "logprobs")
    assert "chat completions" in error.value.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**CHAT, "top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
        ({**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({**CHAT, "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ({**CHAT, "logprobs": True, "top_logprobs": 1.5}, "top_logprobs"),
        ({**CHAT, "logprobs": True, "tools": [{"type": "function", "function": {"name": "f"}}]}, "logprobs"),
    ],
)
def test_chat_log_probabilities_are_checked(body: dict[str, object], param: str) -> None:
    assert parse_request("chat", json.dumps({**CHAT, "logprobs": True, "top_logprobs": 20}).encode())
    with pytest.raises(ApiError) as error:
        parse_request("chat", json.dumps(body).encode())
    assert (error.value.status, error.value.param) == (400, param)


def test_an_image_part_is_refused_by_a_text_model() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]}
    with pytest.raises(ApiError) as error:
        parse_request("chat", json.dumps(body).encode())
    assert (error.value.status, error.value.code) == (400, "unsupported_content")
    assert error.value.param == "messages[0].content[1]"


def test_what_the_checks_accept() -> None:
    accepted = [
        (
            "chat",
            {
                "messages": [
                    {"role": "assistant", "content": None, "tool_calls": []},
                    {"role": "user", "content": "x"},
                ]
            },
        ),
        ("chat", {**CHAT, "logprobs": False, "logit_bias": {"12": -100, "-1": 2.5}}),
        ("chat", {**CHAT, "logit_bias": {"hello": 5}, "logit_bias_type": "tokens"}),
        ("chat", {**CHAT, "grammar": 'root ::= "yes"'}),
        ("chat", {**CHAT, "seed": 2**63 - 1}),
        ("chat", {**CHAT, "seed": -(2**63)}),
        ("completion", {"prompt": "hi", "logprobs": None}),
    ]
    for kind, body in accepted:
        assert parse_request(kind, json.dumps(body).encode()).body == body


@pytest.mark.parametrize("raw", [b"", b"{", b"[1, 2]", b"null", b"\xff\xfe"])
def test_malformed_bodies_are_400(raw: bytes) -> None:
    with pytest.raises(ApiError) as error:
        parse_request("chat", raw)
    assert (error.value.status, error.value.code) == (400, "invalid_json")


def test_a_good_request_keeps_its_fields_and_hash() -> None:
    raw = json.dumps({**CHAT, "max_tokens": 5, "stream": True, "model": "m"}).encode()
    parsed = parse_request("chat", raw)
    assert (parsed.stream, parsed.max_tokens, parsed.model) == (True, 5, "m")
    assert parsed.body_hash == parse_request("chat", raw).body_hash
    assert parsed.body_hash != parse_request("chat", raw.replace(b"5", b"6")).body_hash
    with pytest.raises(ApiError) as error:
        check_model(parsed, {"other"})
    assert (error.value.status, error.value.code) == (404, "model_not_found")
    check_model(parsed, {"m"})


def test_completion_prompt_must_be_text() -> None:
    with pytest.raises(ApiError):
        parse_request("completion", b'{"prompt": 5}')
    assert parse_request("completion", b'{"prompt": ["a"]}').kind == "completion"


def _chunk(delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
    return {
        "id": "c1",
        "created": 5,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def test_chat_chunks_assemble_into_one_message_with_tool_calls() -> None:
    assembler = Assembler("chat")
    for delta in (
        {"role": "assistant"},
        {"content": "Hel"},
        {"content": "lo"},
        {"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "add", "arguments": '{"a":'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]},
    ):
        assembler.feed(_chunk(delta))
    assembler.feed(_chunk({}, "tool_calls"))
    result = assembler.result(7, {"job_id": "j"})
    message = result["choices"][0]["message"]
    assert message["content"] == "Hello"
    assert message["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    ]
    assert result["choices"][0]["finish_reason"] == "tool_calls"
    assert result["usage"] == {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}
    assert result["failsoft"] == {"job_id": "j"}
    # ... and back into a stream that reassembles to the same message.
    again = Assembler("chat")
    for line in result_to_stream("chat", result):
        payload = line.decode().removeprefix("data: ").strip()
        if payload != "[DONE]":
            again.feed(json.loads(payload))
    assert again.result(7, {})["choices"][0]["message"] == message


def test_completion_chunks_assemble() -> None:
    assembler = Assembler("completion")
    for text in (" 4", ",", " 5"):
        assembler.feed({"id": "x", "choices": [{"index": 0, "text": text, "finish_reason": None}]})
    assert assembler.result(3, {})["choices"][0]["text"] == " 4, 5"


def test_the_workers_timings_are_kept_from_its_last_chunk() -> None:
    assembler = Assembler("chat")
    assembler.feed(_chunk({"content": "Hi"}))
    assert "timings" not in assembler.result(3, {})  # none given: none made up
    timings = {"prompt_n": 3, "prompt_ms": 12.5, "predicted_n": 1, "predicted_ms": 40.0}
    assembler.feed({**_chunk({}, "stop"), "timings": timings})
    assert assembler.result(3, {})["timings"] == timings


def test_the_usage_counts_the_tokens_the_worker_generated_not_its_chunks() -> None:
    # llama-server sends a tool call's arguments several tokens to a chunk; its count at the end is exact.
    call = {"index": 0, "id": "c1", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    assembler = Assembler("chat")
    assembler.feed(_chunk({"tool_calls": [call]}))
    assert assembler.result(9, {})["usage"]["completion_tokens"] == 1  # as far as the chunks tell
    assembler.feed({**_chunk({}, "tool_calls"), "timings": {"predicted_n": 12}})
    assert assembler.result(9, {})["usage"] == {
        "prompt_tokens": 9,
        "completion_tokens": 12,
        "total_tokens": 21,
    }
    # A stream resumed elsewhere: the first attempt's delivered chunks, then the second's own count.
    resumed = Assembler("chat")
    resumed.feed(_chunk({"content": "One"}))
    resumed.feed(_chunk({"content": " two"}))
    resumed.begin_attempt()
    resumed.feed(_chunk({"content": " three"}))
    resumed.feed({**_chunk({}, "stop"), "timings": {"predicted_n": 4}})
    assert resumed.tokens == 6


def test_the_usage_has_the_prompt_as_the_worker_read_it_with_what_its_cache_held() -> None:
    timings = {"cache_n": 150, "prompt_n": 23, "predicted_n": 2}
    assembler = Assembler("chat")
    assembler.feed(_chunk({"content": "Hi"}))
    assembler.feed({**_chunk({}, "stop"), "timings": timings})
    assert assembler.result(90, {})["usage"] == {
        "prompt_tokens": 173,  # not the router's 90: the worker rendered and read it
        "completion_tokens": 2,
        "total_tokens": 175,
        "prompt_tokens_details": {"cached_tokens": 150},
    }
    # A resumed attempt's prompt holds the answer so far: the router's count of the request stands.
    resumed = Assembler("chat")
    resumed.feed(_chunk({"content": "Hi"}))
    resumed.begin_attempt(resumed=True)
    resumed.feed({**_chunk({"content": " there"}, "stop"), "timings": timings})
    assert resumed.result(90, {})["usage"] == {
        "prompt_tokens": 90,
        "completion_tokens": 3,
        "total_tokens": 93,
    }
    # The resumed attempt's own usage counts its own request (the answer so far read as prompt, the rest
    # generated): the whole answer's counts stand instead.
    worker_says = {"prompt_tokens": 92, "completion_tokens": 1, "total_tokens": 93}
    again = Assembler("chat")
    again.feed({**_chunk({"content": "Hi"}), "usage": {"prompt_tokens": 90, "completion_tokens": 1}})
    again.begin_attempt(resumed=True)
    again.feed({**_chunk({"content": " there"}, "stop"), "timings": timings, "usage": worker_says})
    assert again.result(90, {})["usage"]["completion_tokens"] == 3


def test_a_chats_log_probabilities_are_gathered_token_by_token() -> None:
    assembler = Assembler("chat")
    assert assembler.result(3, {})["choices"][0]["logprobs"] is None  # not asked for: null, as OpenAI's
    for token, logprob in (("Hel", -0.1), ("lo", -0.5)):
        entry = {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}
        assembler.feed(
            {
                **_chunk({"content": token}),
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": token},
                        "logprobs": {"content": [entry]},
                        "finish_reason": None,
                    }
                ],
            }
        )
    content = assembler.result(3, {})["choices"][0]["logprobs"]["content"]
    assert [(item["token"], item["logprob"]) for item in content] == [("Hel", -0.1), ("lo", -0.5)]
