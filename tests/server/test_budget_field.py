"""One generation budget on every route (review F4), through a real service and the real clients: OpenAI's
`max_completion_tokens` is the budget a worker gets, on chat, completions and background jobs, whole,
streamed and resumed on the CPU after a GPU failure; Anthropic's `max_tokens`, the Responses API's
`max_output_tokens` and Ollama's `num_predict` likewise. The model's end-of-text tokens are banned where the
route lets a client say so, so that only the budget ends an answer."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.support.helpers import (
    COUNTING,
    arm,
    base_settings,
    failsoft_of,
    job_state,
    wait_replaced,
)
from tests.support.service import ServiceHandle, module_service
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

BUDGET = 5
NO_END = {"0": -100, "2": -100}  # SmolLM2's <|endoftext|> and <|im_end|>: the answer runs to its budget
CHAT: dict[str, Any] = {
    "model": "default",
    "messages": [{"role": "user", "content": "Count from one to fifty in words."}],
    "temperature": 0,
    "logit_bias": NO_END,
}
PROMPT: dict[str, Any] = dict(COUNTING)  # a completion that counts on and on (end-of-text banned)
# Replays go to the CPU however slow the machine is (the approval of slow CPU runs has its own tests).
SETTINGS = base_settings(failover={"auto_approve_seconds": 3600})


svc = module_service(enable_faults=True, settings=SETTINGS)


def test_max_completion_tokens_bounds_a_chat(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(**CHAT, max_completion_tokens=BUDGET)
    assert answer.usage is not None and answer.usage.completion_tokens == BUDGET
    assert answer.choices[0].finish_reason == "length"


def test_max_completion_tokens_bounds_a_streamed_chat(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            **CHAT, max_completion_tokens=BUDGET, stream=True, stream_options={"include_usage": True}
        )
    )
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == BUDGET


def test_max_completion_tokens_bounds_a_completion(client: openai.OpenAI) -> None:
    """The review's case: the budget was counted, then dropped by the allow-list (2,036 tokens)."""
    answer = client.completions.create(**PROMPT, extra_body={"max_completion_tokens": BUDGET})
    assert answer.usage is not None and answer.usage.completion_tokens == BUDGET
    assert answer.choices[0].finish_reason == "length"


def test_the_smaller_of_two_budget_fields_is_not_lost_to_the_other(client: openai.OpenAI) -> None:
    """Both fields sent: `max_completion_tokens` is the budget (as llama-server reads them), never more."""
    answer = client.chat.completions.create(**CHAT, max_tokens=40, max_completion_tokens=BUDGET)
    assert answer.usage is not None and answer.usage.completion_tokens == BUDGET


@pytest.mark.parametrize("body", [CHAT, PROMPT], ids=["chat", "completion"])
def test_max_completion_tokens_bounds_a_background_job(svc: ServiceHandle, body: dict[str, Any]) -> None:
    response = httpx.post(
        svc.base_url + "/v1/jobs", json={**body, "max_completion_tokens": BUDGET}, timeout=30
    )
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    done = wait_until(lambda: (s := job_state(svc, job_id))["state"] == "completed" and s, what="the job")
    assert done["result"]["usage"]["completion_tokens"] == BUDGET


def streamed_completion(client: openai.OpenAI, budget: int) -> tuple[str, dict[str, Any]]:
    chunks = list(
        client.completions.create(
            **PROMPT, extra_body={"max_completion_tokens": budget, "seed": 5}, stream=True
        )
    )
    return "".join(chunk.choices[0].text for chunk in chunks if chunk.choices), failsoft_of(chunks[-1])


def test_a_completion_resumed_on_the_cpu_keeps_the_budget(svc: ServiceHandle, client: openai.OpenAI) -> None:
    """The resume asks for what is left: the whole answer is the client's budget (the same text as without
    the failure), not the budget again after what the GPU had already sent."""
    budget = 16
    whole, first = streamed_completion(client, budget)
    assert first["worker"] == "gpu"
    armed = arm(svc, "abort", after_tokens=4)
    resumed, info = streamed_completion(client, budget)
    assert info["worker"] == "cpu" and info["fallback_reason"] == "crash_abort", info
    assert resumed == whole
    wait_replaced(svc, armed["pid"])


def test_anthropics_max_tokens_bounds_a_message(svc: ServiceHandle) -> None:
    client = anthropic.Anthropic(base_url=svc.base_url, api_key="unused", max_retries=0, timeout=120)
    message = client.messages.create(
        model="default",
        max_tokens=BUDGET,
        messages=[{"role": "user", "content": CHAT["messages"][0]["content"]}],
    )
    assert 0 < message.usage.output_tokens <= BUDGET


def test_the_responses_apis_max_output_tokens_bounds_a_response(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="default", input=CHAT["messages"][0]["content"], max_output_tokens=BUDGET
    )
    assert response.usage is not None and 0 < response.usage.output_tokens <= BUDGET


def test_ollamas_num_predict_bounds_generate_and_chat(svc: ServiceHandle) -> None:
    client = ollama.Client(host=svc.base_url, timeout=180)
    (model,) = client.list().models
    assert model.model is not None
    options = {"temperature": 0, "num_predict": BUDGET}
    generated = client.generate(model.model, prompt=PROMPT["prompt"], raw=True, options=options)
    assert generated.eval_count is not None and 0 < generated.eval_count <= BUDGET
    chatted = client.chat(model.model, messages=CHAT["messages"], options=options)
    assert chatted.eval_count is not None and 0 < chatted.eval_count <= BUDGET
