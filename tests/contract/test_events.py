"""The event bus: fan-out to listeners and async subscribers, from any thread, with a short history."""

from __future__ import annotations

import asyncio
import threading

from tray_app.contract.events import ApprovalNeeded, EventBus, FallbackStarted, WorkerStateChanged


def test_to_dict_carries_type_time_and_fields() -> None:
    event = FallbackStarted(job_id="job-1", reason="oom_decode")
    data = event.to_dict()
    assert data["type"] == "fallback_started"
    assert data["job_id"] == "job-1"
    assert data["reason"] == "oom_decode"
    assert data["at"] > 0


def test_an_approval_keeps_the_prompt_off_the_wire() -> None:
    """/failsoft/events needs no admin token: its approvals say which model, how large and why, never what
    the prompt says; the prompt's opening stays on the object, for the notify channels that opted in."""
    event = ApprovalNeeded(
        job_id="job-1",
        estimated_seconds=80,
        model="smollm2",
        prompt_tokens=42,
        reason="gpu_unavailable",
        prompt_preview="CONFIDENTIAL: the merger closes on 12 March",
    )
    data = event.to_dict()
    assert "CONFIDENTIAL" not in str(data) and "CONFIDENTIAL" not in repr(event)
    assert "preview" not in data and "prompt_preview" not in data
    assert (data["model"], data["prompt_tokens"], data["reason"]) == ("smollm2", 42, "gpu_unavailable")
    assert event.prompt_preview.startswith("CONFIDENTIAL")


def test_listeners_receive_in_order_and_can_be_removed() -> None:
    bus = EventBus()
    seen: list[str] = []
    remove = bus.add_listener(lambda event: seen.append(event.to_dict()["new"]))
    bus.publish(WorkerStateChanged(role="gpu", old="stopped", new="starting", reason="service start"))
    bus.publish(WorkerStateChanged(role="gpu", old="starting", new="ready", reason="health ok"))
    remove()
    bus.publish(WorkerStateChanged(role="gpu", old="ready", new="stopping", reason="quit"))
    assert seen == ["starting", "ready"]


def test_history_is_bounded() -> None:
    bus = EventBus(history=3)
    for index in range(5):
        bus.publish(FallbackStarted(job_id=f"job-{index}", reason="x"))
    assert [event.to_dict()["job_id"] for event in bus.recent()] == ["job-2", "job-3", "job-4"]


async def test_async_subscriber_gets_events_published_from_another_thread() -> None:
    bus = EventBus()
    received: list[str] = []

    async def consume() -> None:
        async for event in bus.subscribe():
            received.append(event.to_dict()["job_id"])
            if len(received) == 3:
                return

    consumer = asyncio.create_task(consume())
    await asyncio.sleep(0)  # let the subscriber register before publishing

    def publish_from_thread() -> None:
        for index in range(3):
            bus.publish(FallbackStarted(job_id=f"job-{index}", reason="x"))

    thread = threading.Thread(target=publish_from_thread)
    thread.start()
    thread.join()
    await asyncio.wait_for(consumer, timeout=5)
    assert received == ["job-0", "job-1", "job-2"]
