"""OpenAI's Responses API (`POST /v1/responses`) on real llama-server workers, with the real openai client:
whole and streamed (its own stream helper put together from the events), function calls over two turns,
a GPU failure under a stream, and what is not supported."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.support.helpers import arm, base_settings, wait_replaced
from tests.support.service import ServiceHandle, module_service
from tests.support.tools import ADD_TOOL

pytestmark = pytest.mark.integration

# A question SmolLM2 answers in a few words (at temperature 0): the answer ends by itself, "completed".
ASK: dict[str, Any] = {
    "model": "default",
    "instructions": "Answer in one sentence.",
    "input": "What colour is the sky?",
    "max_output_tokens": 120,
    "temperature": 0,
}
ADD = {"type": "function", **ADD_TOOL["function"]}  # the drill's tool, in the Responses shape


svc = module_service(enable_faults=True, settings=base_settings(failover={"auto_approve_seconds": 3600}))


def _failsoft(response: Any) -> dict[str, Any]:
    info: dict[str, Any] = (response.model_extra or {})["failsoft"]
    return info


def test_a_whole_response(client: openai.OpenAI) -> None:
    response = client.responses.create(**ASK)
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed" and response.output_text
    assert [item.type for item in response.output] == ["message"]
    assert response.usage is not None and response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert _failsoft(response)["worker"] == "gpu"


def test_a_streamed_response_is_the_whole_one_told_in_events(client: openai.OpenAI) -> None:
    whole = client.responses.create(**ASK)
    with client.responses.stream(**ASK) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds
    assert final.output_text == whole.output_text  # temperature 0: the same words
    assert final.usage is not None and final.usage.output_tokens == whole.usage.output_tokens  # type: ignore[union-attr]


@pytest.mark.parametrize("stream", [False, True])
def test_a_function_call_and_its_result_over_two_turns(client: openai.OpenAI, stream: bool) -> None:
    ask = {
        "model": "default",
        "input": [{"role": "user", "content": "What is 2 plus 3? Use the add tool."}],
        "tools": [ADD],
        "tool_choice": "required",
        "max_output_tokens": 60,
        "temperature": 0,
    }
    if stream:
        with client.responses.stream(**ask) as events:  # type: ignore[arg-type]
            kinds = {event.type for event in events}
            first = events.get_final_response()
        assert "response.function_call_arguments.delta" in kinds
    else:
        first = client.responses.create(**ask)  # type: ignore[arg-type]
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "add" and calls[0].call_id
    arguments = json.loads(calls[0].arguments)
    assert set(arguments) == {"a", "b"}
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "5"}
    second = client.responses.create(
        model="default",
        input=[*ask["input"], calls[0].model_dump(exclude_none=True), result],  # type: ignore[list-item]
        tools=[ADD],  # type: ignore[list-item]
        tool_choice="none",  # the answer now, in words (SmolLM2 would call the tool again)
        max_output_tokens=30,
        temperature=0,
    )
    assert second.output_text


def test_a_gpu_failure_under_a_stream_is_answered_on_the_cpu(
    svc: ServiceHandle, client: openai.OpenAI
) -> None:
    whole = client.responses.create(**ASK)
    armed = arm(svc, "abort", after_tokens=0)
    with client.responses.stream(**ASK) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert _failsoft(final)["worker"] == "cpu" and _failsoft(final)["fallback_reason"] == "crash_abort"
    assert final.output_text == whole.output_text
    wait_replaced(svc, armed["pid"])


def test_a_stored_response_is_continued_from_its_id(client: openai.OpenAI) -> None:
    first = client.responses.create(**ASK)
    assert first.store is True and first.output_text
    follow = {"input": "And at night?", "max_output_tokens": 40, "temperature": 0}
    # The new request's instructions replace the stored one's (OpenAI's rule): none are carried over.
    continued = client.responses.create(
        model="default", previous_response_id=first.id, instructions="Be brief.", **follow
    )
    assert continued.previous_response_id == first.id
    spelled_out = [
        {"role": "user", "content": ASK["input"]},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": follow["input"]},
    ]
    whole = client.responses.create(
        model="default", instructions="Be brief.", **{**follow, "input": spelled_out}
    )
    # Temperature 0: the same conversation read by the worker gives the same words, and the same count.
    assert continued.output_text == whole.output_text
    assert continued.usage is not None and whole.usage is not None
    assert continued.usage.input_tokens == whole.usage.input_tokens


def test_a_function_calls_result_continues_the_stored_response(client: openai.OpenAI) -> None:
    ask = {
        "model": "default",
        "input": "What is 2 plus 3? Use the add tool.",
        "tools": [ADD],
        "tool_choice": "required",
        "max_output_tokens": 60,
        "temperature": 0,
    }
    first = client.responses.create(**ask)  # type: ignore[arg-type]
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "5"}
    answer = {"tools": [ADD], "tool_choice": "none", "max_output_tokens": 30, "temperature": 0}
    continued = client.responses.create(
        model="default",
        previous_response_id=first.id,
        input=[result],
        **answer,  # type: ignore[arg-type]
    )
    spelled_out = [
        {"role": "user", "content": ask["input"]},
        calls[0].model_dump(exclude_none=True),
        result,
    ]
    whole = client.responses.create(model="default", input=spelled_out, **answer)  # type: ignore[arg-type]
    assert continued.output_text
    assert (continued.status, continued.output_text) == (whole.status, whole.output_text)


def test_an_unknown_or_unstored_previous_response_is_not_found(client: openai.OpenAI) -> None:
    unstored = client.responses.create(**{**ASK, "store": False})
    assert unstored.store is False
    for previous in (unstored.id, "resp_000000000000000000000000", "job-123"):
        with pytest.raises(openai.NotFoundError) as missing:
            client.responses.create(**{**ASK, "previous_response_id": previous})
        error = missing.value.body
        assert isinstance(error, dict) and error["code"] == "previous_response_not_found"
        assert error["param"] == "previous_response_id" and previous in error["message"]
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(previous)


def test_input_tokens_are_counted_as_the_worker_reads_them(client: openai.OpenAI) -> None:
    asked = {"model": "default", "instructions": ASK["instructions"], "input": ASK["input"]}
    counted = client.responses.input_tokens.count(**asked)
    answered = client.responses.create(**ASK)
    assert counted.object == "response.input_tokens"
    assert answered.usage is not None and counted.input_tokens == answered.usage.input_tokens
    follow = {"model": "default", "previous_response_id": answered.id, "input": "And at night?"}
    continued = client.responses.create(**follow, max_output_tokens=8, temperature=0)
    assert continued.usage is not None
    assert client.responses.input_tokens.count(**follow).input_tokens == continued.usage.input_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_a_stored_response_is_retrieved_as_it_was_answered(client: openai.OpenAI, stream: bool) -> None:
    ask = {**ASK, "metadata": {"case": "retrieve"}}
    if stream:
        with client.responses.stream(**ask) as events:
            for _ in events:
                pass
            answered = events.get_final_response()
    else:
        answered = client.responses.create(**ask)
    again = client.responses.retrieve(answered.id)
    assert (again.id, again.status, again.output_text) == (answered.id, "completed", answered.output_text)
    assert again.usage == answered.usage and again.instructions == ASK["instructions"]
    assert again.metadata == {"case": "retrieve"}
    if not stream:  # a stream's events carry the request's time, before the answer began
        assert again.created_at == answered.created_at
    # The id carries the job's read token: the job's own id (in the event stream) does not read it.
    job_part, _, token = answered.id.removeprefix("resp_").rpartition("_")
    assert job_part and token
    for guess in (f"resp_{job_part}", f"resp_{job_part}_{'0' * len(token)}"):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(guess)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("conversation", "conv_123"),
        ("tools", [{"type": "web_search"}]),
        ("input", [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]),
    ],
)
def test_what_is_not_supported_is_a_400_naming_it(client: openai.OpenAI, field: str, value: Any) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(**{**ASK, field: value})
    error = refused.value.body
    assert isinstance(error, dict) and str(error.get("param") or "").startswith(field)


def test_a_web_page_cannot_use_it(svc: ServiceHandle) -> None:
    url = svc.v1 + "/responses"
    page = httpx.post(url, json=ASK, headers={"Origin": "https://evil.example"}, timeout=30)
    rebound = httpx.post(url, json=ASK, headers={"Host": "evil.example"}, timeout=30)
    assert (page.status_code, rebound.status_code) == (403, 403)
    assert page.json()["error"]["code"] == "forbidden_origin"
    assert httpx.get(url, timeout=30).status_code == 405


def test_an_idempotency_key_gets_the_same_response_again(client: openai.OpenAI) -> None:
    key = {"Idempotency-Key": "responses-once"}
    first = client.responses.create(**ASK, extra_headers=key)
    again = client.responses.with_raw_response.create(**ASK, extra_headers=key)
    assert again.headers["Idempotent-Replayed"] == "true"
    replayed = again.parse()
    assert (replayed.id, replayed.output_text) == (first.id, first.output_text)
