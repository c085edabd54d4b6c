"""A thinking model's reasoning through the router, on real llama-server workers: streamed and not, turned
off by the request, and resumed on the CPU when the GPU fails mid-thought.

The bundled SmolLM2 has no thinking template; here it gets one in the Qwen3 form
(tests/support/thinking-chatml.jinja), which opens the answer inside `<think>`. SmolLM2 never closes the
block, so llama-server parts everything it writes into `reasoning_content`: the same path a real thinking
model's reasoning takes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.helpers import arm, base_settings, failsoft_of, wait_replaced
from tests.support.service import ServiceHandle, module_service

pytestmark = pytest.mark.integration

TEMPLATE = Path(__file__).parent.parent / "support" / "thinking-chatml.jinja"
SETTINGS = base_settings(model={"chat_format": str(TEMPLATE)}, failover={"auto_approve_seconds": 3600})
QUESTION = [{"role": "user", "content": "What is two plus two?"}]
REQUEST: dict[str, Any] = dict(model="default", messages=QUESTION, max_tokens=24, temperature=0, seed=5)


svc = module_service(enable_faults=True, settings=SETTINGS)


def _reasoning(message: Any) -> str:
    return str((message.model_extra or {}).get("reasoning_content") or "")


@pytest.fixture(scope="module")
def gpu_reasoning(client: openai.OpenAI) -> str:
    """The GPU worker's reasoning for REQUEST (temperature 0, pinned seed), answered in one piece."""
    completion = client.chat.completions.create(**REQUEST)
    assert failsoft_of(completion)["worker"] == "gpu"
    reasoning = _reasoning(completion.choices[0].message)
    assert len(reasoning.split()) >= 4, completion
    return reasoning


