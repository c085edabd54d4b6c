"""Two real services on two ports, each on its own simulated GPU: B is A's peer ([[peers]]). A's GPU taken
or failed sends the job to B's GPU before A's CPU, under the same identity, told in the answer; B killed
mid-stream leaves A's CPU to finish the answer, whole and once; a background job runs once on B."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.helpers import (
    base_settings,
    client_for,
    failsoft_of,
    seeded_chat,
    stop_gpu_worker,
    wait_until,
)
from tests.support.service import ServiceHandle, running_service

pytestmark = pytest.mark.integration

PEER_KEY = "peer-key-of-box-b"
REQUEST = seeded_chat(max_tokens=24, seed=7)
# Long enough that B is still answering when the test kills it.
LONG = seeded_chat(max_tokens=400, seed=7)


def peer_settings(url: str) -> dict[str, Any]:
    peers = [{"name": "box-b", "url": url, "api_key": PEER_KEY}]
    return {**base_settings(failover={"auto_approve_seconds": 3600}), "peers": peers}


@pytest.fixture(scope="module")
def box_b(module_root: Path) -> Iterator[ServiceHandle]:
    settings = base_settings(server={"api_key": PEER_KEY})
    with running_service(module_root / "b", settings=settings) as handle:
        yield handle


@pytest.fixture(scope="module")
def box_a(module_root: Path, box_b: ServiceHandle) -> Iterator[ServiceHandle]:
    with running_service(module_root / "a", settings=peer_settings(box_b.base_url), enable_faults=True) as a:
        wait_until(lambda: peer_state(a) == "ready", 30, "A's probe finds B ready")
        yield a


def peer_state(svc: ServiceHandle) -> str | None:
    peers = svc.status().get("peers") or []
    return peers[0]["state"] if peers else None


def jobs_of(svc: ServiceHandle) -> list[dict[str, Any]]:
    response = httpx.get(svc.base_url + "/failsoft/jobs", headers=svc.headers(), timeout=10)
    response.raise_for_status()
    data: list[dict[str, Any]] = response.json()["data"]
    return data


def test_the_peer_answers_while_this_gpu_is_taken(box_a: ServiceHandle, box_b: ServiceHandle) -> None:
    before = {job["id"] for job in jobs_of(box_b)}
    stop_gpu_worker(box_a)
    try:
        client = client_for(box_a)
        raw = client.chat.completions.with_raw_response.create(
            **REQUEST, extra_headers={"X-Request-Id": "req-p1"}
        )
        completion = raw.parse()
    finally:
        httpx.post(box_a.base_url + "/failsoft/workers/gpu/start", headers=box_a.headers(), timeout=120)
    failsoft = failsoft_of(completion)
    assert (failsoft["route"], failsoft["peer"], failsoft["worker"]) == ("peer", "box-b", "peer:box-b")
    assert failsoft["fallback_reason"] == "gpu_unavailable"
    assert completion.choices[0].message.content
    assert raw.headers["x-request-id"] == "req-p1"
    ran_on_b = [job for job in jobs_of(box_b) if job["id"] not in before]
    assert [job["request_id"] for job in ran_on_b] == ["req-p1"]  # B ran it once, under the same identity
    assert ran_on_b[0]["worker"] == "gpu"  # B's GPU: the peer tier is another GPU


def test_a_gpu_killed_mid_stream_continues_on_the_peer(box_a: ServiceHandle) -> None:
    reference = client_for(box_a).chat.completions.create(**REQUEST).choices[0].message.content
    arm_fault(box_a, "kill", after_tokens=4)
    stream = client_for(box_a).chat.completions.create(**REQUEST, stream=True)
    chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    last = chunks[-1].model_extra["failsoft"]
    assert (last["route"], last["peer"]) == ("peer", "box-b")
    assert text == reference  # whole: what the GPU said before it died, then the peer's continuation


def test_the_peer_killed_mid_stream_leaves_this_cpu_to_finish_once(tmp_path: Path) -> None:
    b_settings = base_settings(server={"api_key": PEER_KEY})
    with (
        running_service(tmp_path / "b", settings=b_settings) as b,
        running_service(tmp_path / "a", settings=peer_settings(b.base_url)) as a,
    ):
        wait_until(lambda: peer_state(a) == "ready", 30, "A's probe finds B ready")
        stop_gpu_worker(a)
        stream = client_for(a).chat.completions.create(**LONG, stream=True)
        pieces: list[str] = []
        last: dict[str, Any] = {}
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
                if len(pieces) == 3:
                    os.kill(b.process.pid, signal.SIGKILL)  # B, mid-answer: its connection drops
            last = (chunk.model_extra or {}).get("failsoft") or last
        assert last["route"] == "cpu" and last["worker"] == "cpu"
        assert last["attempts"] == 2  # the peer's, cut off, then the CPU's: no third run
        assert len("".join(pieces)) > len("".join(pieces[:3]))
        wait_until(lambda: peer_state(a) == "down", 30, "A marks B down")


def test_a_background_job_runs_once_on_the_peer(box_a: ServiceHandle, box_b: ServiceHandle) -> None:
    before = {job["id"] for job in jobs_of(box_b)}
    stop_gpu_worker(box_a)
    try:
        headers = {**box_a.headers(), "Idempotency-Key": "nightly-summary-1"}
        body = {"kind": "chat", **REQUEST}
        created = httpx.post(box_a.base_url + "/v1/jobs", json=body, headers=headers, timeout=30)
        assert created.status_code == 202, created.text
        job_id, token = created.json()["id"], created.json()["read_token"]

        def finished() -> dict[str, Any] | None:
            got = httpx.get(
                f"{box_a.base_url}/v1/jobs/{job_id}", headers={"X-Failsoft-Job-Token": token}, timeout=10
            ).json()
            return got if got["state"] in ("completed", "failed") else None

        job = wait_until(finished, 120, "the background job ends")
    finally:
        httpx.post(box_a.base_url + "/failsoft/workers/gpu/start", headers=box_a.headers(), timeout=120)
    assert job["state"] == "completed" and job["result"]["failsoft"]["peer"] == "box-b"
    on_b = [j for j in jobs_of(box_b) if j["id"] not in before]
    assert len(on_b) == 1 and on_b[0]["state"] == "completed"


def arm_fault(svc: ServiceHandle, kind: str, after_tokens: int) -> None:
    def armed() -> bool:
        response = httpx.post(
            svc.base_url + "/failsoft/debug/faults",
            json={"kind": kind, "after_tokens": after_tokens, "role": "gpu"},
            headers=svc.headers(),
            timeout=10,
        )
        return response.status_code == 200

    wait_until(armed, 60, "the GPU worker takes the fault")
