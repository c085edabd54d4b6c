"""Issue 47 (F5), fast: a waiting job's prompt reaches the owner's routes only. The approval event (on
/failsoft/events, which needs no admin token) names the model, the size and the reason; the prompt's opening
is in the admin routes' answers."""

from __future__ import annotations

import json
from typing import Any

from starlette.testclient import TestClient

from tests.security.conftest import StandInService, client_for
from tray_app.contract.events import ApprovalNeeded
from tray_app.jobs.registry import Job, new_id
from tray_app.server.routes import create_app

SECRET = "CONFIDENTIAL: the merger with ACME closes on 12 March, do not share."


def awaiting(service: StandInService) -> Job:
    job = Job(
        id=new_id("job"),
        request_id="r",
        kind="chat",
        body={"messages": [{"role": "user", "content": SECRET}]},
        stream=False,
        background=True,
        body_hash="h",
        idempotency_key=None,
        prompt_tokens=57,
        max_tokens=40,
        deadline=1e12,
        asked_model="model.gguf",
    )
    service.registry.add(job)
    service.registry.set_route(job, "cpu")
    service.registry.await_approval(job, 80.0, "gpu_unavailable")
    return job


def test_the_approval_event_says_model_size_and_reason_never_the_prompt(service: StandInService) -> None:
    job = awaiting(service)
    [event] = [event for event in service.bus.recent() if isinstance(event, ApprovalNeeded)]
    wire: dict[str, Any] = event.to_dict()
    assert "CONFIDENTIAL" not in json.dumps(wire)
    assert (wire["job_id"], wire["model"], wire["prompt_tokens"], wire["reason"]) == (
        job.id,
        "model.gguf",
        57,
        "gpu_unavailable",
    )
    assert event.prompt_preview == SECRET  # for the notify channels that asked for it, in this process only


def test_the_owner_reads_the_prompt_through_the_admin_routes(
    client: TestClient, service: StandInService
) -> None:
    job = awaiting(service)
    with client_for(create_app(service, manage_lifecycle=False), admin=False) as anyone:  # type: ignore[arg-type]
        assert anyone.get("/failsoft/jobs", params={"state": "awaiting_approval"}).status_code == 401
        assert anyone.get("/failsoft/view").status_code == 401
    listed = client.get("/failsoft/jobs", params={"state": "awaiting_approval"}).json()["data"]
    assert [(row["id"], row["preview"]) for row in listed] == [(job.id, SECRET)]
    view = client.get("/failsoft/view").json()
    assert view["approvals"][0]["preview"] == SECRET
    # The page's recent failovers come from the events: no prompt there.
    assert [event["type"] for event in view["failovers"]] == ["approval_needed"]
    assert "CONFIDENTIAL" not in json.dumps(view["failovers"])
