"""What reaches the native parsers is bounded before it gets there, in every dialect (fast tier): the GBNF
scanner and each bound on their own, then every route of the ASGI app over the stand-in service (nothing
counts or renders a refused request: the stand-in has no tokenizer to reach). Also the 500s of bad tools and
of bodies that are not UTF-8, now 400s."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.security.answering import answering_client, answering_service, tokens  # noqa: F401
from tray_app.server import input_bounds
from tray_app.server.errors import ApiError
from tray_app.server.input_bounds import (
    MAX_GRAMMAR_BYTES,
    MAX_GRAMMAR_NESTING,
    MAX_MESSAGES,
    MAX_SCHEMA_DEPTH,
    MAX_TOOLS,
    MAX_TOOLS_BYTES,
    check_grammar,
    check_messages,
    check_response_format,
    check_schema,
    check_tools,
    grammar_nesting,
    json_depth,
)
from tray_app.server.ollama.errors import OllamaError
from tray_app.server.ollama.request import chat_request
from tray_app.server.requests import load_json

ASK = [{"role": "user", "content": "Hello"}]
CHAT: dict[str, Any] = {"messages": ASK, "max_tokens": 4}
JSON = {"Content-Type": "application/json"}


def nested_grammar(depth: int) -> str:
    return "root ::= " + "(" * depth + '"a"' + ")" * depth


def nested_schema(depth: int) -> dict[str, Any]:
    """A schema `depth` JSON levels deep: arrays of arrays of strings."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth - 1):
        schema = {"type": "array", "items": schema}
    return schema


def tool(name: str = "add", parameters: Any = None) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters or {"type": "object"}}}


