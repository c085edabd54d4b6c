"""Issue 42 through real processes: a fallback that needs approval reaches a local ntfy-like receiver and a
webhook with Approve and Reject; pressing the recorded Approve runs exactly that job on the CPU, once; a
second press, another job's id, an expired or an altered link change nothing; a failing channel only shows
in the status, and in `failsoft status`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.helpers import CHAT, base_settings, client_for, job_state, run_failsoft, stop_gpu_worker
from tests.support.receiver import Receiver, receiver
from tests.support.service import ServiceHandle, free_port, running_service
from tests.support.waits import wait_until
from tray_app.reach.capability import Signer, ensure_key

pytestmark = pytest.mark.integration

REQUEST: dict[str, Any] = {"model": "default", "messages": CHAT, "max_tokens": 40, "temperature": 0}


@pytest.fixture(scope="module")
def setup(module_root: Path) -> Iterator[tuple[ServiceHandle, Receiver]]:
    with receiver() as sink:
        port = free_port()
        settings = base_settings(
            failover={"cpu_tokens_per_second": 1.0},  # 40 tokens: 40 s on the CPU, past a 1 s deadline
            server={"public_url": f"http://127.0.0.1:{port}"},
        )
        settings["notify"] = [
            {
                "kind": "ntfy",
                "name": "phone",
                "url": f"{sink.url}/failsoft-alerts",
                "token": "tk_test",
                "coalesce_seconds": 0.0,
                "events": ["approval"],
            },
            {"kind": "webhook", "name": "hook", "url": f"{sink.url}/hook", "coalesce_seconds": 0.0},
            {"kind": "webhook", "name": "down", "url": f"{sink.url}/broken", "coalesce_seconds": 0.0},
        ]
        with running_service(module_root, settings=settings, port=port) as svc:
            stop_gpu_worker(svc)  # every request now needs an approved CPU run
            yield svc, sink


def ask(svc: ServiceHandle) -> str:
    """A request whose CPU run waits for approval; its job id."""
    with pytest.raises(openai.InternalServerError) as raised:
        client_for(svc).chat.completions.create(**REQUEST, extra_headers={"X-Failsoft-Deadline": "1"})
    assert raised.value.code == "cpu_too_slow"
    job_id: str = raised.value.body["job_id"]  # type: ignore[index]
    return job_id


def ntfy_message(sink: Receiver, job_id: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        return next((p.body for p in sink.at("/") if job_id in p.body.get("message", "")), None)

    message: dict[str, Any] = wait_until(find, what=f"the ntfy message about {job_id}")
    return message


def press(action: dict[str, Any]) -> httpx.Response:
    """What the ntfy app does for an "http" action button."""
    return httpx.request(action["method"], action["url"], timeout=10)


def test_approve_from_the_phone_runs_exactly_that_job_once(setup: tuple[ServiceHandle, Receiver]) -> None:
    svc, sink = setup
    first, second = ask(svc), ask(svc)
    message = ntfy_message(sink, first)
    assert message["topic"] == "failsoft-alerts" and message["title"] == "Approval needed"
    assert [a["label"] for a in message["actions"]] == ["Approve", "Reject", "Open"]
    assert sink.at("/")[0].headers["Authorization"] == "Bearer tk_test"
    approve = message["actions"][0]
    assert approve["action"] == "http" and approve["url"].startswith(svc.base_url + "/ui/act/")

    pressed = press(approve)  # no API key, no admin token: the link is the credential
    assert pressed.status_code == 200, pressed.text
    assert pressed.text.startswith(f"approved: {first} runs on the CPU, about ")
    done = wait_until(
        lambda: (s := job_state(svc, first))["state"] == "completed" and s,
        timeout=120,
        what="the approved job",
    )
    assert done["result"]["failsoft"]["worker"] == "cpu"
    assert job_state(svc, second)["state"] == "awaiting_approval"  # the other job is untouched

    again = press(approve)
    assert again.status_code == 403 and "used already" in again.text
    assert job_state(svc, first)["attempts"] == done["attempts"]  # it did not run again

    # The second job's links, changed or out of date, do nothing.
    key = ensure_key(svc.data_dir)  # the service's own key: a link that expired is signed properly
    expired = Signer(key).link_token(second, "approve", ttl=-5)
    other_job = approve["url"].replace(first, second)
    for url in (f"{svc.base_url}/ui/act/{expired}", other_job, approve["url"][:-3] + "abc"):
        refused = httpx.post(url, timeout=10)
        assert refused.status_code == 403, (url, refused.text)
        assert refused.text.startswith("refused:")
    assert job_state(svc, second)["state"] == "awaiting_approval"

    reject = ntfy_message(sink, second)["actions"][1]
    rejected = press(reject)
    assert rejected.status_code == 200 and rejected.text.startswith(f"rejected: {second}")
    assert job_state(svc, second)["state"] == "rejected"


def test_the_webhook_gets_the_links_and_a_failing_channel_shows_in_status(
    setup: tuple[ServiceHandle, Receiver],
) -> None:
    svc, sink = setup
    job_id = ask(svc)
    hook = wait_until(
        lambda: next((p.body for p in sink.at("/hook") if p.body["events"][0].get("job_id") == job_id), None),
        what="the webhook's message",
    )
    assert hook["source"] == "failsoft" and hook["actions"][0]["label"] == "Approve"
    channels = {c["name"]: c for c in wait_until(lambda: svc.status()["notify"], what="channel status")}
    down = wait_until(
        lambda: (
            next(c for c in svc.status()["notify"] if c["name"] == "down")["failed"]
            and next(c for c in svc.status()["notify"] if c["name"] == "down")
        ),
        what="the failure",
    )
    assert "answered 500" in down["last_error"] and "127.0.0.1" in down["last_error"]
    assert channels["hook"]["failed"] == 0
    # The terminal shows each channel where it sends, never its topic, path or token.
    shown = run_failsoft(svc.config_path, "status", "--url", svc.base_url)
    assert shown.returncode == 0, shown.stderr
    lines = [line for line in shown.stdout.splitlines() if " → " in line]
    assert lines[0].startswith(f"  phone (ntfy) → {sink.url} · approval · ok, ")
    assert lines[1].startswith(f"  hook (webhook) → {sink.url} · all events · ok, ")
    assert lines[2].startswith(f"  down (webhook) → {sink.url} · all events · FAILING, last error ")
    assert "answered 500" in lines[2]
    for secret in ("failsoft-alerts", "tk_test", "/broken", "/hook"):
        assert secret not in shown.stdout
    # The failing channel blocked nothing: the job waits for its decision as it should, and is rejected.
    assert job_state(svc, job_id)["state"] == "awaiting_approval"
    answer = httpx.post(f"{svc.base_url}/failsoft/jobs/{job_id}/reject", timeout=10, headers=svc.headers())
    assert answer.status_code == 200
