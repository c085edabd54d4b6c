"""Anthropic's Messages API (`POST /v1/messages`, what Claude Code speaks) on real llama-server workers, with
the real anthropic client: whole and streamed (its own stream helper put together from the events), tool
use over two turns, token counting, a budget larger than the context, a GPU failure under a stream, and
errors in Anthropic's shape."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from tests.support.helpers import arm, base_settings, wait_replaced
from tests.support.service import ServiceHandle, module_service
from tests.support.tools import ADD_TOOL

pytestmark = pytest.mark.integration

# A question SmolLM2 answers in a few words (at temperature 0, which this API version takes only as an
# extra field): the answer ends by itself, "end_turn".
ASK: dict[str, Any] = {
    "model": "default",
    "system": [{"type": "text", "text": "Answer in one sentence."}],
    "messages": [{"role": "user", "content": "What colour is the sky?"}],
    "max_tokens": 120,
    "extra_body": {"temperature": 0},
}
FUNCTION = ADD_TOOL["function"]
ADD = {
    "name": FUNCTION["name"],
    "description": FUNCTION["description"],
    "input_schema": FUNCTION["parameters"],
}


svc = module_service(enable_faults=True, settings=base_settings(failover={"auto_approve_seconds": 3600}))


@pytest.fixture(scope="module")
def client(svc: ServiceHandle) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=svc.base_url, api_key="unused", max_retries=0, timeout=120)


def _text(message: Any) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def test_a_whole_message(client: anthropic.Anthropic) -> None:
    message = client.messages.create(**ASK)
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert [block.type for block in message.content] == ["text"] and _text(message)
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    assert (message.model_extra or {})["failsoft"]["worker"] == "gpu"


def test_a_streamed_message_is_the_whole_one_told_in_events(client: anthropic.Anthropic) -> None:
    whole = client.messages.create(**ASK)
    with client.messages.stream(**ASK) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds[1] == "content_block_start" and "content_block_stop" in kinds and "message_delta" in kinds
    assert _text(final) == _text(whole)  # temperature 0: the same words
    assert final.stop_reason == "end_turn"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (
        whole.usage.input_tokens,
        whole.usage.output_tokens,
    )


def test_claude_codes_beta_query_reaches_the_same_route(svc: ServiceHandle) -> None:
    # Claude Code posts to /v1/messages?beta=true with its beta headers: both are the same request here.
    body = {"model": "default", "messages": ASK["messages"], "max_tokens": 8}
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219", "x-api-key": "k"}
    answer = httpx.post(svc.base_url + "/v1/messages?beta=true", json=body, headers=headers, timeout=60)
    assert answer.status_code == 200 and answer.json()["type"] == "message"


def test_the_models_list_in_anthropics_shape(svc: ServiceHandle, client: anthropic.Anthropic) -> None:
    models = list(client.models.list())  # the SDK's pager: it reads has_more and last_id
    listed = httpx.get(svc.v1 + "/models", timeout=30).json()[
        "data"
    ]  # the same list, as OpenAI's SDK reads it
    assert [model.id for model in models] == [model["id"] for model in listed]
    for model, entry in zip(models, listed, strict=True):
        assert (model.type, model.display_name) == ("model", entry["id"])
        assert int(model.created_at.timestamp()) == entry["created"]


def test_count_tokens_counts_what_the_answer_bills(client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(model="default", system=ASK["system"], messages=ASK["messages"])
    usage = client.messages.create(**ASK).usage  # the worker's own count: part of it read from its cache
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_and_its_result_over_two_turns(client: anthropic.Anthropic, stream: bool) -> None:
    ask: dict[str, Any] = {
        "model": "default",
        "messages": [{"role": "user", "content": "What is 2 plus 3? Use the add tool."}],
        "tools": [ADD],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "max_tokens": 60,
        "extra_body": {"temperature": 0},
    }
    if stream:
        with client.messages.stream(**ask) as events:
            deltas = {event.delta.type for event in events if event.type == "content_block_delta"}
            first = events.get_final_message()
        assert deltas == {"input_json_delta"}
    else:
        first = client.messages.create(**ask)
    calls = [block for block in first.content if block.type == "tool_use"]
    assert first.stop_reason == "tool_use"
    assert len(calls) == 1 and calls[0].name == "add" and calls[0].id
    assert isinstance(calls[0].input, dict) and set(calls[0].input) == {"a", "b"}
    result = {"type": "tool_result", "tool_use_id": calls[0].id, "content": [{"type": "text", "text": "5"}]}
    second = client.messages.create(
        model="default",
        messages=[
            *ask["messages"],
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result]},
        ],
        tools=[ADD],
        tool_choice={"type": "none"},  # the answer now, in words (SmolLM2 would call the tool again)
        max_tokens=30,
        extra_body={"temperature": 0},
    )
    assert _text(second) and second.stop_reason in ("end_turn", "max_tokens")


def test_a_budget_beyond_the_context_is_what_the_context_leaves(
    svc: ServiceHandle, client: anthropic.Anthropic
) -> None:
    # Claude Code asks for its models' output limit (32000 and more); a chat completion asking the same
    # is a 400, since it would not fit a slot.
    request = {**ASK, "max_tokens": 100_000}
    message = client.messages.create(**request, stream=False, timeout=120)
    assert _text(message) and message.stop_reason == "end_turn"
    chat = {"model": "default", "messages": ASK["messages"], "max_tokens": 100_000}
    assert httpx.post(svc.v1 + "/chat/completions", json=chat, timeout=60).status_code == 400


def test_a_prompt_beyond_a_gpu_slot_gets_what_a_cpu_slot_leaves(client: anthropic.Anthropic) -> None:
    # About 2100 tokens: more than a GPU slot's 2048, well within a CPU slot's 8192. The budget is fitted
    # to the CPU's slot, which answers (this module approves any CPU run); a stop ends it at once.
    prompt = "Say one word. " + "blue sky " * 1050
    message = client.messages.create(
        model="default",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=100_000,
        stop_sequences=[" ", ".", "\n"],
        stream=False,
        timeout=300,
    )
    served = (message.model_extra or {})["failsoft"]
    assert (
        served["worker"] == "cpu"
        and message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) > 2048
    )


def test_a_gpu_failure_under_a_stream_is_answered_on_the_cpu(
    svc: ServiceHandle, client: anthropic.Anthropic
) -> None:
    whole = client.messages.create(**ASK)
    armed = arm(svc, "abort", after_tokens=0)
    with client.messages.stream(**ASK) as stream:
        ends = [event for event in stream if event.type == "message_delta"]
        final = stream.get_final_message()
    served = (ends[0].model_extra or {})["failsoft"]
    assert (served["worker"], served["fallback_reason"]) == ("cpu", "crash_abort")
    assert _text(final) == _text(whole)
    wait_replaced(svc, armed["pid"])


def test_errors_come_in_anthropics_shape(svc: ServiceHandle, client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(**{**ASK, "model": "claude-sonnet-4-5"})
    with pytest.raises(anthropic.BadRequestError) as image:
        picture = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
        client.messages.create(**{**ASK, "messages": [{"role": "user", "content": [picture]}]})
    for refused, kind in ((missing.value, "not_found_error"), (image.value, "invalid_request_error")):
        assert isinstance(refused.body, dict) and refused.body["type"] == "error"
        assert refused.body["error"]["type"] == kind
    assert "image blocks are not supported" in image.value.body["error"]["message"]  # type: ignore[index]
    url = svc.base_url + "/v1/messages"
    page = httpx.post(url, json={"messages": ASK["messages"]}, headers={"Origin": "https://evil.example"})
    assert page.status_code == 403
    assert page.json()["error"]["type"] == "permission_error"
    assert httpx.get(url, timeout=30).status_code == 405


def test_an_idempotency_key_gets_the_same_message_again(client: anthropic.Anthropic) -> None:
    key = {"Idempotency-Key": "messages-once"}
    first = client.messages.create(**ASK, extra_headers=key)
    again = client.messages.with_raw_response.create(**ASK, extra_headers=key)
    assert again.headers["Idempotent-Replayed"] == "true"
    replayed = again.parse()
    assert (replayed.id, _text(replayed)) == (first.id, _text(first))
    with pytest.raises(anthropic.UnprocessableEntityError) as reused:  # the same key, another request
        client.messages.create(**{**ASK, "max_tokens": 7}, extra_headers=key)
    assert reused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    streamed = {"Idempotency-Key": "messages-once-streamed"}  # a streamed request is another body
    with client.messages.stream(**ASK, extra_headers=streamed) as stream:
        live = stream.get_final_message()
    with client.messages.stream(**ASK, extra_headers=streamed) as stream:  # the stored answer, as a stream
        told = stream.get_final_message()
    assert (told.id, _text(told), told.stop_reason) == (live.id, _text(live), "end_turn")