def refusal(call: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call()
    assert caught.value.status == 400
    return caught.value


# ------------------------------------------------------------------------------------------- the scanner
@pytest.mark.parametrize(
    ("grammar", "depth"),
    [
        ('root ::= "a"', 0),
        ('root ::= ("a")', 1),
        ('root ::= (("a") | ("b" ("c")))', 3),
        ('root ::= ("a"){2,3} ("b")*', 1),  # repetition braces are no groups
        ('root ::= "((((("', 0),  # parentheses in a string literal
        ('root ::= "\\"(((" ("a")', 1),  # an escaped quote does not end the string
        ('root ::= "\\\\" (("a"))', 2),  # an escaped backslash does not escape the closing quote
        ('root ::= [(((] ("a")', 1),  # in a character class
        ('root ::= [\\]((] ("a")', 1),  # an escaped ] does not end the class
        ('root ::= [^"] ("a")', 1),  # a quote in a class opens no string
        ('root ::= ["] "((("', 0),
        ('# ((((\nroot ::= ("a")', 1),  # a comment, to the end of its line
        ('root ::= ("a") # ((((((', 1),
        ('root ::= ("a" # (((\n )', 1),
        ('root ::= <[12]> !<think(> ("a")', 1),  # tokens
        ('root ::= "(((', 0),  # an unterminated string runs to the end
        ('root ::= ) (((("a"))))', 0),  # llama.cpp's parse ends at an unmatched ')'
        ('root ::= (\n  "a" |\n  ("b")\n)', 2),  # a group spans lines
        (nested_grammar(20_000), 20_000),
    ],
)
def test_the_scanner_counts_groups_as_llama_cpp_parses_them(grammar: str, depth: int) -> None:
    assert grammar_nesting(grammar) == depth


def test_a_grammar_at_the_bounds_is_taken() -> None:
    check_grammar(nested_grammar(MAX_GRAMMAR_NESTING))
    padding = "# " + "x" * (MAX_GRAMMAR_BYTES - len(nested_grammar(3)) - 3) + "\n"
    check_grammar(padding + nested_grammar(3))
    assert len((padding + nested_grammar(3)).encode()) == MAX_GRAMMAR_BYTES
    check_grammar(None)  # not a string: the field's own check says so
    check_grammar(["root ::= " + "(" * 1000])


def test_a_grammar_nested_past_the_bound_is_refused_naming_it() -> None:
    error = refusal(lambda: check_grammar(nested_grammar(20_000)))
    assert error.message == f"'grammar' nests 20000 groups deep; at most {MAX_GRAMMAR_NESTING} are accepted"
    assert (error.param, error.code, error.extra) == ("grammar", "nested_too_deep", {"limit": 256})
    refusal(lambda: check_grammar(nested_grammar(MAX_GRAMMAR_NESTING + 1)))


def test_a_grammar_longer_than_the_bound_is_refused_naming_it() -> None:
    long = 'root ::= "' + "é" * (MAX_GRAMMAR_BYTES // 2) + '"'  # fewer characters than bytes
    error = refusal(lambda: check_grammar(long))
    assert error.code == "string_above_max_length" and error.param == "grammar"
    assert f"at most {MAX_GRAMMAR_BYTES} bytes (64 KiB)" in error.message


# ------------------------------------------------------------------------------- schemas, tools, messages
@pytest.mark.parametrize(
    ("value", "depth"),
    [("x", 0), (3, 0), (None, 0), ({}, 1), ([], 1), ({"a": 1}, 1), ({"a": {"b": []}}, 3), ([[[]], {}], 3)],
)
def test_json_depth(value: Any, depth: int) -> None:
    assert json_depth(value) == depth


def test_a_schema_past_the_bound_is_refused_naming_where() -> None:
    check_schema(nested_schema(MAX_SCHEMA_DEPTH), "format")
    error = refusal(lambda: check_schema(nested_schema(MAX_SCHEMA_DEPTH + 1), "format"))
    assert error.param == "format" and error.code == "nested_too_deep"
    assert f"nests {MAX_SCHEMA_DEPTH + 1} levels deep; at most {MAX_SCHEMA_DEPTH}" in error.message
    deep = nested_schema(MAX_SCHEMA_DEPTH + 1)
    wrapped = {"type": "json_schema", "json_schema": {"name": "x", "schema": deep}}
    assert refusal(lambda: check_response_format(wrapped)).param == "response_format.json_schema.schema"
    extension = {"type": "json_object", "schema": deep}  # llama-server reads this one too
    assert refusal(lambda: check_response_format(extension)).param == "response_format.schema"


def test_tools_are_bounded_in_number_size_and_schema_depth() -> None:
    where = ("function", "parameters")
    check_tools([tool(f"t{index}") for index in range(MAX_TOOLS)], where)
    error = refusal(lambda: check_tools([tool(f"t{index}") for index in range(MAX_TOOLS + 1)], where))
    assert error.code == "array_above_max_length"
    assert error.message == f"'tools' holds {MAX_TOOLS + 1} tools; at most {MAX_TOOLS} are accepted"
    large = [tool(parameters={"type": "object", "description": "x" * MAX_TOOLS_BYTES})]
    error = refusal(lambda: check_tools(large, where))
    assert error.code == "tools_too_large" and "256 KiB" in error.message
    deep = [tool(), tool(parameters=nested_schema(MAX_SCHEMA_DEPTH + 1))]
    assert refusal(lambda: check_tools(deep, where)).param == "tools[1].function.parameters"
    check_tools("not an array", where)  # the field's own check says so


def test_messages_are_bounded_in_number() -> None:
    check_messages([{}] * MAX_MESSAGES)
    error = refusal(lambda: check_messages([{}] * MAX_MESSAGES, extra=1, noun="messages and system blocks"))
    assert (
        error.message
        == f"'messages' holds 4097 messages and system blocks; at most {MAX_MESSAGES} are accepted"
    )
    assert error.code == "array_above_max_length" and error.extra == {"limit": MAX_MESSAGES}


def test_the_bounds_are_the_documented_ones() -> None:
    assert (
        input_bounds.MAX_GRAMMAR_BYTES,
        input_bounds.MAX_GRAMMAR_NESTING,
        input_bounds.MAX_SCHEMA_DEPTH,
        input_bounds.MAX_TOOLS,
        input_bounds.MAX_TOOLS_BYTES,
        input_bounds.MAX_MESSAGES,
    ) == (64 * 1024, 256, 64, 128, 256 * 1024, 4096)


# ------------------------------------------------------------------------------------------- every route
def post(client: TestClient, path: str, body: Any) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(path, content=raw, headers=JSON)


def message_of(response: Any) -> str:
    """The error message in any of the three shapes (OpenAI's, Anthropic's, Ollama's)."""
    error = response.json()["error"]
    return error if isinstance(error, str) else error["message"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {**CHAT, "grammar": nested_grammar(20_000)}),
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "grammar": nested_grammar(20_000)}),
        ("/v1/jobs", {**CHAT, "grammar": nested_grammar(20_000)}),
    ],
)
def test_a_deeply_nested_grammar_is_a_400_on_every_route_that_takes_one(
    client: TestClient, path: str, body: dict[str, Any]
) -> None:
    response = post(client, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "grammar" and error["code"] == "nested_too_deep" and error["limit"] == 256
    assert "20000 groups deep; at most 256" in error["message"]


EMPTY = {"role": "user", "content": ""}
MANY = 100_000


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        (
            "/v1/chat/completions",
            {"messages": [EMPTY] * MANY, "max_tokens": 4},
            "'messages' holds 100000 messages",
        ),
        ("/v1/jobs", {"messages": [EMPTY] * MANY, "max_tokens": 4}, "'messages' holds 100000 messages"),
        (
            "/v1/messages",
            {"messages": [EMPTY] * MANY, "max_tokens": 4, "system": [{"type": "text", "text": "s"}] * 2},
            "'messages' holds 100002 messages and system blocks",
        ),
        ("/v1/messages/count_tokens", {"messages": [EMPTY] * MANY}, "'messages' holds 100000 messages"),
        ("/v1/responses", {"input": [EMPTY] * MANY}, "'input' holds 100000 items"),
        ("/v1/responses/input_tokens", {"input": [EMPTY] * MANY}, "'input' holds 100000 items"),
    ],
)
def test_many_empty_messages_are_a_400_on_every_route(
    client: TestClient, path: str, body: dict[str, Any], said: str
) -> None:
    response = post(client, path, body)
    assert response.status_code == 400, response.text
    assert message_of(response) == f"{said}; at most {MAX_MESSAGES} are accepted"


