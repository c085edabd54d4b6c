"""Cutting llama-server's repeat of a continued answer (jobs.continuation)."""

from __future__ import annotations

from tray_app.jobs.assemble import Assembler
from tray_app.jobs.continuation import EchoedPrefix, continuation_messages


def test_the_repeat_is_cut_across_chunks_and_new_text_passes() -> None:
    echoed = EchoedPrefix("Two and two", "")
    assert echoed.cut({"reasoning_content": "Two"}) == {}
    assert echoed.cut({"reasoning_content": " and two make"}) == {"reasoning_content": " make"}
    assert echoed.cut({"reasoning_content": " and two"}) == {"reasoning_content": " and two"}  # over: new


def test_reasoning_and_answer_are_cut_each_on_its_own() -> None:
    echoed = EchoedPrefix("Sum.", "It is")
    delta = echoed.cut({"reasoning_content": "Sum.\n", "content": "It is 4"})
    assert delta == {"reasoning_content": "\n", "content": " 4"}


def test_a_repeat_that_differs_stops_the_cutting_at_the_difference() -> None:
    """llama-server may re-part whitespace at the reasoning's end: nothing new is ever dropped."""
    echoed = EchoedPrefix("Sum. \n", "")
    assert echoed.cut({"reasoning_content": "Sum.\nSo"}) == {"reasoning_content": "\nSo"}
    assert echoed.cut({"reasoning_content": " four"}) == {"reasoning_content": " four"}


def test_the_answer_beginning_ends_the_reasoning_repeat() -> None:
    echoed = EchoedPrefix("Long thought", "")
    assert echoed.cut({"reasoning_content": "Long"}) == {}
    assert echoed.cut({"content": "4"}) == {"content": "4"}
    assert echoed.cut({"reasoning_content": " thought"}) == {"reasoning_content": " thought"}


def test_other_fields_pass_untouched() -> None:
    echoed = EchoedPrefix("x", "")
    assert echoed.cut({"tool_calls": [{"index": 0}]}) == {"tool_calls": [{"index": 0}]}


def test_the_continued_message_is_the_last_one() -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert continuation_messages(messages, "think", "an") == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "an", "reasoning_content": "think"},
    ]


def test_reasoning_is_assembled_beside_the_answer() -> None:
    assembler = Assembler("chat")
    for delta in (
        {"role": "assistant"},
        {"reasoning_content": "Hm"},
        {"reasoning_content": "."},
        {"content": "4"},
    ):
        assembler.feed({"id": "c", "choices": [{"index": 0, "delta": delta}]})
    message = assembler.result(3, {})["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "4", "reasoning_content": "Hm."}
    plain = Assembler("chat")
    plain.feed({"id": "c", "choices": [{"index": 0, "delta": {"content": "4"}}]})
    assert "reasoning_content" not in plain.result(3, {})["choices"][0]["message"]
