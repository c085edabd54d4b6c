"""Apprise (the optional `failsoft[apprise]` extra): one library for Gotify, Home Assistant, Telegram,
Matrix, e-mail and a hundred more, each named by a URL. Its actions become links in the text: most of those
services show a link, none of them a button that sends a request back."""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

from tray_app.reach.channels import ChannelError
from tray_app.reach.message import Message

INSTALL_HINT = "the apprise package is not installed: pip install 'failsoft[apprise]'"


def text(message: Message) -> str:
    lines = [message.body]
    for action in message.actions:
        verb = "open" if action.method == "GET" else "press"
        lines.append(f"{action.label} ({verb}): {action.url}")
    return "\n".join(lines)


class AppriseChannel:
    def __init__(self, urls: str) -> None:
        self.urls = urls
        self._apprise: Any = None

    def _instance(self) -> Any:
        if self._apprise is None:
            try:
                module = importlib.import_module("apprise")
            except ImportError:
                raise ChannelError(INSTALL_HINT) from None
            instance = module.Apprise()
            if not instance.add(self.urls):
                raise ChannelError("Apprise does not understand this channel's url (see Apprise's URL list)")
            self._apprise = instance
        return self._apprise

    async def send(self, message: Message) -> None:
        apprise = self._instance()
        level = {"critical": "failure", "warning": "warning"}.get(message.level, "info")
        # Apprise sends synchronously, one service after another: off the event loop.
        sent = await asyncio.to_thread(
            apprise.notify, body=text(message), title=message.title, notify_type=level
        )
        if not sent:
            raise ChannelError("Apprise could not deliver the message (its log says why)")