def test_anthropic_tool_results_count_as_the_messages_they_become(client: TestClient) -> None:
    results = [
        {"type": "tool_result", "tool_use_id": f"t{n}", "content": ""} for n in range(MAX_MESSAGES + 1)
    ]
    response = post(
        client, "/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": results}]}
    )
    assert response.status_code == 400, response.text
    assert "each tool result counts as one" in message_of(response)


TOO_MANY_TOOLS = [tool(f"t{n}") for n in range(MAX_TOOLS + 1)]
DEEP = nested_schema(MAX_SCHEMA_DEPTH + 1)


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        ("/v1/chat/completions", {**CHAT, "tools": TOO_MANY_TOOLS}, "'tools' holds 129 tools"),
        (
            "/v1/messages",
            {"max_tokens": 4, "messages": ASK, "tools": [{"name": f"t{n}"} for n in range(MAX_TOOLS + 1)]},
            "'tools' holds 129",
        ),
        (
            "/v1/responses",
            {"input": "Hi", "tools": [{"type": "function", "name": f"t{n}"} for n in range(MAX_TOOLS + 1)]},
            "'tools' holds 129",
        ),
        (
            "/v1/chat/completions",
            {**CHAT, "tools": [tool(parameters=DEEP)]},
            "'tools[0].function.parameters' nests 65 levels",
        ),
        (
            "/v1/messages",
            {"max_tokens": 4, "messages": ASK, "tools": [{"name": "a", "input_schema": DEEP}]},
            "'tools[0].input_schema' nests 65",
        ),
        (
            "/v1/responses",
            {"input": "Hi", "tools": [{"type": "function", "name": "a", "parameters": DEEP}]},
            "'tools[0].parameters' nests 65",
        ),
        (
            "/v1/chat/completions",
            {
                **CHAT,
                "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": DEEP}},
            },
            "'response_format.json_schema.schema' nests 65",
        ),
        (
            "/v1/messages",
            {
                "max_tokens": 4,
                "messages": ASK,
                "output_config": {"format": {"type": "json_schema", "schema": DEEP}},
            },
            "'output_config.format.schema' nests 65",
        ),
        (
            "/v1/responses",
            {"input": "Hi", "text": {"format": {"type": "json_schema", "name": "a", "schema": DEEP}}},
            "'text.format.schema' nests 65",
        ),
    ],
)
def test_tools_and_schemas_past_their_bounds_are_a_400_in_every_dialect(
    client: TestClient, path: str, body: dict[str, Any], said: str
) -> None:
    response = post(client, path, body)
    assert response.status_code == 400, response.text
    assert said in message_of(response)


