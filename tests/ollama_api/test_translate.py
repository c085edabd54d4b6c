"""The Ollama <-> OpenAI translation, as pure functions: requests, options, formats, tools both ways, the
NDJSON stream and its last line, errors, model names, embeddings, and the paths kept apart from control."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.routing import Match

from tray_app.jobs.assemble import chat_chunk, completion_chunk
from tray_app.server.control import Control
from tray_app.server.ollama import paths
from tray_app.server.ollama.answer import (
    Timing,
    embed_answer,
    embeddings_answer,
    load_answer,
    ollama_tool_calls,
    openai_result,
)
from tray_app.server.ollama.errors import OllamaError, openai_error
from tray_app.server.ollama.names import managed_in_config, matches_model, model_name, require_model
from tray_app.server.ollama.options import map_format, map_options
from tray_app.server.ollama.request import (
    chat_request,
    embed_request,
    embeddings_request,
    generate_request,
    is_zero_keep_alive,
)
from tray_app.server.ollama.stream import StreamTranslator
from tray_app.server.origin_guard import CONTROL_PREFIX
from tray_app.server.streaming import DONE, failsoft_chunk, sse

KNOWN = {"SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1", "/models/x.gguf", "default"}
MODEL_ID = "SmolLM2-135M-Instruct.Q4_1.gguf"
FAILSOFT = {"job_id": "job_1", "worker": "cpu", "attempts": 2, "fallback_reason": "crash_abort"}


def lines(data: bytes) -> list[dict[str, Any]]:
    assert data.endswith(b"\n") or not data
    return [json.loads(line) for line in data.splitlines()]


# ------------------------------------------------------------------------------------------ names
def test_model_names_match_with_or_without_latest_and_any_case() -> None:
    assert model_name(MODEL_ID) == "SmolLM2-135M-Instruct.Q4_1:latest"
    for name in (
        "SmolLM2-135M-Instruct.Q4_1:latest",
        "smollm2-135m-instruct.q4_1",
        "default:latest",
        MODEL_ID,
    ):
        assert matches_model(name, KNOWN), name
    for name in ("smollm2:135m", "llama3:latest", "default:7b", ""):
        assert not matches_model(name, KNOWN), name
    assert require_model({"name": "default"}, KNOWN) == "default"  # the older field name
    with pytest.raises(OllamaError) as missing:
        require_model({}, KNOWN)
    assert (missing.value.status, missing.value.message) == (400, "model is required")
    with pytest.raises(OllamaError) as unknown:
        require_model({"model": "smollm2:135m"}, KNOWN)
    assert unknown.value.status == 404 and unknown.value.body() == {"error": "model 'smollm2:135m' not found"}


def test_model_management_is_refused_with_where_models_are_set() -> None:
    error = managed_in_config(KNOWN)
    assert error.status == 501 and "config file" in error.message
    assert "default" in error.message and "/models/x.gguf" not in error.message  # no paths in errors


def test_no_ollama_path_is_a_control_route() -> None:
    class FakeService:
        enable_faults = True  # every control route, the drill ones too

    control = Control(FakeService()).routes()  # type: ignore[arg-type]
    assert {"/failsoft/status", "/failsoft/jobs"} <= {route.path for route in control}
    assert all(route.path.startswith(CONTROL_PREFIX) or route.path == "/metrics" for route in control)
    for path in (*paths.OLLAMA_PATHS, "/api/blobs/sha256:0"):
        assert paths.is_ollama_path(path)
        for method in ("GET", "POST", "DELETE"):
            scope = {"type": "http", "path": path, "method": method}
            matched = [route.path for route in control if route.matches(scope)[0] != Match.NONE]
            assert not matched, (path, matched)


# --------------------------------------------------------------------------------------- requests
def test_every_option_maps() -> None:
    options = {
        "num_predict": 100,
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.05,
        "typical_p": 0.7,
        "seed": 42,
        "stop": ["\n", "user:"],
        "repeat_penalty": 1.2,
        "repeat_last_n": 33,
        "presence_penalty": 1.5,
        "frequency_penalty": 1.0,
        "mirostat": 1,
        "mirostat_tau": 0.8,
        "mirostat_eta": 0.6,
        # Load-time options: set by the plan, accepted and ignored.
        "num_ctx": 131072,
        "num_gpu": 99,
        "num_thread": 8,
        "num_batch": 2,
        "use_mmap": True,
        "low_vram": False,
        "unknown_option": 1,
    }
    assert map_options(options) == {
        "max_tokens": 100,
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.05,
        "typical_p": 0.7,
        "seed": 42,
        "stop": ["\n", "user:"],
        "repeat_penalty": 1.2,
        "repeat_last_n": 33,
        "presence_penalty": 1.5,
        "frequency_penalty": 1.0,
        "mirostat": 1,
        "mirostat_tau": 0.8,
        "mirostat_eta": 0.6,
    }
    for unlimited in (-1, -2, 0):
        assert "max_tokens" not in map_options({"num_predict": unlimited})
    assert map_options({"stop": "END"}) == {"stop": ["END"]}
    assert map_options(None) == {}


@pytest.mark.parametrize(
    ("options", "words"),
    [({"temperature": "hot"}, "temperature"), ({"num_predict": 1.5}, "num_predict"), ({"stop": [1]}, "stop")],
)
def test_bad_options_are_a_400_naming_them(options: dict[str, Any], words: str) -> None:
    with pytest.raises(OllamaError) as error:
        map_options(options)
    assert error.value.status == 400 and words in error.value.message
    with pytest.raises(OllamaError):
        map_options([1, 2])


def test_format_json_and_schema() -> None:
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    assert map_format("json") == {"type": "json_object"}
    assert map_format(schema) == {
        "type": "json_schema",
        "json_schema": {"name": "format", "schema": schema, "strict": True},
    }
    assert map_format("") is None and map_format(None) is None
    with pytest.raises(OllamaError):
        map_format("yaml")


def test_a_chat_request_becomes_an_openai_body() -> None:
    body = {
        "model": "default",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "options": {"temperature": 0, "num_predict": 8},
        "format": "json",
        "keep_alive": "5m",
        "think": False,
    }
    out = chat_request(body, MODEL_ID)
    assert out == {
        "model": MODEL_ID,
        "stream": True,  # Ollama streams unless told otherwise
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "max_tokens": 8,
        "response_format": {"type": "json_object"},
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    }
    whole = chat_request({**body, "stream": False}, MODEL_ID)
    assert whole["stream"] is False and "stream_options" not in whole


def test_tools_and_tool_history_map_to_openai() -> None:
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    body = {
        "model": "default",
        "tools": [tool],
        "messages": [
            {"role": "user", "content": "2+3?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "add", "arguments": {"a": 2}}}],
            },
            {"role": "tool", "content": "5", "tool_name": "add"},
        ],
    }
    out = chat_request(body, MODEL_ID)
    assert out["tools"] == [tool]
    call = out["messages"][1]["tool_calls"][0]
    assert call["type"] == "function" and call["function"] == {"name": "add", "arguments": '{"a": 2}'}
    assert out["messages"][2] == {"role": "tool", "content": "5", "tool_call_id": call["id"], "name": "add"}


def test_images_and_thinking_are_refused() -> None:
    with pytest.raises(OllamaError) as images:
        chat_request({"messages": [{"role": "user", "content": "x", "images": ["iVBOR"]}]}, MODEL_ID)
    assert images.value.status == 400 and "images" in images.value.message
    with pytest.raises(OllamaError) as think:
        chat_request(
            {"model": "default", "messages": [{"role": "user", "content": "x"}], "think": True}, MODEL_ID
        )
    assert think.value.message == '"default" does not support thinking'
    with pytest.raises(OllamaError):
        generate_request({"prompt": "x", "images": ["iVBOR"]}, MODEL_ID)


def test_generate_is_a_chat_of_system_and_prompt_or_raw_completion() -> None:
    kind, out = generate_request({"prompt": "Hi", "system": "Be brief.", "stream": False}, MODEL_ID)
    assert kind == "chat"
    assert out["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    kind, out = generate_request({"prompt": "1, 2,", "raw": True, "options": {"num_predict": 3}}, MODEL_ID)
    assert kind == "completion" and out["prompt"] == "1, 2," and out["max_tokens"] == 3
    for refused in (
        {"prompt": "x", "raw": True, "system": "s"},
        {"prompt": "x", "template": "{{ .Prompt }}"},
        {"prompt": "x", "suffix": "end"},
        {"prompt": "x", "context": [1, 2, 3]},
    ):
        with pytest.raises(OllamaError) as error:
            generate_request(refused, MODEL_ID)
        assert error.value.status == 400


def test_load_and_unload_answers() -> None:
    assert all(is_zero_keep_alive(value) for value in (0, 0.0, "0", "0s", "0m", "0.0h"))
    assert not any(is_zero_keep_alive(value) for value in (None, -1, "5m", "-1", False, "10s"))
    loaded = load_answer("chat", "default", {})
    assert loaded["done"] is True and loaded["done_reason"] == "load"
    assert loaded["message"] == {"role": "assistant", "content": ""}
    unloaded = load_answer("generate", "default", {"keep_alive": 0})
    assert unloaded["done_reason"] == "unload" and unloaded["response"] == ""


# -------------------------------------------------------------------------------------- responses
def test_tool_calls_map_back_with_object_arguments() -> None:
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
        {"id": "", "type": "function", "function": {"name": "noop", "arguments": "not json"}},
    ]
    assert ollama_tool_calls(calls) == [
        {"function": {"index": 0, "name": "add", "arguments": {"a": 2, "b": 3}}, "id": "c1"},
        {"function": {"index": 1, "name": "noop", "arguments": {}}},
    ]


def test_a_whole_openai_answer_becomes_ollamas() -> None:
    result = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "add", "arguments": "{}"}}
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 30, "completion_tokens": 7},
        "failsoft": FAILSOFT,
    }
    answer = openai_result("chat", "default:latest", result, Timing())
    assert answer["model"] == "default:latest" and answer["done"] is True and answer["done_reason"] == "stop"
    assert (
        answer["message"]["content"] == "" and answer["message"]["tool_calls"][0]["function"]["name"] == "add"
    )
    assert (answer["prompt_eval_count"], answer["eval_count"], answer["load_duration"]) == (30, 7, 0)
    assert answer["total_duration"] >= answer["eval_duration"] >= 0 and answer["failsoft"] == FAILSOFT
    text = {"choices": [{"text": "5, 6", "finish_reason": "length"}], "usage": {"prompt_tokens": 4}}
    generated = openai_result("generate", "m", text, Timing())
    assert generated["response"] == "5, 6" and generated["done_reason"] == "length"
    assert generated["created_at"].endswith("Z")


def test_an_openai_stream_becomes_ndjson_lines() -> None:
    events = [
        chat_chunk("id", 1, "m", {"role": "assistant", "content": ""}, None),
        chat_chunk("id", 1, "m", {"content": "The"}, None),
        chat_chunk("id", 1, "m", {"content": " sea"}, None),
        chat_chunk("id", 1, "m", {}, "stop"),
        failsoft_chunk("chat", "id", 1, "m", FAILSOFT, {"prompt_tokens": 12, "completion_tokens": 2}),
    ]
    data = b"".join(sse(event) for event in events) + DONE
    translator = StreamTranslator("chat", "default", Timing())
    # Fed in awkward pieces, as a network delivers them.
    out = b"".join(translator.feed(data[i : i + 7]) for i in range(0, len(data), 7)) + translator.finish()
    *parts, last = lines(out)
    assert [part["message"]["content"] for part in parts] == ["The", " sea"]
    assert all(part["done"] is False and part["model"] == "default" for part in parts)
    assert last["done"] is True and last["done_reason"] == "stop" and last["message"]["content"] == ""
    assert (last["prompt_eval_count"], last["eval_count"]) == (12, 2)
    assert last["prompt_eval_duration"] + last["eval_duration"] == last["total_duration"]
    assert last["failsoft"] == FAILSOFT


def test_streamed_tool_calls_go_out_whole_and_generate_uses_response() -> None:
    events = [
        chat_chunk(
            "id",
            1,
            "m",
            {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "add", "arguments": '{"a"'}}]},
            None,
        ),
        chat_chunk("id", 1, "m", {"tool_calls": [{"index": 0, "function": {"arguments": ": 2}"}}]}, None),
        chat_chunk("id", 1, "m", {}, "tool_calls"),
        failsoft_chunk("chat", "id", 1, "m", FAILSOFT),
    ]
    translator = StreamTranslator("chat", "default", Timing())
    call_line, last = lines(b"".join(translator.feed(sse(event)) for event in events))
    assert call_line["message"]["tool_calls"] == [
        {"function": {"index": 0, "name": "add", "arguments": {"a": 2}}, "id": "c"}
    ]
    assert last["done"] is True and last["done_reason"] == "stop" and last["eval_count"] == 0

    generate = StreamTranslator("generate", "default", Timing())
    out = generate.feed(sse(completion_chunk("id", 1, "m", "5,", None)))
    out += generate.feed(sse(failsoft_chunk("completion", "id", 1, "m", FAILSOFT)) + DONE)
    first, final = lines(out + generate.finish())
    assert first["response"] == "5," and final["response"] == "" and final["eval_count"] == 1


def test_stream_errors_become_ollama_error_lines() -> None:
    translator = StreamTranslator("chat", "default", Timing())
    out = translator.feed(sse(chat_chunk("id", 1, "m", {"content": "Hi"}, None)))
    out += translator.feed(sse({"error": {"message": "the CPU attempt failed", "code": "x"}}) + DONE)
    assert lines(out)[-1] == {"error": "the CPU attempt failed"}
    cut = StreamTranslator("chat", "default", Timing())
    cut_out = cut.feed(sse(chat_chunk("id", 1, "m", {"content": "Hi"}, None))) + cut.finish()
    assert "error" in lines(cut_out)[-1]  # a stream cut short never looks complete


def test_openai_errors_keep_their_status_in_ollamas_shape() -> None:
    error = openai_error(429, json.dumps({"error": {"message": "too many", "code": "queue_full"}}).encode())
    assert (error.status, error.body()) == (429, {"error": "too many"})
    assert openai_error(503, b"plain words").message == "plain words"
    assert openai_error(500, b"").message == "HTTP 500"


# ------------------------------------------------------------------------------------- embeddings
def test_embedding_requests_and_answers() -> None:
    assert embed_request({"input": "sky"}, MODEL_ID) == {"model": MODEL_ID, "input": ["sky"]}
    assert embed_request({"input": ["a", "b"]}, MODEL_ID)["input"] == ["a", "b"]
    assert embeddings_request({"prompt": "sky"}, MODEL_ID) == {"model": MODEL_ID, "input": ["sky"]}
    for bad in ({"input": 3}, {"input": ["a", 1]}, {}):
        with pytest.raises(OllamaError):
            embed_request(bad, MODEL_ID)
    with pytest.raises(OllamaError):
        embeddings_request({"prompt": ["a"]}, MODEL_ID)
    answer = {
        "data": [{"embedding": [0.3, 0.4], "index": 1}, {"embedding": [0.1, 0.2], "index": 0}],
        "usage": {"prompt_tokens": 5},
    }
    embedded = embed_answer("default", answer, Timing())
    assert embedded["embeddings"] == [[0.1, 0.2], [0.3, 0.4]]  # in input order
    assert (embedded["model"], embedded["prompt_eval_count"], embedded["load_duration"]) == ("default", 5, 0)
    assert embedded["total_duration"] >= 0
    assert embeddings_answer(answer) == {"embedding": [0.1, 0.2]}


WORKER_TIMINGS = {"prompt_n": 30, "prompt_ms": 12.5, "predicted_n": 7, "predicted_ms": 80.0}


def test_a_whole_answer_is_timed_by_the_workers_own_figures() -> None:
    result = {
        "choices": [{"message": {"content": "The sea."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 7},
        "failsoft": {**FAILSOFT, "attempts": 1},
        "timings": WORKER_TIMINGS,
    }
    answer = openai_result("chat", "m", result, Timing())
    assert (answer["prompt_eval_duration"], answer["eval_duration"]) == (12_500_000, 80_000_000)
    # Two attempts: the figures are the last one's, not the whole answer's. Its prompt time is, and the
    # rest of the answer's time is counted as generation; neither is zero (clients divide by them).
    timing = Timing(started=0, ended=500_000_000)
    replayed = openai_result("chat", "m", {**result, "failsoft": FAILSOFT}, timing)
    assert (replayed["prompt_eval_duration"], replayed["eval_duration"]) == (12_500_000, 487_500_000)
    assert replayed["total_duration"] == 500_000_000


def test_a_stream_is_timed_by_the_workers_figures_when_one_attempt_made_it() -> None:
    events = [
        chat_chunk("id", 1, "m", {"content": "The"}, None),
        {**chat_chunk("id", 1, "m", {}, "stop"), "timings": WORKER_TIMINGS},
        failsoft_chunk("chat", "id", 1, "m", {**FAILSOFT, "attempts": 1}, {"prompt_tokens": 30}),
    ]
    translator = StreamTranslator("chat", "default", Timing())
    out = translator.feed(b"".join(sse(event) for event in events) + DONE) + translator.finish()
    last = lines(out)[-1]
    assert (last["prompt_eval_duration"], last["eval_duration"]) == (12_500_000, 80_000_000)


def test_log_probabilities_go_to_the_router_and_come_back_in_ollamas_shape() -> None:
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "logprobs": True}
    assert chat_request({**body, "top_logprobs": 3}, "default")["top_logprobs"] == 3
    assert chat_request(body, "default")["logprobs"] is True
    with pytest.raises(OllamaError) as error:  # a raw prompt is a completion: llama-server has none there
        generate_request({"model": "default", "prompt": "1, 2,", "raw": True, "logprobs": True}, "default")
    assert error.value.status == 400 and "raw" in error.value.message
    top = [
        {"token": " sea", "logprob": -0.1, "bytes": [32]},
        {"token": " sky", "logprob": -2.5, "bytes": [32]},
    ]
    logprobs = {"content": [{"token": " sea", "logprob": -0.1, "bytes": [32, 115], "top_logprobs": top}]}
    expected = [
        {
            "token": " sea",
            "logprob": -0.1,
            "top_logprobs": [{"token": " sea", "logprob": -0.1}, {"token": " sky", "logprob": -2.5}],
        }
    ]
    result = {"choices": [{"message": {"content": " sea"}, "logprobs": logprobs, "finish_reason": "stop"}]}
    assert openai_result("chat", "m", result, Timing())["logprobs"] == expected
    chunk = chat_chunk("id", 1, "m", {"content": " sea"}, None)
    chunk["choices"][0]["logprobs"] = logprobs
    events = [chunk, failsoft_chunk("chat", "id", 1, "m", FAILSOFT, {"prompt_tokens": 3})]
    translator = StreamTranslator("chat", "default", Timing())
    first, last = lines(
        translator.feed(b"".join(sse(event) for event in events) + DONE) + translator.finish()
    )
    assert first["logprobs"] == expected and "logprobs" not in last


def test_think_maps_to_reasoning_effort_for_a_thinking_model() -> None:
    messages = [{"role": "user", "content": "x"}]
    assert "reasoning_effort" not in chat_request({"messages": messages}, MODEL_ID, thinks=True)
    assert "reasoning_effort" not in chat_request(
        {"messages": messages, "think": True}, MODEL_ID, thinks=True
    )
    off = chat_request({"messages": messages, "think": False}, MODEL_ID, thinks=True)
    assert off["reasoning_effort"] == "none"
    _, high = generate_request({"prompt": "x", "think": "high"}, MODEL_ID, thinks=True)
    assert high["reasoning_effort"] == "high"
    # A model that does not think: off is nothing to do, a level is refused as `true` is.
    assert "reasoning_effort" not in chat_request({"messages": messages, "think": False}, MODEL_ID)
    with pytest.raises(OllamaError) as level:
        chat_request({"model": "default", "messages": messages, "think": "low"}, MODEL_ID)
    assert level.value.message == '"default" does not support thinking'
    with pytest.raises(OllamaError) as wrong:
        chat_request({"messages": messages, "think": "very"}, MODEL_ID, thinks=True)
    assert wrong.value.status == 400 and "think" in wrong.value.message


def test_reasoning_becomes_ollamas_thinking_streamed_and_whole() -> None:
    events = [
        chat_chunk("id", 1, "m", {"role": "assistant", "content": None}, None),
        chat_chunk("id", 1, "m", {"reasoning_content": "Sum"}, None),
        chat_chunk("id", 1, "m", {"reasoning_content": " it."}, None),
        chat_chunk("id", 1, "m", {"content": "4"}, None),
        chat_chunk("id", 1, "m", {}, "stop"),
        failsoft_chunk("chat", "id", 1, "m", FAILSOFT, None),
    ]
    data = b"".join(sse(event) for event in events) + DONE
    for path_kind in ("chat", "generate"):
        translator = StreamTranslator(path_kind, "default", Timing())  # type: ignore[arg-type]
        *parts, last = lines(translator.feed(data) + translator.finish())
        if path_kind == "chat":
            said = [(p["message"].get("thinking", ""), p["message"]["content"]) for p in parts]
        else:
            said = [(p.get("thinking", ""), p["response"]) for p in parts]
        assert said == [("Sum", ""), (" it.", ""), ("", "4")]
        assert last["eval_count"] == 3
    whole = {
        "id": "id",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "4", "reasoning_content": "Sum it."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 3},
    }
    assert openai_result("chat", "default", whole, Timing())["message"]["thinking"] == "Sum it."
    assert openai_result("generate", "default", whole, Timing())["thinking"] == "Sum it."
    plain = json.loads(json.dumps(whole))
    del plain["choices"][0]["message"]["reasoning_content"]
    assert "thinking" not in openai_result("chat", "default", plain, Timing())["message"]
