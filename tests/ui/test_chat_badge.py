"""The badges under an answer in the chat window: both shown, wrapped inside the answer when long; the
answer's text as it grows and once formatted."""

from __future__ import annotations

from PySide6.QtGui import QFont
from pytestqt.qtbot import QtBot

from tests.ui.chat_helpers import ask, open_chat, stream_answer
from tests.ui.local_server import LocalService
from tests.view.test_answer import LONG_MODEL, PEER, STAND_IN
from tray_app.ui.chat import ChatWindow


def test_the_chat_window_shows_both_badges_for_a_stand_in_answer(
    qtbot: QtBot, local_service: LocalService
) -> None:
    chunks = [
        {"choices": [{"index": 0, "delta": {"content": "Hello"}}]},
        {"choices": [{"index": 0, "delta": {"content": " there"}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "failsoft": STAND_IN},
    ]
    stream_answer(local_service, chunks, {"X-Failsoft-Model": "gemma3-270m", "X-Failsoft-Device": "gpu"})
    chat = open_chat(qtbot, local_service)
    chat.input.setPlainText("Hi")
    with qtbot.waitSignal(chat.answer_finished, timeout=10_000) as finished:
        chat.send()
    assert finished.args == ["gpu"]
    answer = chat.answers[-1]
    assert answer.text.text() == "Hello there"
    assert answer.badge.text().startswith("GPU")
    assert answer.model_badge.text() == "gemma3-270m on GPU · stand-in for qwen3-8b"
    assert not answer.model_badge.isHidden()


def test_an_answer_from_a_peer_is_badged_with_the_peer(qtbot: QtBot, local_service: LocalService) -> None:
    chat = _chat_answering(qtbot, local_service, ["Hello"], PEER, width=640)
    ask(qtbot, chat, "Hi")
    answer = chat.answers[-1]
    qtbot.waitUntil(lambda: answer.badge.isVisible(), timeout=5_000)
    assert answer.badge.text().startswith("Failed over to gaming-pc: GPU out of memory")
    assert answer.model_badge.text() == "qwen3-8b on gaming-pc"
    assert "CPU" not in answer.badge.text() + answer.model_badge.text()


def test_long_badges_wrap_inside_the_answer_instead_of_widening_the_chat(
    qtbot: QtBot, local_service: LocalService
) -> None:
    failsoft = {
        "worker": "gpu",
        "attempts": 1,
        "fallback_reason": None,
        "model": LONG_MODEL,
        "device": "gpu",
        "stand_in_for": "Meta-Llama-3.3-70B-Instruct-Q4_K_M.gguf",
    }
    chat = _chat_answering(qtbot, local_service, ["Hello"], failsoft, width=420)
    ask(qtbot, chat, "a question with a very long word: " + "x" * 200)
    answer = chat.answers[-1]

    def laid_out() -> None:
        assert answer.model_badge.isVisible()
        assert chat.transcript.width() <= chat.transcript_scroll.viewport().width()
        inside = answer.contentsRect()
        for badge in (answer.badge, answer.model_badge):
            assert inside.contains(badge.geometry()), (badge.text(), badge.geometry(), inside)
        # Not enough room side by side: the model's badge went under the other, and its own words wrap.
        assert answer.model_badge.y() > answer.badge.y()
        assert answer.model_badge.height() > answer.badge.height()

    qtbot.waitUntil(laid_out, timeout=5_000)


def test_an_answer_shows_all_of_its_lines_as_it_grows_and_as_the_window_narrows(
    qtbot: QtBot, local_service: LocalService
) -> None:
    words = [" the sea is wide and deep and blue"] * 40 + ["\n\nA second paragraph."]
    chat = _chat_answering(qtbot, local_service, words, STAND_IN, width=640)
    ask(qtbot, chat, "Tell me about the sea")
    answer = chat.answers[-1]
    assert answer.text.text() == "".join(words)

    def shows_every_line() -> None:
        document = answer.text.document().size().height()
        assert document > 8 * answer.text.fontMetrics().lineSpacing()  # many wrapped lines
        assert answer.text.height() >= document

    qtbot.waitUntil(shows_every_line, timeout=5_000)
    tall = answer.text.height()
    chat.resize(420, 600)  # narrower: more lines, a taller answer
    qtbot.waitUntil(lambda: answer.text.height() > tall, timeout=5_000)
    qtbot.waitUntil(shows_every_line, timeout=5_000)


def _chat_answering(
    qtbot: QtBot, local_service: LocalService, words: list[str], failsoft: dict[str, object], width: int
) -> ChatWindow:
    """A chat window on screen, `width` wide, whose service streams `words` and then `failsoft`."""
    chunks: list[dict[str, object]] = [{"choices": [{"index": 0, "delta": {"content": w}}]} for w in words]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "failsoft": failsoft})
    stream_answer(local_service, chunks)
    return open_chat(qtbot, local_service, width)


def test_a_finished_answer_is_shown_as_markdown_and_kept_as_written(
    qtbot: QtBot, local_service: LocalService
) -> None:
    words = ["List files with `ls`:\n\n", "```sh\nls -la\n```\n\n", "**Done.** <b>not bold</b>"]
    chat = _chat_answering(qtbot, local_service, words, STAND_IN, width=640)
    ask(qtbot, chat, "How do I list files?")
    answer = chat.answers[-1]
    qtbot.waitUntil(lambda: answer.badge.isVisible(), timeout=5_000)
    assert answer.text.text() == "".join(words)  # what the conversation sends back next turn
    shown = answer.text.toPlainText()
    assert "```" not in shown and "**" not in shown and "ls -la" in shown
    assert "<b>not bold</b>" in shown  # HTML in an answer is text, never markup
    document = answer.text.document()
    assert document.findBlock(shown.index("ls -la")).blockFormat().nonBreakableLines()  # a code block
    done = document.findBlock(shown.index("Done.")).begin().fragment()
    assert done.text() == "Done." and done.charFormat().fontWeight() >= QFont.Weight.Bold
    assert chat.history[-1] == {"role": "assistant", "content": "".join(words)}