# ------------------------------------------------------------------------------------------- F6: 500s
@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        (
            "/v1/chat/completions",
            {
                **CHAT,
                "tools": [{"function": "x"}],
                "tool_choice": {"type": "function", "function": {"name": "x"}},
            },
            "'tools[0].function' must be an object with a string 'name'",
        ),
        (
            "/v1/chat/completions",
            {**CHAT, "tools": [tool()], "tool_choice": {"type": "function", "function": {"name": ["add"]}}},
            "'tool_choice.function.name' must be a string",
        ),
        (
            "/v1/messages",
            {
                "max_tokens": 4,
                "messages": ASK,
                "tools": [{"name": ["f"]}],
                "tool_choice": {"type": "tool", "name": "f"},
            },
            "'tools[0].name' must be a string",
        ),
        (
            "/v1/messages",
            {
                "max_tokens": 4,
                "messages": ASK,
                "tools": [{"name": "f"}],
                "tool_choice": {"type": "tool", "name": ["f"]},
            },
            "'tool_choice.name' must be a string",
        ),
        (
            "/v1/responses",
            {
                "input": "Hi",
                "tools": [{"type": "function", "name": ["f"]}],
                "tool_choice": {"type": "function", "name": "f"},
            },
            "'tools[0].function' must be an object with a string 'name'",
        ),
    ],
)
def test_malformed_tools_with_a_named_choice_are_a_400(
    client: TestClient, path: str, body: dict[str, Any], said: str
) -> None:
    response = post(client, path, body)
    assert response.status_code == 400, response.text
    assert said in message_of(response)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/api/embed"])
def test_a_body_not_in_utf8_is_a_400(client: TestClient, path: str, encoding: str) -> None:
    text = '{"model": "default", "max_tokens": 4, "messages": [{"role": "user", "content": "\\ud800"}]}'
    response = post(client, path, text.encode(encoding))
    assert response.status_code == 400, response.text
    assert "must be UTF-8" in message_of(response)


def test_utf8_encoded_surrogates_are_a_400(client: TestClient) -> None:
    raw = b'{"max_tokens": 4, "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}'
    response = post(client, "/v1/chat/completions", raw)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_json"


def test_a_utf8_body_reads_as_before() -> None:
    assert load_json('{"a": "é \\ud83d\\ude00"}'.encode()) == {"a": "é \U0001f600"}
    assert load_json(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}  # a UTF-8 byte order mark, as json.loads took it
    with pytest.raises(ValueError, match="UTF-16-LE, and a JSON body must be UTF-8"):
        load_json('{"a": 1}'.encode("utf-16-le"))


# ------------------------------------------------------------------------------------------- Ollama
# Its routes read the model file's template before they translate: the answering service has a real one (and
# a 64 KiB body limit, so the message count is checked on the translation itself).
def test_ollamas_messages_are_bounded_before_they_are_translated() -> None:
    chat_request({"model": "default", "messages": [EMPTY] * MAX_MESSAGES}, "m")
    with pytest.raises(OllamaError) as caught:
        chat_request({"model": "default", "messages": [EMPTY] * MANY}, "m")
    assert (caught.value.status, caught.value.message) == (
        400,
        f"'messages' holds 100000 messages; at most {MAX_MESSAGES} are accepted",
    )


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        ("/api/chat", {"model": "default", "messages": ASK, "tools": TOO_MANY_TOOLS}, "'tools' holds 129"),
        ("/api/chat", {"model": "default", "messages": ASK, "tools": [tool(parameters=DEEP)]}, "nests 65"),
        ("/api/chat", {"model": "default", "messages": ASK, "format": DEEP}, "'format' nests 65"),
        ("/api/generate", {"model": "default", "prompt": "Hi", "format": DEEP}, "'format' nests 65"),
    ],
)
def test_ollamas_tools_and_format_past_their_bounds_are_a_400_in_its_shape(
    answering_client: TestClient,  # noqa: F811  (the fixture)
    path: str,
    body: dict[str, Any],
    said: str,
) -> None:
    response = post(answering_client, path, body)
    assert response.status_code == 400, response.text
    assert said in response.json()["error"]
