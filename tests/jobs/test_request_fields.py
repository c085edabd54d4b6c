"""What reaches llama-server of a client's request (review N2): an allow-list per route, the engine's own
fields refused by name, and every field the other dialects translate into is one the workers get."""

from __future__ import annotations

import json

import pytest

from tray_app.engine.request_fields import ENGINE_INTERNAL, FORWARDED, engine_internal_field, forwarded
from tray_app.jobs.registry import worker_fields
from tray_app.server.errors import ApiError
from tray_app.server.ollama.options import SAMPLING_OPTIONS
from tray_app.server.requests import parse_request

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
