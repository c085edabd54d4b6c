"""A real `failsoft serve` with real llama.cpp workers: what reaches the native parsers is bounded before it
gets there. A grammar 20,000 groups deep (which crashed the whole service inside llama.cpp's parser) and
100,000 empty messages (which held its event loop for minutes) are 400s naming the bound on every dialect's
route, and the service answers the next chat; a grammar at the bound is still served."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.helpers import base_settings
from tests.support.service import ServiceHandle, module_service
from tray_app.server.input_bounds import MAX_GRAMMAR_NESTING, MAX_MESSAGES

pytestmark = pytest.mark.integration

CHAT: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Say hi."}],
    "max_tokens": 2,
    "temperature": 0,
}
EMPTY = {"role": "user", "content": ""}
MANY = 100_000


svc = module_service(settings=base_settings())


def post_json(svc: ServiceHandle, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"Content-Type": "application/json", **svc.headers()}
    return httpx.post(svc.base_url + path, content=json.dumps(body).encode(), headers=headers, timeout=120)


def nested_grammar(depth: int) -> str:
    return "root ::= " + "(" * depth + '"a"' + ")" * depth


def message_of(response: httpx.Response) -> str:
    """The error message in any of the three shapes (OpenAI's, Anthropic's, Ollama's)."""
    error = response.json()["error"]
    return error if isinstance(error, str) else str(error["message"])


def assert_answers_on(svc: ServiceHandle) -> None:
    chat = post_json(svc, "/v1/chat/completions", CHAT)
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["content"] is not None


def test_a_grammar_nested_20000_deep_is_a_400_and_the_service_answers_on(svc: ServiceHandle) -> None:
    grammar = nested_grammar(20_000)
    bodies = {
        "/v1/chat/completions": {**CHAT, "grammar": grammar},
        "/v1/completions": {"prompt": "1, 2,", "max_tokens": 2, "grammar": grammar},
        "/v1/jobs": {**CHAT, "grammar": grammar},
    }
    for path, body in bodies.items():
        response = post_json(svc, path, body)
        assert response.status_code == 400, (path, response.text)
        error = response.json()["error"]
        assert (error["param"], error["code"]) == ("grammar", "nested_too_deep"), error
        assert f"nests 20000 groups deep; at most {MAX_GRAMMAR_NESTING} are accepted" in error["message"]
    assert_answers_on(svc)
    # At the bound, llama.cpp parses it (in the router's check and the worker) and the answer follows it.
    bounded = post_json(svc, "/v1/chat/completions", {**CHAT, "grammar": nested_grammar(MAX_GRAMMAR_NESTING)})
    assert bounded.status_code == 200, bounded.text
    assert bounded.json()["choices"][0]["message"]["content"] == "a"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [EMPTY] * MANY, "max_tokens": 2}),
        ("/v1/messages", {"messages": [EMPTY] * MANY, "max_tokens": 2}),
        ("/v1/messages/count_tokens", {"messages": [EMPTY] * MANY}),
        ("/api/chat", {"model": "default", "messages": [EMPTY] * MANY, "stream": False}),
        ("/v1/responses", {"input": [EMPTY] * MANY}),
    ],
)
def test_100000_empty_messages_are_a_400_on_every_dialects_route(
    svc: ServiceHandle, path: str, body: dict[str, Any]
) -> None:
    response = post_json(svc, path, body)
    assert response.status_code == 400, response.text
    assert "holds 100000 " in message_of(response)
    assert f"at most {MAX_MESSAGES} are accepted" in message_of(response)
    assert_answers_on(svc)
