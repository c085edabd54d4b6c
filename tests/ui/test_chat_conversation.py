"""The chat window's conversation: how much of a request's context it takes (and when the next answer no
longer fits the GPU's), and New chat, which starts over."""

from __future__ import annotations

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from tests.ui.chat_helpers import ask, open_chat, stream_answer
from tests.ui.local_server import LocalService
from tray_app.ui.answer_view import AnswerView
from tray_app.ui.chat import ChatWindow
from tray_app.view.answer import Badge

FAILSOFT = {"worker": "gpu", "attempts": 1, "fallback_reason": None, "model": "m", "device": "gpu"}


def _answering(local_service: LocalService, prompt_tokens: int, completion_tokens: int) -> None:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    stream_answer(
        local_service,
        [
            {"choices": [{"index": 0, "delta": {"content": "Blue."}}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {"choices": [], "usage": usage, "failsoft": FAILSOFT},
        ],
    )


def _chat(qtbot: QtBot, local_service: LocalService, gpu_context: int) -> ChatWindow:
    chat = open_chat(qtbot, local_service)
    chat.set_gpu_context(gpu_context)
    return chat


def test_the_chat_says_how_much_context_it_takes_and_when_the_gpu_can_no_longer_answer(
    qtbot: QtBot, local_service: LocalService
) -> None:
    chat = _chat(qtbot, local_service, gpu_context=2048)
    assert not chat.context_line.isVisible()  # nothing asked yet
    _answering(local_service, prompt_tokens=1200, completion_tokens=300)
    ask(qtbot, chat, "What colour is the sky?")
    sent = local_service.calls("POST", "/v1/chat/completions")[-1].body
    assert sent["stream_options"] == {"include_usage": True}
    assert chat.context_line.isVisible()
    assert chat.context_line.text() == "This chat so far: 1,500 tokens of the GPU's 2,048 per request"

    chat.max_tokens.setValue(600)  # 1,500 + 600 > 2,048: the next answer cannot run on the GPU
    warning = chat.context_line.text()
    assert warning.startswith("This chat so far: 1,500 tokens, and with an answer of up to 600 more")
    assert "exceeds the GPU's 2,048 tokens per request" in warning and "New chat" in warning


def test_new_chat_empties_the_transcript_and_the_conversation(
    qtbot: QtBot, local_service: LocalService
) -> None:
    chat = _chat(qtbot, local_service, gpu_context=2048)
    _answering(local_service, prompt_tokens=40, completion_tokens=5)
    ask(qtbot, chat, "What colour is the sky?")
    assert len(chat.history) == 2 and len(chat.answers) == 1

    chat.new_chat()
    assert chat.history == [] and chat.answers == []
    assert chat.transcript_layout.count() == 1  # only the stretch under the bubbles
    assert not chat.context_line.isVisible()

    ask(qtbot, chat, "And the sea?")  # the next question goes alone
    sent = local_service.calls("POST", "/v1/chat/completions")[-1].body
    assert sent["messages"] == [{"role": "user", "content": "And the sea?"}]


def test_new_chat_waits_while_an_answer_streams(qtbot: QtBot, local_service: LocalService) -> None:
    chat = _chat(qtbot, local_service, gpu_context=2048)
    _answering(local_service, prompt_tokens=40, completion_tokens=5)
    chat.input.setPlainText("What colour is the sky?")
    with qtbot.waitSignal(chat.answer_finished, timeout=10_000):
        chat.send()
        assert not chat.new_button.isEnabled()
        chat.new_chat()  # ignored: the answer in progress keeps its place
        assert len(chat.history) == 1
    assert chat.new_button.isEnabled() and len(chat.history) == 2


def test_a_thinking_models_reasoning_is_shown_then_folded_and_never_sent_back(
    qtbot: QtBot, local_service: LocalService
) -> None:
    chat = _chat(qtbot, local_service, gpu_context=2048)
    stream_answer(
        local_service,
        [
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
            {"choices": [{"index": 0, "delta": {"reasoning_content": "The sky scatters"}}]},
            {"choices": [{"index": 0, "delta": {"reasoning_content": " blue light."}}]},
            {"choices": [{"index": 0, "delta": {"content": "Blue."}}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {"choices": [], "failsoft": FAILSOFT},
        ],
    )
    ask(qtbot, chat, "What colour is the sky?")
    answer = chat.answers[-1]
    assert answer.thought.text() == "The sky scatters blue light." and answer.text.text() == "Blue."
    assert not answer.thought.isVisible() and answer.thought_toggle.isVisible()
    assert answer.thought_toggle.text() == "Reasoning (5 words): show"
    qtbot.mouseClick(answer.thought_toggle, Qt.MouseButton.LeftButton)
    assert answer.thought.isVisible() and answer.thought_toggle.text() == "Hide the reasoning"
    assert chat.history[-1] == {"role": "assistant", "content": "Blue."}  # the reasoning stays here

    _answering(local_service, prompt_tokens=40, completion_tokens=5)
    ask(qtbot, chat, "And the sea?")
    plain = chat.answers[-1]
    assert not plain.thought_toggle.isVisible() and not plain.thought.isVisible()


def test_the_reasoning_shows_while_the_model_thinks(qtbot: QtBot) -> None:
    view = AnswerView()
    qtbot.addWidget(view)
    view.show()
    view.append_thinking("Let me see")
    assert view.thought.isVisible() and view.thought_toggle.text() == "Thinking…"
    view.append(" Four.")
    assert not view.thought.isVisible() and view.thought_toggle.text() == "Reasoning (3 words): show"


def test_an_answer_that_only_thought_does_not_say_thinking_once_over(qtbot: QtBot) -> None:
    view = AnswerView()
    qtbot.addWidget(view)
    view.show()
    view.append_thinking("Hmm, let me")
    view.set_badge(Badge("gpu", "GPU"))
    assert view.thought.isVisible() and view.thought_toggle.text() == "Hide the reasoning"
