"""Fuzzed request bodies on every dialect's generation routes, and background jobs (fast tier): JSON of
random shapes and types in every field, text with lone surrogates written as escapes, numbers past any range,
nesting as deep as a body may hold. Whatever comes in, the answer is never a 500, and every refusal is in the
error shape of the API the request came in.

The real ASGI app over the answering stand-in service (tests/security/answering.py): what the routes do
with a body, its translation and its answer's, runs as it does in the service."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from tests.security.answering import answering_client, answering_service, tokens  # noqa: F401  (fixtures)

# ------------------------------------------------------------------------------------------ bodies
SURROGATES = ["\ud800", "\udfff", "\udc00x", "\ud83d\ude00", "\ud83d"]  # lone ones, and one good pair
TEXT = st.one_of(
    st.text(max_size=12),
    st.lists(st.one_of(st.characters(), st.sampled_from(SURROGATES)), max_size=6).map("".join),
    st.sampled_from(["", " ", "default", "default:latest", "user", "assistant", "tool", "function", "text"]),
)
NUMBERS = st.one_of(
    st.integers(),
    st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63) - 1, 2**64, 10**400, -(10**400)]),
    st.floats(allow_nan=True, allow_infinity=True),  # written as NaN and Infinity, which Python reads back
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12,
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer"]) | TEXT},
    optional={"content": VALUES | TEXT, "tool_calls": VALUES, "name": TEXT, "tool_call_id": TEXT},
)

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
# fmt: off
CHAT_FIELDS = [
    "messages", "model", "max_tokens", "stream", "temperature", "top_p", "tools", "tool_choice", "stop",
    "seed", "logprobs", "top_logprobs", "response_format", "logit_bias", "n", "keep_alive", "stand_in",
    "stream_options", "max_completion_tokens", "grammar", "id_slot", "n_predict",
]
RESPONSES_FIELDS = [
    "input", "instructions", "model", "stream", "tools", "tool_choice", "max_output_tokens", "temperature",
    "text", "reasoning", "store", "previous_response_id", "parallel_tool_calls",
]
MESSAGES_FIELDS = [
    "messages", "system", "model", "max_tokens", "stream", "tools", "tool_choice", "stop_sequences",
    "temperature", "top_k", "top_p", "thinking", "metadata", "output_format",
]
# fmt: on
OLLAMA_CHAT = {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "stream": False}
OLLAMA_FIELDS = ["model", "stream", "options", "format", "think", "keep_alive", "logprobs", "top_logprobs"]
# path: (dialect, a good body, the fields fuzzed besides any other)
ROUTES: dict[str, tuple[str, dict[str, Any], list[str]]] = {
    "/v1/chat/completions": ("openai", CHAT, CHAT_FIELDS),
    "/v1/completions": ("openai", {"prompt": "Hi", "max_tokens": 4}, ["prompt", *CHAT_FIELDS[1:]]),
    "/v1/jobs": ("openai", CHAT, ["prompt", *CHAT_FIELDS]),  # a background job: chat or completion
    "/v1/embeddings": (
        "openai",
        {"input": "Hi"},
        ["input", "model", "encoding_format", "dimensions", "user"],
    ),
    "/v1/responses": ("openai", {"input": "Hi", "max_output_tokens": 16}, RESPONSES_FIELDS),
    "/v1/responses/input_tokens": ("openai", {"input": "Hi"}, ["input", "instructions", "model", "tools"]),
    "/v1/messages": ("anthropic", {**CHAT, "max_tokens": 8}, MESSAGES_FIELDS),
    "/v1/messages/count_tokens": ("anthropic", {"messages": CHAT["messages"]}, MESSAGES_FIELDS),
    "/api/chat": ("ollama", OLLAMA_CHAT, ["messages", "tools", *OLLAMA_FIELDS]),
    "/api/generate": (
        "ollama",
        {"model": "default", "prompt": "Hi", "stream": False},
        ["prompt", "system", "raw", "images", "context", "suffix", "template", *OLLAMA_FIELDS],
    ),
    "/api/embed": ("ollama", {"model": "default", "input": "Hi"}, ["model", "input", "truncate", "options"]),
    "/api/embeddings": ("ollama", {"model": "default", "prompt": "Hi"}, ["model", "prompt", "options"]),
}
STREAMED = {
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/api/chat",
    "/api/generate",
}


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    """A route and a body for it: its good body with fields replaced, added and taken away; sometimes a
    value nested deep, or the body itself something other than an object."""
    path = draw(st.sampled_from(sorted(ROUTES)))
    _, good, fields = ROUTES[path]
    body: dict[str, Any] = dict(good)
    for name in draw(
        st.lists(st.sampled_from(fields) | TEXT, max_size=draw(st.sampled_from([0, 1, 1, 2, 4])))
    ):
        body[name] = draw(VALUES | st.lists(MESSAGE, max_size=3) if name == "messages" else VALUES)
    for name in draw(st.lists(st.sampled_from(sorted(body)), max_size=1)):
        body.pop(name, None)
    if draw(st.booleans()) and "messages" in body and isinstance(body["messages"], list) and body["messages"]:
        body["messages"][0] = draw(MESSAGE)
    if path in STREAMED and draw(st.booleans()):
        body["stream"] = True
    raw = json.dumps(
        body
    ).encode()  # lone surrogates become \ud800 escapes; NaN and Infinity as Python writes them
    shape = draw(st.sampled_from(["body", "body", "body", "deep", "not an object"]))
    if shape == "deep":
        depth = draw(st.sampled_from([50, 500, 900, 990, 1000, 5000, 20000]))
        field = draw(st.sampled_from(fields))
        raw = raw[:-1] + f', "{field}": '.encode() + b"[" * depth + b"]" * depth + b"}"
    elif shape == "not an object":
        raw = draw(st.sampled_from([b"[]", b"null", b'"x"', b"1e999", b"", b"{", b'{"a": "\\ud800"}']))
    return path, raw


def assert_refusal_in_shape(dialect: str, response: Any) -> None:
    body = response.json()
    if dialect == "ollama":
        assert isinstance(body.get("error"), str) and body["error"], body
    elif dialect == "anthropic":
        assert body.get("type") == "error", body
        assert isinstance(body["error"].get("type"), str) and isinstance(body["error"].get("message"), str), (
            body
        )
    else:
        error = body.get("error")
        assert isinstance(error, dict) and isinstance(error.get("message"), str) and error.get("type"), body


@settings(
    max_examples=1000,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(case=bodies())
def test_no_body_gets_a_500_and_every_refusal_is_in_the_dialects_shape(
    answering_client: TestClient,  # noqa: F811  (the fixture)
    case: tuple[str, bytes],
) -> None:
    path, raw = case
    dialect = ROUTES[path][0]
    response = answering_client.post(path, content=raw, headers={"Content-Type": "application/json"})
    event(f"{path} {response.status_code}")
    assert response.status_code != 500, (path, raw[:300], response.text[:500])
    if response.status_code >= 400:
        assert_refusal_in_shape(dialect, response)
