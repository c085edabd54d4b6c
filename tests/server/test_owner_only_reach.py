"""Issue 47 through a real service: a waiting job's prompt reaches only its owner, and the event streams
kept for the owner stay free.

- F5: a client without the admin token, subscribed to /failsoft/events, sees no prompt text when another
  client's request goes to approval; a webhook channel gets none by default, and the prompt's opening with
  `preview = true`; the owner reads it through the admin routes.
- F11: sixteen event streams asked for by ordinary clients do not lock out an admin one."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.helpers import base_settings, client_for, stop_gpu_worker
from tests.support.receiver import Receiver, receiver
from tests.support.service import ServiceHandle, running_service
from tests.support.waits import wait_until
from tray_app.server import control

pytestmark = pytest.mark.integration

SECRET = "CONFIDENTIAL: the merger with ACME closes on 12 March, do not share."
MARKER = "ACME"  # in the prompt, nowhere else


@pytest.fixture(scope="module")
def setup(module_root: Path) -> Iterator[tuple[ServiceHandle, Receiver]]:
    with receiver() as sink:
        settings = base_settings(failover={"cpu_tokens_per_second": 1.0})  # 40 tokens: past a 1 s deadline
        settings["notify"] = [
            {"kind": "webhook", "name": "hook", "url": f"{sink.url}/hook", "coalesce_seconds": 0.0},
            {
                "kind": "webhook",
                "name": "quoted",
                "url": f"{sink.url}/quoted",
                "coalesce_seconds": 0.0,
                "preview": True,
            },
        ]
        with running_service(module_root, settings=settings) as svc:
            stop_gpu_worker(svc)  # every request now needs an approved CPU run
            yield svc, sink


def ask_secret(svc: ServiceHandle) -> str:
    """Another client's request, whose CPU run waits for approval; its job id."""
    with pytest.raises(openai.InternalServerError) as raised:
        client_for(svc).chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": SECRET}],
            max_tokens=40,
            temperature=0,
            extra_headers={"X-Failsoft-Deadline": "1"},
        )
    assert raised.value.code == "cpu_too_slow"
    job_id: str = raised.value.body["job_id"]  # type: ignore[index]
    return job_id


def reject(svc: ServiceHandle, job_id: str) -> None:
    answer = httpx.post(f"{svc.base_url}/failsoft/jobs/{job_id}/reject", timeout=10, headers=svc.headers())
    assert answer.status_code == 200, answer.text


def test_a_client_without_the_admin_token_sees_no_prompt_in_the_events(
    setup: tuple[ServiceHandle, Receiver],
) -> None:
    svc, _sink = setup
    raw: list[str] = []
    connected, seen = threading.Event(), threading.Event()

    def listen() -> None:  # as any local program: no admin token
        with httpx.stream("GET", svc.base_url + "/failsoft/events", timeout=60) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                raw.append(line)
                if line.startswith(": connected"):
                    connected.set()
                elif line.startswith("data: ") and '"approval_needed"' in line:
                    seen.set()
                    return

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert connected.wait(10)
    job_id = ask_secret(svc)
    assert seen.wait(30), raw
    thread.join(10)
    stream = "\n".join(raw)
    assert MARKER not in stream and "preview" not in stream
    event = json.loads(next(line for line in raw if '"approval_needed"' in line)[6:])
    assert event["job_id"] == job_id
    assert event["model"] and event["prompt_tokens"] > 0 and event["reason"]
    # The history a late listener replays holds none either.
    assert MARKER not in json.dumps(replayed(svc))
    # The owner reads it through the admin route.
    listed = httpx.get(
        f"{svc.base_url}/failsoft/jobs",
        params={"state": "awaiting_approval"},
        timeout=10,
        headers=svc.headers(),
    ).json()["data"]
    assert next(job for job in listed if job["id"] == job_id)["preview"] == SECRET
    reject(svc, job_id)


def replayed(svc: ServiceHandle) -> list[str]:
    """What /failsoft/events?history=1 replays: its lines until the stream pauses (2 s)."""
    lines: list[str] = []
    url = svc.base_url + "/failsoft/events?history=1"
    with contextlib.suppress(httpx.ReadTimeout), httpx.stream("GET", url, timeout=2) as response:
        lines.extend(response.iter_lines())
    assert any('"approval_needed"' in line for line in lines), lines
    return lines


def test_a_webhook_gets_the_prompt_only_with_preview_on(setup: tuple[ServiceHandle, Receiver]) -> None:
    svc, sink = setup
    job_id = ask_secret(svc)

    def message(path: str) -> dict[str, Any] | None:
        return next((p.body for p in sink.at(path) if p.body["events"][0].get("job_id") == job_id), None)

    plain = wait_until(lambda: message("/hook"), what="the default channel's message")
    quoted = wait_until(lambda: message("/quoted"), what="the preview channel's message")
    assert MARKER not in json.dumps(plain)
    assert "Model " in plain["message"] and " tokens" in plain["message"]
    assert f"“{SECRET}”" in quoted["message"]
    assert MARKER not in json.dumps(quoted["events"])  # the quote is in the words only
    reject(svc, job_id)


def test_ordinary_clients_holding_every_stream_do_not_lock_the_owner_out(
    setup: tuple[ServiceHandle, Receiver],
) -> None:
    svc, _sink = setup
    with contextlib.ExitStack() as streams, httpx.Client(base_url=svc.base_url, timeout=30) as http:
        readers: list[Iterator[str]] = []  # kept: a reader that goes away closes its connection

        def open_stream(headers: dict[str, str] | None = None) -> httpx.Response:
            response = streams.enter_context(http.stream("GET", "/failsoft/events", headers=headers))
            if response.status_code == 200:
                readers.append(response.iter_lines())
                assert next(readers[-1]).startswith(": connected")
            else:
                response.read()
            return response

        ordinary = [open_stream() for _ in range(control.MAX_EVENT_SUBSCRIBERS)]
        share = control.MAX_EVENT_SUBSCRIBERS - control.OWNER_EVENT_STREAMS
        assert [r.status_code for r in ordinary] == [200] * share + [429] * control.OWNER_EVENT_STREAMS
        refused = ordinary[-1].json()["error"]
        assert refused["code"] == "too_many_event_streams"
        assert "kept for the tray and the status page" in refused["message"]
        owner = open_stream(svc.headers())
        assert owner.status_code == 200
