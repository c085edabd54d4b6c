"""A real `failsoft serve`: bad input that gave 500s (a lone surrogate, a keep-alive past a float's range, an
empty `max_body` set over HTTP) is refused or taken; an Ollama client's model names work on every route;
embeddings are bounded by their tokens, counted as the workers count them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.helpers import base_settings
from tests.support.service import ServiceHandle, module_service
from tray_app.tokenizer.counter import TokenCounter

pytestmark = pytest.mark.integration

MAX_REQUEST_TOKENS = 700  # embeddings.max_request_tokens here: one input at the limit fits, two do not
CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2, "temperature": 0}


svc = module_service(settings=base_settings(embeddings={"max_request_tokens": MAX_REQUEST_TOKENS}))


def post(svc: ServiceHandle, path: str, raw: bytes) -> httpx.Response:
    headers = {"Content-Type": "application/json", **svc.headers()}
    return httpx.post(svc.base_url + path, content=raw, headers=headers, timeout=120)


def post_json(svc: ServiceHandle, path: str, body: dict[str, Any]) -> httpx.Response:
    return post(svc, path, json.dumps(body).encode())


# ------------------------------------------------------------------------------------------ N10
def test_a_lone_surrogate_is_a_400_naming_the_field(svc: ServiceHandle) -> None:
    raw = b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}'
    response = post(svc, "/v1/chat/completions", raw)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "messages[0].content" and "surrogate" in error["message"]
    ollama = post(
        svc, "/api/chat", b'{"model": "default", "messages": [{"role": "user", "content": "\\udfff"}]}'
    )
    assert ollama.status_code == 400 and "surrogate" in ollama.json()["error"]
    anthropic = post(
        svc, "/v1/messages", b'{"max_tokens": 2, "messages": [{"role": "user", "content": "\\ud800"}]}'
    )
    assert anthropic.status_code == 400 and anthropic.json()["type"] == "error"


def test_an_integer_keep_alive_past_a_floats_range_keeps_the_model(svc: ServiceHandle) -> None:
    raw = json.dumps(CHAT).encode()[:-1] + b', "keep_alive": 1' + b"0" * 400 + b"}"
    response = post(svc, "/v1/chat/completions", raw)
    assert response.status_code == 200, response.text
    ollama = post(svc, "/api/generate", b'{"model": "default", "keep_alive": 1' + b"0" * 400 + b"}")
    assert ollama.status_code == 200, ollama.text


def test_an_empty_max_body_is_refused_naming_the_file_and_key(svc: ServiceHandle) -> None:
    response = httpx.patch(
        svc.base_url + "/failsoft/config",
        json={"changes": {"server": {"max_body": ""}}},
        headers=svc.headers(),
        timeout=30,
    )
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "server.max_body" in message and str(svc.config_path) in message
    assert post_json(svc, "/v1/chat/completions", CHAT).status_code == 200  # generation goes on


# ------------------------------------------------------------------------------------------ Ollama's names
def test_the_name_api_tags_lists_works_on_every_route_and_answers_as_asked(svc: ServiceHandle) -> None:
    tags = httpx.get(svc.base_url + "/api/tags", headers=svc.headers(), timeout=30).json()
    name = tags["models"][0]["name"]
    assert name.endswith(":latest")
    chat = post_json(svc, "/v1/chat/completions", {**CHAT, "model": name})
    assert chat.status_code == 200 and chat.json()["model"] == name, chat.text  # as Ollama's OpenAI routes
    completion = post_json(svc, "/v1/completions", {"model": name, "prompt": "1, 2,", "max_tokens": 2})
    assert completion.status_code == 200 and completion.json()["model"] == name, completion.text
    embedding = post_json(svc, "/v1/embeddings", {"model": name, "input": "hello"})
    assert embedding.status_code == 200 and embedding.json()["model"] == name, embedding.text
    message = post_json(svc, "/v1/messages", {**CHAT, "model": name})
    assert message.status_code == 200 and message.json()["model"] == name, message.text
    with httpx.stream(
        "POST", svc.base_url + "/v1/chat/completions", json={**CHAT, "model": name, "stream": True},
        headers=svc.headers(), timeout=60,
    ) as stream:  # fmt: skip
        chunks = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: {")]
    assert chunks and {chunk["model"] for chunk in chunks} == {name}
    assert chunks[-1]["failsoft"]["model"] == svc.status()["model"]["id"]  # the library's own name stays here
    assert (
        post_json(svc, "/v1/chat/completions", {**CHAT, "model": name.replace(":latest", ":7b")}).status_code
        == 404
    )


# ------------------------------------------------------------------------------------------ N9
@pytest.fixture(scope="module")
def tokens(model_path: Path) -> TokenCounter:
    return TokenCounter(model_path)


def text_of(tokens: TokenCounter, count: int) -> str:
    """Text of exactly `count` tokens as the embeddings worker counts them."""
    text = "word" + " word" * (count - 1)
    while tokens.count_text(text) > count:
        text = text[: text.rindex(" ")]
    assert tokens.count_text(text) == count
    return text


def test_embeddings_inputs_are_counted_as_the_worker_counts_them_and_bounded(
    svc: ServiceHandle, tokens: TokenCounter
) -> None:
    limit = 512  # embeddings.n_ctx 2048 over 2 slots, and budget.n_ubatch 512: the worker's physical batch
    at_limit = post_json(svc, "/v1/embeddings", {"input": text_of(tokens, limit)})
    assert at_limit.status_code == 200, at_limit.text
    assert at_limit.json()["usage"]["prompt_tokens"] == limit  # the worker counts what admission counted
    over = post_json(svc, "/v1/embeddings", {"input": ["hello", text_of(tokens, limit + 1)]})
    assert over.status_code == 400, over.text
    error = over.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "input[1]")
    ollama = post_json(svc, "/api/embed", {"model": "default", "input": text_of(tokens, limit + 1)})
    assert ollama.status_code == 400 and "input[0]" in ollama.json()["error"]
    batch = post_json(svc, "/v1/embeddings", {"input": [text_of(tokens, 400), text_of(tokens, 400)]})
    assert batch.status_code == 400 and batch.json()["error"]["code"] == "max_tokens_per_request", batch.text
    restarts = {role: worker["restarts"] for role, worker in svc.status()["embedding_workers"].items()}
    assert set(restarts.values()) == {0}  # nothing over the limits reached a worker
