"""Apprise is an optional extra: without it an apprise channel says how to install it; with it, the message
and its links go through `Apprise.notify`."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from tray_app.reach.apprise_channel import INSTALL_HINT, AppriseChannel
from tray_app.reach.channels import ChannelError
from tray_app.reach.message import ActionLink, Message

MESSAGE = Message("Approval needed", "job-1 needs 1 min", "warning", (ActionLink("Approve", "https://x/a"),))


async def test_without_apprise_the_channel_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "apprise", None)  # import apprise -> ImportError
    with pytest.raises(ChannelError, match="pip install 'failsoft\\[apprise\\]'") as raised:
        await AppriseChannel("gotify://host/token").send(MESSAGE)
    assert str(raised.value) == INSTALL_HINT


async def test_with_apprise_the_message_goes_through_notify(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    class Apprise:
        def add(self, urls: str) -> bool:
            return urls.startswith("gotify://")

        def notify(self, **kwargs: Any) -> bool:
            calls.append(kwargs)
            return True

    monkeypatch.setitem(sys.modules, "apprise", types.SimpleNamespace(Apprise=Apprise))
    await AppriseChannel("gotify://host/token").send(MESSAGE)
    assert calls[0]["title"] == "Approval needed" and "Approve (press): https://x/a" in calls[0]["body"]
    with pytest.raises(ChannelError, match="does not understand"):
        await AppriseChannel("nonsense").send(MESSAGE)
