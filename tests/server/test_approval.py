"""The approval queue: a CPU run estimated slower than the client's deadline waits for the user's decision."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.helpers import (
    arm,
    base_settings,
    client_for,
    failsoft_of,
    job_state,
    reload_settings,
    seeded_chat,
    stop_gpu_worker,
    wait_replaced,
    wait_until,
)
from tests.support.service import ServiceHandle, module_service

pytestmark = pytest.mark.integration

# The CPU is taken to make 1 token per second: 40 tokens are estimated at 40 s, past a 30 s deadline.
SETTINGS = base_settings(failover={"cpu_tokens_per_second": 1.0})
REQUEST = seeded_chat(max_tokens=40, seed=5)


svc = module_service(enable_faults=True, settings=SETTINGS)


def _awaiting(svc: ServiceHandle) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = httpx.get(
        svc.base_url + "/failsoft/jobs",
        params={"state": "awaiting_approval"},
        timeout=10,
        headers=svc.headers(),
    ).json()["data"]
    return data


def _ask_in_background(client: openai.OpenAI, deadline: str) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def ask() -> None:
        try:
            outcome["answer"] = client.chat.completions.create(
                **REQUEST, extra_headers={"X-Failsoft-Deadline": deadline}
            )
        except openai.APIStatusError as error:
            outcome["error"] = error

    thread = threading.Thread(target=ask)
    thread.start()
    return thread, outcome


def test_approved_job_runs_on_the_cpu_while_the_client_waits(svc: ServiceHandle) -> None:
    armed = arm(svc, "abort", after_tokens=2)
    thread, outcome = _ask_in_background(client_for(svc), deadline="30")
    pending = wait_until(lambda: _awaiting(svc), what="a job awaiting approval")
    assert pending[0]["estimated_seconds"] >= 40
    assert svc.status()["approvals"]["pending"] == 1
    approved = httpx.post(
        f"{svc.base_url}/failsoft/jobs/{pending[0]['id']}/approve", timeout=10, headers=svc.headers()
    )
    assert approved.status_code == 200
    thread.join(180)
    info = failsoft_of(outcome["answer"])
    assert (info["job_id"], info["worker"], info["attempts"]) == (pending[0]["id"], "cpu", 2)
    assert info["fallback_reason"] == "crash_abort"
    # Approving twice is refused: the job is no longer waiting.
    assert (
        httpx.post(
            f"{svc.base_url}/failsoft/jobs/{info['job_id']}/approve", timeout=10, headers=svc.headers()
        ).status_code
        == 409
    )
    wait_replaced(svc, armed["pid"])


def test_rejected_job_ends_with_a_reason(svc: ServiceHandle) -> None:
    armed = arm(svc, "abort", after_tokens=2)
    thread, outcome = _ask_in_background(client_for(svc), deadline="30")
    pending = wait_until(lambda: _awaiting(svc), what="a job awaiting approval")
    assert (
        httpx.post(
            f"{svc.base_url}/failsoft/jobs/{pending[0]['id']}/reject", timeout=10, headers=svc.headers()
        ).status_code
        == 200
    )
    thread.join(60)
    error = outcome["error"]
    assert error.status_code == 503 and error.code == "rejected"
    assert job_state(svc, pending[0]["id"])["state"] == "rejected"
    wait_replaced(svc, armed["pid"])


def test_past_its_deadline_the_client_gets_503_and_collects_the_result_later(
    svc: ServiceHandle, model_path: Path
) -> None:
    armed = arm(svc, "abort", after_tokens=2)
    with pytest.raises(openai.InternalServerError) as raised:
        client_for(svc).chat.completions.create(**REQUEST, extra_headers={"X-Failsoft-Deadline": "3"})
    error = raised.value
    assert error.status_code == 503 and error.code == "cpu_too_slow"
    assert int(error.response.headers["retry-after"]) >= 1
    body = error.body
    assert isinstance(body, dict)
    job_id = body["job_id"]
    assert job_state(svc, job_id)["state"] == "awaiting_approval"
    approved = httpx.post(
        f"{svc.base_url}/failsoft/jobs/approve-all", timeout=10, headers=svc.headers()
    ).json()["approved"]
    assert job_id in approved
    done = wait_until(
        lambda: (s := job_state(svc, job_id))["state"] == "completed" and s, what="approved job"
    )
    assert done["result"]["choices"][0]["message"]["content"]
    failsoft = dict(done["result"]["failsoft"])
    assert isinstance(failsoft.pop("cpu_cached_tokens"), int)  # llama-server's cache_n at the CPU attempt
    assert failsoft == {
        "job_id": job_id,
        "worker": "cpu",
        "attempts": 2,
        "fallback_reason": "crash_abort",
        "model": model_path.name,  # the model that answered, on the device that answered
        "device": "cpu",
        "route": "cpu",
        "stand_in_for": None,
    }
    wait_replaced(svc, armed["pid"])


def test_auto_approve_rule_runs_short_cpu_jobs_without_asking(svc: ServiceHandle) -> None:
    reload_settings(svc, base_settings(failover={"cpu_tokens_per_second": 1.0, "auto_approve_seconds": 120}))
    try:
        armed = arm(svc, "abort", after_tokens=2)
        completion = client_for(svc).chat.completions.create(
            **REQUEST, extra_headers={"X-Failsoft-Deadline": "3"}
        )
        assert failsoft_of(completion)["worker"] == "cpu"
        assert not _awaiting(svc)
        wait_replaced(svc, armed["pid"])
    finally:
        reload_settings(svc, SETTINGS)


def test_approval_policy_asks_for_every_cpu_run(svc: ServiceHandle) -> None:
    reload_settings(svc, base_settings(failover={"cpu_tokens_per_second": 1000.0, "fallback": "approval"}))
    try:
        armed = arm(svc, "abort", after_tokens=2)
        with pytest.raises(openai.InternalServerError) as raised:
            client_for(svc).chat.completions.create(**REQUEST, extra_headers={"X-Failsoft-Deadline": "2"})
        assert raised.value.code == "approval_required"
        job_id = raised.value.body["job_id"]  # type: ignore[index]
        assert [job["id"] for job in _awaiting(svc)] == [job_id]
        httpx.post(f"{svc.base_url}/failsoft/jobs/{job_id}/reject", timeout=10, headers=svc.headers())
        wait_replaced(svc, armed["pid"])
    finally:
        reload_settings(svc, SETTINGS)


def test_the_approval_backlog_is_bounded_and_refusals_say_why(svc: ServiceHandle) -> None:
    """Issue 14: the approval backlog had no limit. With the GPU worker stopped every request needs an
    approved CPU run; beyond `failover.max_pending_approvals` the next one is refused at once, and a
    rejection makes room again."""
    reload_settings(svc, base_settings(failover={"cpu_tokens_per_second": 1.0, "max_pending_approvals": 2}))
    client = client_for(svc)
    stop_gpu_worker(svc)
    try:
        waiting = []
        for _ in range(2):
            with pytest.raises(openai.InternalServerError) as raised:
                client.chat.completions.create(**REQUEST, extra_headers={"X-Failsoft-Deadline": "1"})
            assert raised.value.code == "cpu_too_slow"  # the client stops waiting; the job stays pending
            waiting.append(raised.value.body["job_id"])  # type: ignore[index]
        assert sorted(job["id"] for job in _awaiting(svc)) == sorted(waiting)
        with pytest.raises(openai.InternalServerError) as full:
            client.chat.completions.create(**REQUEST, extra_headers={"X-Failsoft-Deadline": "1"})
        assert full.value.code == "approval_backlog_full"
        assert "max_pending_approvals" in full.value.message
        refused = full.value.body["job_id"]  # type: ignore[index]
        assert job_state(svc, refused)["state"] == "failed"  # ended with its reason, not left pending
        background = httpx.post(f"{svc.base_url}/v1/jobs", json={**REQUEST, "max_tokens": 300}, timeout=10)
        assert background.status_code == 202  # a background job has all the time it needs: no approval
        httpx.delete(f"{svc.base_url}/v1/jobs/{background.json()['id']}", timeout=10, headers=svc.headers())
        httpx.post(f"{svc.base_url}/failsoft/jobs/{waiting[0]}/reject", timeout=10, headers=svc.headers())
        with pytest.raises(openai.InternalServerError) as again:
            client.chat.completions.create(**REQUEST, extra_headers={"X-Failsoft-Deadline": "1"})
        assert again.value.code == "cpu_too_slow"  # room again: it waits for approval
        for job in _awaiting(svc):
            httpx.post(f"{svc.base_url}/failsoft/jobs/{job['id']}/reject", timeout=10, headers=svc.headers())
    finally:
        httpx.post(f"{svc.base_url}/failsoft/workers/gpu/start", timeout=120, headers=svc.headers())
        reload_settings(svc, SETTINGS)
        svc.wait_workers_ready()


def test_a_stream_awaiting_approval_is_kept_alive_until_it_is_answered(svc: ServiceHandle) -> None:
    reload_settings(
        svc, base_settings(failover={"cpu_tokens_per_second": 1.0}, server={"keepalive_seconds": 0.5})
    )
    try:
        armed = arm(svc, "abort", after_tokens=0)
        lines: list[str] = []
        body = {**REQUEST, "stream": True}
        headers = {"X-Failsoft-Deadline": "30"}  # the CPU is estimated at 40 s: past it
        with httpx.stream(
            "POST", svc.v1 + "/chat/completions", json=body, headers=headers, timeout=30
        ) as answer:
            # Keep-alive comments while the job awaits approval: a proxy with a short read timeout still
            # sees bytes. Those sent while the failure is still being decided (the crash classified, the
            # CPU estimated: longer on a busy machine) do not count.
            while_awaiting = 0
            for line in filter(None, answer.iter_lines()):
                lines.append(line)
                if line != ": keepalive" or while_awaiting == 2:
                    continue
                pending = _awaiting(svc)
                if not pending:
                    continue
                assert len(pending) == 1
                while_awaiting += 1
                if while_awaiting == 2:
                    approve = f"{svc.base_url}/failsoft/jobs/{pending[0]['id']}/approve"
                    assert httpx.post(approve, timeout=10, headers=svc.headers()).status_code == 200
        assert while_awaiting == 2
        assert lines[-1] == "data: [DONE]" and any('"content"' in line for line in lines)
        wait_replaced(svc, armed["pid"])
    finally:
        reload_settings(svc, SETTINGS)


def test_an_approved_job_runs_to_its_end_after_its_client_left(svc: ServiceHandle) -> None:
    """A job put in the user's hands is theirs: its streaming client leaving after the approval cancels
    nothing, and the answer is kept for GET /v1/jobs/{id} (the review's finding: it was cancelled)."""
    armed = arm(svc, "abort", after_tokens=0)
    body = {**REQUEST, "stream": True}
    headers = {"X-Failsoft-Deadline": "60"}  # the CPU is estimated at 40 s: within it, yet approval is asked
    reload_settings(svc, base_settings(failover={"cpu_tokens_per_second": 1.0, "fallback": "approval"}))
    try:
        with httpx.stream("POST", svc.v1 + "/chat/completions", json=body, headers=headers, timeout=60):
            pending = wait_until(lambda: _awaiting(svc), what="the job in the user's hands")
            job_id = pending[0]["id"]
            approved = httpx.post(
                f"{svc.base_url}/failsoft/jobs/{job_id}/approve", timeout=10, headers=svc.headers()
            )
            assert approved.status_code == 200
        # The client closed its stream right after the approval, long before the CPU's answer.
        done = wait_until(
            lambda: (j := job_state(svc, job_id))["state"] in ("completed", "cancelled", "failed") and j,
            180,
            "the approved job to end",
        )
        assert done["state"] == "completed" and done["worker"] == "cpu", done
        assert done["result"]["choices"][0]["message"]["content"]
        wait_replaced(svc, armed["pid"])
    finally:
        reload_settings(svc, SETTINGS)
