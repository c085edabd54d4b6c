"""What reaches llama-server of a client's request (review N2): an allow-list per route, the engine's own
fields refused by name, and every field the other dialects translate into is one the workers get."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tray_app.engine.request_fields import (
    BUDGET_ALIAS,
    ENGINE_INTERNAL,
    FORWARDED,
    engine_internal_field,
    forwarded,
)
from tray_app.jobs.registry import Job, new_id, worker_fields
from tray_app.jobs.replay import resume_request
from tray_app.server.errors import ApiError
from tray_app.server.ollama.options import SAMPLING_OPTIONS
from tray_app.server.requests import Kind, parse_request

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def test_a_worker_gets_the_allowed_fields_only() -> None:
    body = {
        **CHAT,
        "temperature": 0.2,
        "top_k": 5,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
        "metadata": {"user": "x"},
        "unknown": 1,
    }
    sent = worker_fields("chat", body)
    assert sent == {**CHAT, "temperature": 0.2, "top_k": 5, "ignore_eos": True}
    assert worker_fields("completion", {"prompt": "a", "messages": []}) == {"prompt": "a"}


def test_an_embedding_body_is_not_filtered_by_the_chat_lists() -> None:
    assert forwarded("embedding", {"input": "a", "encoding_format": "float"}) == {
        "input": "a",
        "encoding_format": "float",
    }


@pytest.mark.parametrize("name", sorted(ENGINE_INTERNAL))
def test_every_engine_field_is_refused_with_a_400_naming_it(name: str) -> None:
    assert engine_internal_field({**CHAT, name: 1}) == (name, ENGINE_INTERNAL[name])
    with pytest.raises(ApiError) as refused:
        parse_request("chat", json.dumps({**CHAT, name: 1}).encode())
    assert refused.value.status == 400 and refused.value.param == name
    assert refused.value.code == "unsupported_field"


def test_no_field_is_both_forwarded_and_refused() -> None:
    for kind, allowed in FORWARDED.items():
        assert not allowed & set(ENGINE_INTERNAL), kind


def test_the_ollama_sampling_options_reach_the_worker() -> None:
    """Ollama's options are translated to these names; a worker that never saw them would ignore them."""
    assert set(SAMPLING_OPTIONS.values()) <= FORWARDED["chat"] & FORWARDED["completion"]


# ------------------------------------------------------------------------ one budget field (review F4)
@pytest.mark.parametrize(
    ("kind", "base"), [("chat", {"messages": CHAT["messages"]}), ("completion", {"prompt": "1, 2,"})]
)
def test_max_completion_tokens_is_folded_into_max_tokens_at_parse_time(
    kind: Kind, base: dict[str, Any]
) -> None:
    """llama-server reads `max_completion_tokens` before `max_tokens`: the router keeps one of them, so the
    budget admission counts is the one every attempt sends, on both routes."""
    parsed = parse_request(kind, json.dumps({**base, "max_completion_tokens": 5}).encode())
    assert parsed.max_tokens == 5
    assert parsed.body["max_tokens"] == 5 and "max_completion_tokens" not in parsed.body
    assert worker_fields(kind, parsed.body)["max_tokens"] == 5
    both = parse_request(kind, json.dumps({**base, "max_tokens": 40, "max_completion_tokens": 5}).encode())
    assert both.max_tokens == 5 and both.body["max_tokens"] == 5  # as llama-server would read them
    # A null alias is no budget; a bad one is refused by its own name.
    unset = parse_request(kind, json.dumps({**base, "max_completion_tokens": None}).encode())
    assert unset.max_tokens is None and "max_completion_tokens" not in unset.body
    with pytest.raises(ApiError) as refused:
        parse_request(kind, json.dumps({**base, "max_completion_tokens": 0}).encode())
    assert refused.value.param == "max_completion_tokens"


def test_no_route_forwards_max_completion_tokens() -> None:
    for kind in FORWARDED:
        assert BUDGET_ALIAS not in FORWARDED[kind], kind
    # A body journaled before the fold: its figure reaches the worker as `max_tokens` (the budget the
    # resumed job is counted with, jobs.resume), never under the name llama-server would prefer.
    old = {**CHAT, "max_completion_tokens": 7}
    old.pop("max_tokens")
    assert worker_fields("chat", old) == {"messages": CHAT["messages"], "max_tokens": 7}
    assert worker_fields("completion", {"prompt": "a", "max_completion_tokens": 7}) == {
        "prompt": "a",
        "max_tokens": 7,
    }
    # The admitted budget, written by intake beside the client's alias, wins.
    assert worker_fields("chat", {**CHAT, "max_completion_tokens": 900})["max_tokens"] == CHAT["max_tokens"]


def journaled_job(kind: Kind, body: dict[str, Any]) -> Job:
    return Job(
        id=new_id("job"),
        request_id="req",
        kind=kind,
        body=body,
        stream=True,
        background=False,
        body_hash="",
        idempotency_key=None,
        prompt_tokens=10,
        max_tokens=20,
        deadline=1e12,
    )


class TemplatePrompts:
    async def chat_prompt(self, messages: list[dict[str, Any]], tools: Any = None) -> tuple[str, list[str]]:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>", ["<end>"]


async def test_a_resumed_completion_is_built_from_the_allow_list() -> None:
    """Review F4: the resume sent the raw body: every field the first attempt dropped, and a
    `max_completion_tokens` that llama-server reads before the `max_tokens` = remaining."""
    body = {
        "prompt": ["1, 2,"],
        "max_tokens": 20,
        "max_completion_tokens": 20,  # a body from before the fold at parse time
        "temperature": 0,
        "stream_options": {"include_usage": True},
        "slot_id": 3,  # unknown to the allow-list: dropped on the first attempt, so on the resume too
    }
    job = journaled_job("completion", body)
    path, sent = await resume_request(job, TemplatePrompts(), "", " 3,", 12, continued_chat=False)  # type: ignore[arg-type]
    assert path == "/v1/completions"
    assert sent == {"prompt": "1, 2, 3,", "max_tokens": 12, "temperature": 0}


async def test_a_continued_chat_asks_for_what_remains_only() -> None:
    body = {**CHAT, "max_completion_tokens": 20, "temperature": 0}
    job = journaled_job("chat", body)
    path, sent = await resume_request(job, TemplatePrompts(), "thinking", "An", 9, continued_chat=True)  # type: ignore[arg-type]
    assert path == "/v1/chat/completions"
    assert sent["max_tokens"] == 9 and "max_completion_tokens" not in sent
    chat_path, as_completion = await resume_request(job, TemplatePrompts(), "", "An", 9, continued_chat=False)  # type: ignore[arg-type]
    assert chat_path == "/v1/completions" and as_completion["max_tokens"] == 9
    assert "max_completion_tokens" not in as_completion
