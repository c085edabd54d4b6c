"""Issue 14, bounds: control request bodies and event-stream subscribers had no limit."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.testclient import TestClient

from tests.security.conftest import StandInService
from tray_app.contract.events import QueueChanged
from tray_app.server import control
from tray_app.server.origin_guard import CONTROL_MAX_BODY


def test_a_large_control_body_is_413(client: TestClient) -> None:
    body = b'{"restart": false, "pad": "' + b"x" * CONTROL_MAX_BODY + b'"}'
    response = client.post(
        "/failsoft/config/reload", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "request_too_large"


def test_a_large_chunked_control_body_is_413(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"restart": false, "pad": "'
        for _ in range(CONTROL_MAX_BODY // 1024 + 1):
            yield b"x" * 1024
        yield b'"}'

    response = client.post(
        "/failsoft/config/reload", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert "content-length" not in response.request.headers
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "request_too_large"


def test_event_streams_beyond_the_cap_are_503(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control, "MAX_EVENT_SUBSCRIBERS", 0)
    response = client.get("/failsoft/events")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "too_many_subscribers"
    assert response.headers["retry-after"]


def events_request(query: bytes = b"") -> Request:
    return Request(
        {"type": "http", "method": "GET", "path": "/failsoft/events", "headers": [], "query_string": query}
    )


async def test_subscribers_are_counted_and_released(service: StandInService) -> None:
    ctl = control.Control(service)  # type: ignore[arg-type]
    responses = [await ctl.events(events_request()) for _ in range(control.MAX_EVENT_SUBSCRIBERS)]
    assert ctl.subscribers == control.MAX_EVENT_SUBSCRIBERS
    refused = await ctl.events(events_request())
    assert refused.status_code == 503
    first = responses[0]
    assert isinstance(first, StreamingResponse) and first.background is not None
    await first.background()  # the response ended (also what runs when the stream never started)
    await first.background()  # idempotent
    assert ctl.subscribers == control.MAX_EVENT_SUBSCRIBERS - 1
    assert (await ctl.events(events_request())).status_code == 200


async def test_a_subscriber_that_stops_reading_is_dropped(service: StandInService) -> None:
    ctl = control.Control(service)  # type: ignore[arg-type]
    response = await ctl.events(events_request())
    assert isinstance(response, StreamingResponse)
    frames: Any = response.body_iterator
    assert await frames.__anext__() == b": connected\n\n"
    for depth in range(control.SUBSCRIBER_QUEUE + 50):
        service.bus.publish(QueueChanged(depth=depth, limit=99))
    await asyncio.sleep(0.05)  # the deliveries run on the loop
    received = []
    async for frame in frames:
        received.append(frame)
    assert len(received) == control.SUBSCRIBER_QUEUE + 1
    assert received[-1].startswith(b": dropped")
    assert ctl.subscribers == 0
