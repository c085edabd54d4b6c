"""The dispatcher: events to each channel's messages, gathered, filtered, held in quiet hours, and a failing
channel that never reaches the publisher."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from tray_app.config.notify import NotifyConfig
from tray_app.contract.events import ApprovalNeeded, EventBus, FallbackStarted, JobStateChanged
from tray_app.reach import dispatcher as dispatcher_module
from tray_app.reach import webhook
from tray_app.reach.capability import Signer
from tray_app.reach.channels import ChannelError
from tray_app.reach.dispatcher import Dispatcher
from tray_app.reach.message import Message


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.sent: list[Message] = []
        self.fail = fail

    async def send(self, message: Message) -> None:
        if self.fail:
            raise ChannelError("the receiver answered 500")
        self.sent.append(message)


@pytest.fixture
def channels(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Recorder]]:
    made: dict[str, Recorder] = {}

    def build(cfg: NotifyConfig, client: Any) -> Recorder:
        made[cfg.name] = Recorder(fail=cfg.name.startswith("broken"))
        return made[cfg.name]

    monkeypatch.setattr(dispatcher_module, "build", build)
    yield made


def channel(name: str, **options: Any) -> NotifyConfig:
    return NotifyConfig(kind="webhook", url="http://127.0.0.1:9/", name=name, coalesce_seconds=0.2, **options)


async def settle(seconds: float = 0.5) -> None:
    await asyncio.sleep(seconds)


async def run(configs: list[NotifyConfig], events: list[Any], public_url: str = "", **kw: Any) -> Dispatcher:
    bus = EventBus()
    dispatcher = Dispatcher(bus, lambda: configs, lambda: public_url, Signer(b"k" * 32), **kw)
    dispatcher.start()
    for event in events:
        bus.publish(event)
    return dispatcher


async def test_a_burst_goes_out_as_one_message(channels: dict[str, Recorder]) -> None:
    events = [FallbackStarted(job_id=f"job-{n}", reason="crash_abort") for n in range(5)]
    dispatcher = await run([channel("phone")], events)
    await settle()
    [message] = channels["phone"].sent
    assert "5 jobs moved to the CPU" in message.body
    assert dispatcher.status()[0]["sent"] == 1
    await dispatcher.stop()


async def test_each_channel_hears_only_its_events(channels: dict[str, Recorder]) -> None:
    events = [
        FallbackStarted(job_id="job-1", reason="crash_abort"),
        JobStateChanged(job_id="job-1", state="running"),
    ]
    dispatcher = await run([channel("approvals", events=["approval"]), channel("all")], events)
    await settle()
    assert channels["approvals"].sent == [] and len(channels["all"].sent) == 1
    await dispatcher.stop()


async def test_an_approval_carries_signed_links_to_the_public_url(channels: dict[str, Recorder]) -> None:
    event = ApprovalNeeded(job_id="job-7", estimated_seconds=80, prompt_preview="hi")
    dispatcher = await run([channel("phone")], [event], public_url="https://box.example/")
    await settle()
    [message] = channels["phone"].sent
    approve = message.actions[0]
    assert approve.url.startswith("https://box.example/ui/act/job-7.approve.")
    assert dispatcher.signer.check(approve.url.rsplit("/", 1)[1]).job_id == "job-7"
    await dispatcher.stop()


async def test_a_failing_channel_is_counted_and_the_others_still_hear(
    channels: dict[str, Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    dispatcher = await run(
        [channel("broken"), channel("phone")], [FallbackStarted(job_id="job-1", reason="crash_abort")]
    )
    await settle()
    broken, phone = dispatcher.status()
    assert (broken["failed"], broken["last_error"]) == (1, "the receiver answered 500")
    assert phone["sent"] == 1 and len(channels["phone"].sent) == 1
    assert "the receiver answered 500" in caplog.text
    await dispatcher.stop()


async def test_quiet_hours_hold_messages_until_they_end(
    channels: dict[str, Recorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatcher_module, "QUIET_MARGIN", 0.1)
    clock = {"now": datetime(2025, 3, 1, 6, 59, 59, 600_000)}
    dispatcher = await run(
        [channel("phone", quiet_hours="22:00-07:00")],
        [FallbackStarted(job_id="job-1", reason="crash_abort")],
        now=lambda: clock["now"],
    )
    await settle(0.3)
    assert channels["phone"].sent == [] and dispatcher.status()[0]["pending"] == 1
    clock["now"] = datetime(2025, 3, 1, 7, 0, 0, 200_000)
    await settle(0.5)
    assert len(channels["phone"].sent) == 1
    await dispatcher.stop()


async def test_only_a_channel_with_preview_on_quotes_the_prompt(channels: dict[str, Recorder]) -> None:
    secret = "CONFIDENTIAL: the merger with ACME closes on 12 March"
    event = ApprovalNeeded(
        job_id="job-7", estimated_seconds=80, model="smollm2", prompt_tokens=31, prompt_preview=secret
    )
    dispatcher = await run([channel("phone"), channel("quoted", preview=True)], [event])
    await settle()
    [plain], [quoted] = channels["phone"].sent, channels["quoted"].sent
    assert "Model smollm2 · prompt 31 tokens" in plain.body
    assert "CONFIDENTIAL" not in str(webhook.payload(plain))
    assert f"“{secret}”" in quoted.body
    # The quote is in the words only: the events a webhook gets are the wire's, with no prompt text.
    assert "CONFIDENTIAL" not in str(webhook.payload(quoted)["events"])
    assert [state["preview"] for state in dispatcher.status()] == [False, True]
    await dispatcher.stop()


async def test_a_held_preview_goes_with_its_message_and_no_further(channels: dict[str, Recorder]) -> None:
    events = [
        ApprovalNeeded(job_id="job-1", estimated_seconds=80, prompt_preview="first prompt"),
        ApprovalNeeded(job_id="job-2", estimated_seconds=80, prompt_preview="second prompt"),
    ]
    dispatcher = await run([channel("quoted", preview=True)], events)
    await settle()
    [burst] = channels["quoted"].sent  # two approvals: one message, which quotes neither
    assert "first prompt" not in burst.body and "second prompt" not in burst.body
    # Sent (or not) with its batch, a preview is forgotten: a later event of the same job finds none.
    dispatcher.take(ApprovalNeeded(job_id="job-1", estimated_seconds=80).to_dict())
    await settle()
    assert "first prompt" not in channels["quoted"].sent[-1].body
    await dispatcher.stop()
