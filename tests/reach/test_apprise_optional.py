"""Apprise is an optional extra: without it an apprise channel says how to install it; with it, the message
and its links go through `Apprise.notify`."""

from __future__ import annotations

import asyncio
import sys
import threading
import types
from typing import Any

import pytest

from tests.support.waits import wait_until_async
from tray_app.reach import channels
from tray_app.reach.apprise_channel import INSTALL_HINT, AppriseChannel, BlockingSends
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


class HangingApprise:
    """An Apprise whose sends hang (a service that never answers) until `release` is set; notes each
    send's thread and how many ran at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.threads: list[str] = []
        self.running = 0
        self.most_running = 0
        self._lock = threading.Lock()

    def add(self, urls: str) -> bool:
        return True

    def notify(self, **kwargs: Any) -> bool:
        with self._lock:
            self.threads.append(threading.current_thread().name)
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            return self.release.wait(timeout=30)
        finally:
            with self._lock:
                self.running -= 1


async def test_a_hanging_apprise_send_times_out_on_the_channels_own_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review F13: Apprise sent on the default executor (shared with the journal, long counts and the device
    readings) with no timeout of its own. Now: at most two sends at once on the channels' own threads, each
    failed after the channel timeout, the default executor free all along."""
    hanging = HangingApprise()
    monkeypatch.setitem(sys.modules, "apprise", types.SimpleNamespace(Apprise=lambda: hanging))
    monkeypatch.setattr(channels, "SEND_TIMEOUT", 0.2)
    sends = BlockingSends(threads=2, queued=2)
    channel = AppriseChannel("gotify://host/token", sends)
    try:
        outcomes = await asyncio.gather(*(channel.send(MESSAGE) for _ in range(4)), return_exceptions=True)
        # Two hung on the threads, two waited in the queue: each failed with the timeout.
        assert all(isinstance(o, ChannelError) and "no answer within 0.2 s" in str(o) for o in outcomes)
        assert hanging.most_running == 2 and set(hanging.threads) == {"failsoft-notify"}
        # The default executor is not where they hang: it answers at once.
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), timeout=5) == "free"
        # Both threads still hang, and the sends that timed out waiting still fill the queue: a further
        # send fails at once rather than wait.
        with pytest.raises(ChannelError, match="threads still hang on earlier sends"):
            await asyncio.wait_for(channel.send(MESSAGE), timeout=0.1)
    finally:
        hanging.release.set()
    # Once the service answers again, sends go through; those that timed out in the queue were never made.
    await wait_until_async(lambda: sends.outstanding == 0, timeout=10, what="the threads to be free")
    monkeypatch.setattr(channels, "SEND_TIMEOUT", 10.0)
    await channel.send(MESSAGE)
    assert len(hanging.threads) == 3
