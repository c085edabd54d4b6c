"""Issue 14, bounds: control request bodies and event-stream subscribers had no limit."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.testclient import TestClient

from tests.security.conftest import ADMIN_TOKEN, StandInService
from tests.security.test_status_page import page_client
from tray_app.contract.events import QueueChanged
from tray_app.reach import admin_token
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


def events_request(query: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None) -> Request:
    return Request(
        {
            "type": "http",
            "method": "GET",
            "path": "/failsoft/events",
            "headers": [(b"host", b"127.0.0.1:8750"), *(headers or [])],
            "query_string": query,
        }
    )


ADMIN = [(admin_token.HEADER.lower().encode(), ADMIN_TOKEN.encode())]
CLIENT_SHARE = control.MAX_EVENT_SUBSCRIBERS - control.OWNER_EVENT_STREAMS


async def end(response: Response) -> None:
    """What runs when a stream ends (or never started)."""
    assert isinstance(response, StreamingResponse) and response.background is not None
    await response.background()


async def test_subscribers_are_counted_and_released(service: StandInService) -> None:
    ctl = control.Control(service)  # type: ignore[arg-type]
    responses = [
        await ctl.events(events_request(headers=ADMIN)) for _ in range(control.MAX_EVENT_SUBSCRIBERS)
    ]
    assert ctl.subscribers == control.MAX_EVENT_SUBSCRIBERS and ctl.client_subscribers == 0
    refused = await ctl.events(events_request(headers=ADMIN))
    assert refused.status_code == 503
    await end(responses[0])
    await end(responses[0])  # idempotent
    assert ctl.subscribers == control.MAX_EVENT_SUBSCRIBERS - 1
    assert (await ctl.events(events_request(headers=ADMIN))).status_code == 200


async def test_api_clients_cannot_take_the_streams_kept_for_the_owner(service: StandInService) -> None:
    """Issue 47 (F11): /failsoft/events needs no admin token; an API client holding every stream kept the
    tray and the status page off it."""
    ctl = control.Control(service)  # type: ignore[arg-type]
    clients = [await ctl.events(events_request()) for _ in range(CLIENT_SHARE)]
    assert [response.status_code for response in clients] == [200] * CLIENT_SHARE
    refused = await ctl.events(events_request())
    error = json.loads(bytes(refused.body))["error"]
    assert refused.status_code == 429 and refused.headers["retry-after"] == "5"
    assert error["code"] == "too_many_event_streams"
    assert f"at most {CLIENT_SHARE} event streams" in error["message"]
    assert "kept for the tray and the status page" in error["message"]
    wrong = [(admin_token.HEADER.lower().encode(), b"a guess")]
    assert (await ctl.events(events_request(headers=wrong))).status_code == 429
    owners = [await ctl.events(events_request(headers=ADMIN)) for _ in range(control.OWNER_EVENT_STREAMS)]
    assert [response.status_code for response in owners] == [200] * control.OWNER_EVENT_STREAMS
    assert (await ctl.events(events_request(headers=ADMIN))).status_code == 503  # all 16 are open
    # The status page's login counts as the owner too.
    await end(owners[0])
    with page_client(service) as page:
        login = page.post("/ui/login", json={"token": ADMIN_TOKEN})
        assert login.status_code == 200, login.text
        cookie = login.headers["set-cookie"].split(";")[0].encode()
    assert (await ctl.events(events_request(headers=[(b"cookie", cookie)]))).status_code == 200
    # A client's stream that ends frees a client's place.
    await end(clients[0])
    assert ctl.client_subscribers == CLIENT_SHARE - 1
    assert (await ctl.events(events_request())).status_code == 200
    assert (ctl.subscribers, ctl.client_subscribers) == (control.MAX_EVENT_SUBSCRIBERS, CLIENT_SHARE)


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
