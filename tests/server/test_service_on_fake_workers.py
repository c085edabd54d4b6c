"""The whole service (real `failsoft serve`, real HTTP, the real openai client) on fake llama-servers: the
fast tier's check of the router's hot path and its failover decisions, with no model loaded. Every case
here is also tested on real llama.cpp workers (test_failover.py, test_api.py)."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fake_worker import fake_llama_server
from tests.support.helpers import (
    arm,
    base_settings,
    client_for,
    events_until_completed,
    failsoft_of,
    job_state,
    wait_replaced,
)
from tests.support.service import ServiceHandle, running_service
from tray_app import config
from tray_app.reach import admin_token

CHAT: dict[str, Any] = {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6}


def fake_service(root: Path, **fake: float | str) -> Iterator[ServiceHandle]:
    engine = fake_llama_server(root.parent, **fake) if fake else fake_llama_server(root.parent)
    settings = base_settings(engine={"llama_server": str(engine)}, failover={"auto_approve_seconds": 3600})
    with running_service(root, enable_faults=True, settings=settings, ready_timeout=30) as handle:
        yield handle


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceHandle]:
    yield from fake_service(tmp_path_factory.mktemp("fake") / "service", token_delay=0.02)


def test_answers_come_from_the_gpu_worker_streamed_or_not(svc: ServiceHandle) -> None:
    client = client_for(svc)
    whole = client.chat.completions.create(**CHAT)
    assert whole.choices[0].message.content == "The sea is wide and deep"
    assert failsoft_of(whole)["worker"] == "gpu"
    text = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(**CHAT, stream=True)
        if chunk.choices
    )
    assert text == "The sea is wide and deep"


def test_a_request_that_starts_at_once_is_journaled_and_announced_in_order(svc: ServiceHandle) -> None:
    """A request the GPU can take at once goes to its worker before its bookkeeping: the journal entry and
    the events still come, and in the order a client of /failsoft/events relies on."""
    with events_until_completed(svc) as seen:
        chunks = list(client_for(svc).chat.completions.create(**CHAT, stream=True))
    job_id = next(c.model_extra["failsoft"]["job_id"] for c in chunks if c.model_extra.get("failsoft"))
    mine = [
        (kind, data.get("state") or data.get("route")) for kind, data in seen if data.get("job_id") == job_id
    ]
    assert mine[:2] == [("job_state", "queued"), ("route_decided", "gpu")]
    assert ("job_state", "running") in mine and mine[-1] == ("job_state", "completed")
    job = job_state(svc, job_id)
    assert (job["state"], job["route"]) == ("completed", "gpu")
    assert [(a["worker"], a["outcome"]) for a in job["attempt_log"]] == [("gpu", "completed")]


def test_a_gpu_worker_killed_mid_stream_hands_the_rest_to_the_cpu(svc: ServiceHandle) -> None:
    armed = arm(svc, "kill", after_tokens=3)
    pieces: list[str] = []
    info: dict[str, Any] = {}
    for chunk in client_for(svc).chat.completions.create(**CHAT, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.model_extra and chunk.model_extra.get("failsoft"):
            info = chunk.model_extra["failsoft"]
    assert (info["worker"], info["attempts"], info["fallback_reason"]) == ("cpu", 2, "killed")
    assert "".join(pieces).startswith("The sea")  # what the GPU sent, then the CPU's continuation
    job = job_state(svc, info["job_id"])
    assert [(a["worker"], a["outcome"]) for a in job["attempt_log"]] == [
        ("gpu", "failed"),
        ("cpu", "completed"),
    ]
    wait_replaced(svc, armed["pid"])


def test_a_decode_failure_replays_a_whole_answer_on_the_cpu(tmp_path: Path) -> None:
    for handle in fake_service(tmp_path / "service", error_after=2, faulty="gpu"):
        answer = client_for(handle).chat.completions.create(**CHAT)
        info = failsoft_of(answer)
        assert (info["worker"], info["attempts"], info["fallback_reason"]) == ("cpu", 2, "oom_decode")
        assert answer.choices[0].message.content == "The sea is wide and deep"  # whole, from the start


@pytest.mark.slow  # the stall detector waits its 15 s before it calls a worker hung
def test_a_worker_that_goes_silent_is_found_hung(tmp_path: Path) -> None:
    for handle in fake_service(tmp_path / "service", hang_after=1, faulty="gpu"):
        client = client_for(handle, timeout=60)
        answer = client.chat.completions.create(**CHAT)
        info = failsoft_of(answer)
        assert (info["worker"], info["fallback_reason"]) == ("cpu", "hung")


def test_the_config_is_read_and_changed_through_the_api(svc: ServiceHandle) -> None:
    """Issue 15: the tray wrote the service's file itself. The service owns it: GET shows what is in effect
    and in the file (never the API key), PATCH writes the file (0600) and says what applied live and what
    waits for a restart; a refused value changes nothing."""
    base = svc.base_url + "/failsoft/config"
    shown = httpx.get(base, headers=svc.headers(), timeout=10).json()
    assert "failover.deadline" in shown["live"] and "budget.n_parallel" not in shown["live"]
    assert shown["config"]["server"]["api_key"] == "" and shown["file"]["engine"]["llama_server"]
    before = svc.config_path.read_bytes()
    refused = httpx.patch(
        base, json={"changes": {"failover": {"deadline": "soon"}}}, headers=svc.headers(), timeout=10
    )
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_config"
    assert svc.config_path.read_bytes() == before
    changes = {"failover": {"deadline": 42.0}, "budget": {"n_parallel": 2}}
    answer = httpx.patch(base, json={"changes": changes}, headers=svc.headers(), timeout=10).json()
    assert sorted(answer["changed"]) == ["budget.n_parallel", "failover.deadline"]
    assert (answer["applied"], answer["needs_restart"], answer["restarted"]) == (
        ["failover.deadline"],
        ["budget.n_parallel"],
        False,
    )
    assert svc.status()["policy"]["deadline"] == 42.0
    assert config.load(svc.config_path).budget.n_parallel == 2
    assert stat.S_IMODE(svc.config_path.stat().st_mode) == 0o600
    plain = httpx.patch(
        base, content=b"{}", headers={**svc.headers(), "Content-Type": "text/plain"}, timeout=10
    )
    assert plain.status_code == 415  # a web page cannot send it without a preflight


def test_control_routes_need_the_admin_token_and_views_do_not(svc: ServiceHandle) -> None:
    """Review N3: any local program could reconfigure the service. The control API now takes the token the
    service keeps in its data folder (0600), which the tray and the failsoft commands read."""
    token_file = svc.data_dir / admin_token.FILE_NAME
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert token_file.read_text().strip() == svc.admin_token
    before = svc.config_path.read_bytes()
    change = {"changes": {"failover": {"deadline": 5.0}}}
    for headers in ({}, {admin_token.HEADER: "not-the-token"}, {admin_token.HEADER: "é".encode()}):
        for method, path, body in (
            ("PATCH", "/failsoft/config", change),
            ("GET", "/failsoft/config", None),
            ("POST", "/failsoft/workers/gpu/stop", {}),
            ("POST", "/failsoft/jobs/approve-all", {}),
            ("GET", "/failsoft/jobs", None),
        ):
            refused = httpx.request(method, svc.base_url + path, json=body, headers=headers, timeout=10)
            assert refused.status_code == 401, (method, path, refused.text)
            assert refused.json()["error"]["code"] == "admin_token_required"
    assert svc.config_path.read_bytes() == before
    assert svc.status()["workers"]["gpu"]["state"] == "ready"  # nothing was stopped
    for view in ("/failsoft/status", "/failsoft/timing"):
        assert httpx.get(svc.base_url + view, timeout=10).status_code == 200, view


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"engine": {"llama_server": "/tmp/evil"}}, "engine.*"),
        ({"model": {"path": "/tmp/other.gguf"}}, "model.path"),
        ({"model": {"chat_format": "/tmp/template.jinja"}}, "model.chat_format"),
        ({"models": [{"name": "x", "path": "/tmp/x.gguf"}]}, "models"),
        ({"library": {"folder": "/tmp"}}, "library.folder"),
        ({"embeddings": {"model": "/tmp/e.gguf"}}, "embeddings.model"),
        ({"server": {"host": "0.0.0.0"}}, "server.host"),
        ({"server": {"api_key": "mine"}}, "server.api_key"),
    ],
)
def test_programs_files_and_exposure_are_set_in_the_file_only(
    svc: ServiceHandle, changes: dict[str, Any], named: str
) -> None:
    """Even with the admin token: what the service would run or read, and what exposes it, is the user's
    to write in the file."""
    before = svc.config_path.read_bytes()
    refused = httpx.patch(
        svc.base_url + "/failsoft/config", json={"changes": changes}, headers=svc.headers(), timeout=10
    )
    assert refused.status_code == 403, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("file_only_setting", named)
    assert named in error["message"]
    assert svc.config_path.read_bytes() == before


def test_the_routers_slots_follow_a_new_concurrency_after_restart(tmp_path: Path) -> None:
    """Review N4: `PATCH {"budget": {"n_parallel": 1}, "restart": true}` (the tray's "Restart workers now")
    restarted the workers with `--parallel 1` while the router kept 4 slots for them."""
    for handle in fake_service(tmp_path / "service"):
        assert handle.status()["workers"]["gpu"]["slots"] == 4
        changed = httpx.patch(
            handle.base_url + "/failsoft/config",
            json={"changes": {"budget": {"n_parallel": 1}}, "restart": True},
            headers=handle.headers(),
            timeout=120,
        )
        assert changed.status_code == 200 and changed.json()["restarted"], changed.text
        status = handle.wait_workers_ready()
        assert status["plan"]["n_parallel"] == 1
        assert status["workers"]["gpu"]["slots"] == 1 == status["workers"]["gpu"]["profile"]["n_parallel"]


def test_a_job_is_read_back_by_its_creator_only(svc: ServiceHandle) -> None:
    """Issue 36, per-job read access: the event stream and the logs name every job, and anyone who learnt
    an id could read its answer or cancel it. Now that takes the read token its creation answered with."""
    created = httpx.post(svc.v1 + "/jobs", json={**CHAT, "max_tokens": 300}, timeout=10)
    assert created.status_code == 202, created.text
    job_id, token = created.json()["id"], created.json()["read_token"]
    assert created.headers["x-failsoft-job-token"] == token and len(token) == 32
    url = f"{svc.base_url}/v1/jobs/{job_id}"
    for headers in ({}, {"X-Failsoft-Job-Token": "0" * 32}, {"X-Failsoft-Job-Token": "é".encode()}):
        assert httpx.get(url, headers=headers, timeout=10).status_code == 404
        assert httpx.delete(url, headers=headers, timeout=10).status_code == 404
    assert httpx.get(url, headers={"X-Failsoft-Job-Token": token}, timeout=10).json()["id"] == job_id
    assert httpx.get(url, headers=svc.headers(), timeout=10).status_code == 200  # the owner's tray
    cancelled = httpx.delete(url, headers={"X-Failsoft-Job-Token": token}, timeout=10)
    assert cancelled.json()["state"] in ("cancelled", "completed")
    answered = client_for(svc).chat.completions.with_raw_response.create(**CHAT)
    assert len(answered.headers["x-failsoft-job-token"]) == 32  # a plain request's creator gets one too