def _streamed(client: openai.OpenAI, request: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    chunks = list(client.chat.completions.create(**request, stream=True))
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    reasoning = "".join(_reasoning(delta) for delta in deltas)
    content = "".join(delta.content or "" for delta in deltas)
    return reasoning, content, failsoft_of(chunks[-1])


def test_a_streamed_answer_carries_its_reasoning(client: openai.OpenAI, gpu_reasoning: str) -> None:
    reasoning, content, info = _streamed(client, REQUEST)
    assert reasoning == gpu_reasoning
    assert content == ""  # the model never closed its thinking block
    assert info["worker"] == "gpu" and info["attempts"] == 1


def test_a_request_can_turn_thinking_off(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(**REQUEST, reasoning_effort="none")  # type: ignore[arg-type]
    message = completion.choices[0].message
    assert message.content
    assert _reasoning(message) == ""


def test_an_idempotent_replay_keeps_the_reasoning(svc: ServiceHandle, gpu_reasoning: str) -> None:
    url = svc.v1 + "/chat/completions"
    for stream in (False, True):
        body, headers = {**REQUEST, "stream": stream}, {"Idempotency-Key": f"reasoning-replay-{stream}"}
        first = httpx.post(url, json=body, headers=headers, timeout=60)
        again = httpx.post(url, json=body, headers=headers, timeout=60)
        assert again.headers["Idempotent-Replayed"] == "true"
        if stream:  # the stored answer, told again as a short stream
            assert f'"reasoning_content": {json.dumps(gpu_reasoning)}' in again.text
        else:
            assert first.json()["choices"][0]["message"]["reasoning_content"] == gpu_reasoning
            assert again.json()["choices"][0]["message"]["reasoning_content"] == gpu_reasoning


@pytest.mark.parametrize("after_tokens", [3, 8])
def test_a_stream_that_fails_mid_thought_continues_the_thought_on_the_cpu(
    svc: ServiceHandle, client: openai.OpenAI, gpu_reasoning: str, after_tokens: int
) -> None:
    armed = arm(svc, "abort", after_tokens=after_tokens)
    reasoning, content, info = _streamed(client, REQUEST)
    assert info["worker"] == "cpu" and info["attempts"] == 2 and info["fallback_reason"] == "crash_abort"
    # llama-server on the CPU continued the delivered thought (same model, greedy): the client reads one
    # reasoning, nothing of it repeated, the GPU's own words, and within the request's budget (llama-server's
    # first chunk carries two tokens: the budget left counts the delivered text's tokens, not its chunks).
    assert reasoning == gpu_reasoning
    assert content == ""
    wait_replaced(svc, armed["pid"])


def test_a_non_streamed_answer_that_fails_is_replayed_with_its_reasoning(
    svc: ServiceHandle, client: openai.OpenAI, gpu_reasoning: str
) -> None:
    armed = arm(svc, "kill", after_tokens=4)
    completion = client.chat.completions.create(**REQUEST)
    assert failsoft_of(completion)["worker"] == "cpu"
    assert _reasoning(completion.choices[0].message) == gpu_reasoning
    wait_replaced(svc, armed["pid"])


def test_ollama_clients_get_the_reasoning_as_thinking(svc: ServiceHandle, gpu_reasoning: str) -> None:
    options = {"num_predict": 24, "seed": 5, "temperature": 0}
    body = {"model": "default", "messages": QUESTION, "options": options}
    whole = httpx.post(svc.base_url + "/api/chat", json={**body, "stream": False}, timeout=60).json()
    assert whole["message"]["thinking"] == gpu_reasoning and whole["message"]["content"] == ""
    with httpx.stream("POST", svc.base_url + "/api/chat", json=body, timeout=60) as response:
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert "".join(line["message"].get("thinking", "") for line in lines) == gpu_reasoning
    assert lines[-1]["done"] is True
    off = httpx.post(svc.base_url + "/api/chat", json={**body, "stream": False, "think": False}, timeout=60)
    assert off.json()["message"]["content"] and "thinking" not in off.json()["message"]
    shown = httpx.post(svc.base_url + "/api/show", json={"model": "default"}, timeout=60).json()
    assert "thinking" in shown["capabilities"]


def test_a_json_answer_that_fails_mid_thought_is_continued_in_its_format(
    svc: ServiceHandle, client: openai.OpenAI
) -> None:
    """Only reasoning had reached the client: the CPU's continuation still answers in the asked format
    (llama-server applies it to the answer still to come). `reasoning_budget_tokens` makes SmolLM2 close its
    thinking, so that an answer follows."""
    request = {
        **REQUEST,
        "max_tokens": 48,
        "response_format": {"type": "json_object"},
        "extra_body": {"reasoning_budget_tokens": 6},
    }
    armed = arm(svc, "abort", after_tokens=3)
    reasoning, content, info = _streamed(client, request)
    assert info["worker"] == "cpu" and info["attempts"] == 2 and info["fallback_reason"] == "crash_abort"
    assert reasoning and content.lstrip().startswith("{")
    wait_replaced(svc, armed["pid"])


def test_responses_api_clients_get_the_reasoning_as_its_own_item(
    client: openai.OpenAI, gpu_reasoning: str
) -> None:
    ask: dict[str, Any] = {"model": "default", "input": QUESTION, "max_output_tokens": 24, "temperature": 0}
    whole = client.responses.create(**ask)
    reasoning = [item for item in whole.output if item.type == "reasoning"]
    assert len(reasoning) == 1 and reasoning[0].content is not None
    assert reasoning[0].content[0].text == gpu_reasoning
    deltas = [
        event.delta
        for event in client.responses.create(**ask, stream=True)
        if event.type == "response.reasoning_text.delta"
    ]
    assert "".join(deltas) == gpu_reasoning


def test_anthropic_clients_get_the_reasoning_as_thinking_blocks(
    svc: ServiceHandle, gpu_reasoning: str
) -> None:
    client = anthropic.Anthropic(base_url=svc.base_url, api_key="unused", max_retries=0, timeout=120)
    ask: dict[str, Any] = {
        "model": "default",
        "messages": QUESTION,
        "max_tokens": 24,
        "extra_body": {"temperature": 0},
    }
    whole = client.messages.create(**ask)
    assert whole.content[0].type == "thinking" and whole.content[0].thinking == gpu_reasoning
    with client.messages.stream(**ask) as stream:
        deltas = [event.delta for event in stream if event.type == "content_block_delta"]
    assert "".join(delta.thinking for delta in deltas if delta.type == "thinking_delta") == gpu_reasoning
    plain = client.messages.create(**ask, thinking={"type": "disabled"})
    assert [block.type for block in plain.content] == ["text"]
