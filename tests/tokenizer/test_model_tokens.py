"""The service's side of the tokenizer helper against a real helper process on the bundled model: its
counts are the native counter's, a request seen before asks the helper nothing, and a helper that dies is
started again at the cost of the requests it was reading."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.waits import wait_until_async
from tray_app.tokenizer.counter import TokenCounter
from tray_app.tokenizer.model_tokens import ModelTokens
from tray_app.tokenizer.process import TokenizerProcess
from tray_app.tokenizer.wire import TokenizerFailed

TOOL_F: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
    },
}
BODIES: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Hello there"}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]},
    {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Parts "}, {"type": "text", "text": "too"}]}
        ]
    },
    {"messages": [{"role": "user", "content": "Add 2 and 3"}], "tools": [TOOL_F]},
    {
        "messages": [{"role": "user", "content": "Add 2 and 3"}],
        "tools": [TOOL_F],
        "tool_choice": {"type": "function", "function": {"name": TOOL_F["function"]["name"]}},
    },
    {
        "messages": [
            {"role": "user", "content": "Add 2 and 3"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "5"},
        ]
    },
]


@pytest.fixture
async def helper(model_path: Path, tmp_path: Path) -> AsyncIterator[TokenizerProcess]:
    process = TokenizerProcess(tmp_path / "tokenizer.log", preload=[(model_path, "")], faults=True)
    process.start()
    yield process
    await process.aclose()


async def test_counts_are_the_native_counters_and_a_request_seen_before_asks_nothing(
    helper: TokenizerProcess, model_path: Path
) -> None:
    native = TokenCounter(model_path)
    tokens = ModelTokens(helper, model_path)
    asked: list[str] = []
    request = helper.request

    async def counted(model: tuple[str, str], op: str, args: dict[str, Any], **kw: Any) -> Any:
        asked.append(op)
        return await request(model, op, args, **kw)

    helper.request = counted  # type: ignore[method-assign]
    for body in BODIES:
        assert await tokens.count("chat", body) == native.count_chat(body), body
    first = len(asked)
    for body in BODIES:
        assert await tokens.count("chat", body) == native.count_chat(body), body
    assert first == len(BODIES) and len(asked) == first  # each body once; seen again: no request
    # A conversation's next turn asks for its newest message only.
    turn = {
        "messages": [
            *BODIES[1]["messages"],
            {"role": "assistant", "content": "Hi."},
            {"role": "user", "content": "More?"},
        ]
    }
    assert await tokens.count("chat", turn) == native.count_chat(turn)
    assert await tokens.count("completion", {"prompt": "Once upon"}) == native.count_completion(
        {"prompt": "Once upon"}
    )
    assert await tokens.tokenize("Once upon") == native.tokenize("Once upon")
    assert await tokens.chat_prompt(BODIES[0]["messages"]) == native.chat_prompt(BODIES[0]["messages"])


async def test_a_grammar_the_parser_refuses_is_named(helper: TokenizerProcess, model_path: Path) -> None:
    tokens = ModelTokens(helper, model_path)
    assert await tokens.grammar_error('root ::= "yes" | "no"') is None
    problem = await tokens.grammar_error("root ::= (")
    assert problem  # llama.cpp's own words


async def test_a_helper_that_dies_on_a_request_twice_fails_it_and_the_next_is_served(
    helper: TokenizerProcess, model_path: Path
) -> None:
    tokens = ModelTokens(helper, model_path)
    first = helper.pid
    with pytest.raises(TokenizerFailed) as failed:
        await helper.request((str(model_path), ""), "crash", {})  # dies with SIGSEGV, and so does its retry
    assert failed.value.kind == "crashed" and "SIGSEGV" in str(failed.value)
    assert await tokens.count("completion", {"prompt": "Still here"}) > 0
    assert helper.pid not in (None, first) and helper.restarts == 2
    assert helper.last_exit is not None and helper.last_exit["signal"] == signal.SIGSEGV


async def test_a_helper_killed_while_idle_is_started_again_before_the_next_request(
    helper: TokenizerProcess, model_path: Path
) -> None:
    tokens = ModelTokens(helper, model_path)
    assert await tokens.count("completion", {"prompt": "One"}) > 0
    first = helper.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    await wait_until_async(lambda: helper.pid not in (None, first), 10, "a helper started by itself")
    second = helper.pid
    assert helper.restarts == 1 and helper.last_exit is not None
    assert await tokens.count("completion", {"prompt": "Two"}) > 0
    assert helper.pid == second and helper.restarts == 1  # the request used it: no second start
