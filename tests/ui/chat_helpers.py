"""A chat window on screen against a local HTTP server that streams a scripted answer."""

from __future__ import annotations

import json

from pytestqt.qtbot import QtBot

from tests.ui.local_server import LocalService
from tray_app.ui.api_client import ServiceClient
from tray_app.ui.chat import ChatWindow
from tray_app.ui.qt_events import QtEventBridge


def stream_answer(
    local_service: LocalService, chunks: list[dict[str, object]], headers: dict[str, str] | None = None
) -> None:
    """Every chat request to `local_service` is answered with `chunks` as server-sent events, then [DONE]
    (with `headers` beside the content type)."""
    body = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
    headers = {"Content-Type": "text/event-stream", **(headers or {})}
    local_service.answer("POST", "/v1/chat/completions", 200, body.encode(), headers)


def open_chat(qtbot: QtBot, local_service: LocalService, width: int = 640) -> ChatWindow:
    chat = ChatWindow(ServiceClient(local_service.base_url), QtEventBridge())
    qtbot.addWidget(chat)
    chat.resize(width, 600)
    chat.show()
    qtbot.waitExposed(chat)
    return chat


def ask(qtbot: QtBot, chat: ChatWindow, question: str) -> None:
    """Type `question`, send it, wait for the answer to end."""
    chat.input.setPlainText(question)
    with qtbot.waitSignal(chat.answer_finished, timeout=10_000):
        chat.send()
