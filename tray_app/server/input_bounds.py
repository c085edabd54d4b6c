"""Bounds on what a request may hand the native parsers, checked in Python before any of them sees it.

llama.cpp's GBNF parser recurses once per group, and a grammar about 20,000 groups deep overflows the stack
of the process that parses it (the router checks every grammar itself, so it was the router that died);
llama-server's JSON-schema converter recurses per level of a schema; every tool and message is rendered
into the prompt and tokenized, and many tiny messages cost far more than their characters. Each dialect
applies these bounds in its own terms (its own field names) before it translates, and the OpenAI parse that
every dialect's request ends in applies them again, before any token is counted or template rendered.
Over a bound: 400, naming the bound.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from tray_app.server.errors import ApiError

# The bounds: each far past what a real client sends, far short of what hurts the service.
# Grammars are a few KiB; this also keeps rule-reference chains (100,000 crash llama.cpp) under about 6,500.
MAX_GRAMMAR_BYTES = 64 * 1024
# Real grammars nest under ten deep; llama.cpp's parser overflows an 8 MiB stack near 20,000 (1/80 of it).
MAX_GRAMMAR_NESTING = 256
# JSON levels within one schema: OpenAI's structured outputs allow 10 levels of nesting (about 30 here).
MAX_SCHEMA_DEPTH = 64
# OpenAI's own limit on the tools of one request.
MAX_TOOLS = 128
# All tools' definitions as JSON (rendered into every prompt): 256 KiB is about 64k tokens of definitions.
MAX_TOOLS_BYTES = 256 * 1024
# 2,048 tool round trips: a session that long compacts first; 100,000 held the event loop for minutes.
MAX_MESSAGES = 4096

NESTED_TOO_DEEP = "nested_too_deep"
ARRAY_TOO_LONG = "array_above_max_length"  # OpenAI's code for an array over its limit
STRING_TOO_LONG = "string_above_max_length"  # OpenAI's code for a string over its limit
TOOLS_TOO_LARGE = "tools_too_large"

# What llama.cpp's parser (llama-grammar.cpp) reads as one piece whose parentheses are not groups: a string
# literal and a character class (both with backslash escapes; unterminated, they run to the end), a comment
# (`#` to the end of the line) and a token (`<...>`, `<[id]>`); besides those, the parentheses themselves.
_GBNF_PIECE = re.compile(
    r'"[^"\\]*(?:\\.[^"\\]*)*"?|\[[^\]\\]*(?:\\.[^\]\\]*)*\]?|#[^\r\n]*|<[^>]*>?|[()]', re.DOTALL
)


def _kib(size: int) -> str:
    return f"{size} bytes ({size // 1024} KiB)"


def over_bound(message: str, param: str, code: str, limit: int) -> ApiError:
    return ApiError(400, message, param=param, code=code, extra={"limit": limit})


# ------------------------------------------------------------------------------------------- grammar
def grammar_nesting(grammar: str) -> int:
    """How deep the groups of a GBNF grammar nest (the depth of llama.cpp parser's recursion): parentheses
    outside string literals, character classes, comments and tokens. An unmatched `)` ends the count, as
    it ends llama.cpp's parse."""
    depth = deepest = 0
    for piece in _GBNF_PIECE.finditer(grammar):
        kind = piece.group()
        if kind == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif kind == ")":
            if depth == 0:
                break
            depth -= 1
    return deepest


def check_grammar(grammar: Any, param: str = "grammar") -> None:
    """ApiError (400) when a grammar is longer or nests deeper than the bounds; a non-string is left to the
    field's own check."""
    if not isinstance(grammar, str):
        return
    size = len(grammar.encode("utf-8", "surrogatepass"))
    if size > MAX_GRAMMAR_BYTES:
        raise over_bound(
            f"'{param}' is {size} bytes long; at most {_kib(MAX_GRAMMAR_BYTES)} are accepted",
            param,
            STRING_TOO_LONG,
            MAX_GRAMMAR_BYTES,
        )
    depth = grammar_nesting(grammar)
    if depth > MAX_GRAMMAR_NESTING:
        raise over_bound(
            f"'{param}' nests {depth} groups deep; at most {MAX_GRAMMAR_NESTING} are accepted",
            param,
            NESTED_TOO_DEEP,
            MAX_GRAMMAR_NESTING,
        )


# ------------------------------------------------------------------------------------------- schemas
def json_depth(value: Any) -> int:
    """How many objects and arrays deep a JSON value nests (a scalar: 0, `{}`: 1, `{"a": []}`: 2)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def check_schema(schema: Any, param: str) -> None:
    """ApiError (400) when a JSON schema (which llama-server turns into a grammar) nests deeper than the
    bound."""
    depth = json_depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise over_bound(
            f"the JSON schema '{param}' nests {depth} levels deep; at most {MAX_SCHEMA_DEPTH} are accepted",
            param,
            NESTED_TOO_DEEP,
            MAX_SCHEMA_DEPTH,
        )


def check_response_format(response_format: Any, param: str = "response_format") -> None:
    """The schemas llama-server reads from an OpenAI `response_format`: `json_schema.schema`, and `schema`
    (its json_object extension)."""
    if not isinstance(response_format, dict):
        return
    if "schema" in response_format:
        check_schema(response_format["schema"], f"{param}.schema")
    wrapper = response_format.get("json_schema")
    if isinstance(wrapper, dict) and "schema" in wrapper:
        check_schema(wrapper["schema"], f"{param}.json_schema.schema")


# ------------------------------------------------------------------------------------------- tools
def check_tools(tools: Any, schema_at: Sequence[str], param: str = "tools") -> None:
    """ApiError (400) when a request's tools are too many, too large in all, or one's schema (at the path
    `schema_at` within each tool: ("function", "parameters") in OpenAI's shape) nests too deep. Anything
    but an array is left to the field's own check."""
    if not isinstance(tools, list):
        return
    check_count(len(tools), param, "tools", MAX_TOOLS)
    size = len(json.dumps(tools, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))
    if size > MAX_TOOLS_BYTES:
        raise over_bound(
            f"'{param}' is {size} bytes as JSON; at most {_kib(MAX_TOOLS_BYTES)} are accepted",
            param,
            TOOLS_TOO_LARGE,
            MAX_TOOLS_BYTES,
        )
    for index, tool in enumerate(tools):
        schema = tool
        for key in schema_at:
            schema = schema.get(key) if isinstance(schema, dict) else None
        if schema is not None:
            check_schema(schema, f"{param}[{index}].{'.'.join(schema_at)}")


# ------------------------------------------------------------------------------------------- messages
def check_count(count: int, param: str, noun: str = "messages", limit: int = MAX_MESSAGES) -> None:
    """ApiError (400) when `param` holds more than `limit` items (`noun` says what they are)."""
    if count > limit:
        raise over_bound(
            f"'{param}' holds {count} {noun}; at most {limit} are accepted", param, ARRAY_TOO_LONG, limit
        )


def check_messages(messages: Any, param: str = "messages", extra: int = 0, noun: str = "messages") -> None:
    """The message count bound on an array of messages (or input items), with `extra` more beside it (an
    Anthropic request's system blocks). Anything but an array is left to the field's own check."""
    if isinstance(messages, list):
        check_count(len(messages) + extra, param, noun)


# ------------------------------------------------------------------------------------------- OpenAI
def check_openai(body: dict[str, Any], chat: bool) -> None:
    """Every bound on an OpenAI request body (a chat's or a completion's): what every dialect's request
    becomes, checked before anything counts or renders it."""
    check_grammar(body.get("grammar"))
    if not chat:
        return  # a completion's worker gets no messages, tools or response format (engine.request_fields)
    check_messages(body.get("messages"))
    check_tools(body.get("tools"), ("function", "parameters"))
    check_response_format(body.get("response_format"))
