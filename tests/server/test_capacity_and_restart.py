"""Admission limits (a full queue, a request beyond the GPU profile) and a restart resuming accepted work."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.helpers import (
    CHAT,
    COUNTING,
    base_settings,
    client_for,
    failsoft_of,
    job_state,
    reload_settings,
    wait_until,
)
from tests.support.service import ServiceHandle, module_service, running_service

pytestmark = pytest.mark.integration

# A small GPU profile (512 tokens per sequence) next to a larger CPU one, and room for one waiting request.
# The CPU speed is fixed so the routing does not depend on how busy the test machine is.
SETTINGS = base_settings(
    server={"queue_max": 1},
    # One slot per worker: the queue and the routing by context are what these tests are about.
    budget={"max_ctx": 512, "n_parallel": 1},
    cpu={"max_ctx": 2048, "n_parallel": 1},
    failover={"cpu_tokens_per_second": 1000.0},
)
LONG_PROMPT = [{"role": "user", "content": "Repeat these words: " + "ocean wave tide " * 200}]


svc = module_service(settings=SETTINGS)


def test_a_full_queue_answers_429_with_retry_after(svc: ServiceHandle) -> None:
    client = client_for(svc)
    answers: list[Any] = []

    def ask() -> None:
        answers.append(client.completions.create(**COUNTING, max_tokens=150))  # type: ignore[call-overload]

    threads = [threading.Thread(target=ask) for _ in range(2)]
    threads[0].start()
    wait_until(lambda: svc.status()["workers"]["gpu"]["in_flight"] == 1, what="the first request to run")
    threads[1].start()
    wait_until(lambda: svc.status()["queue"]["depth"] == 1, what="the second request to wait")
    with pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(model="default", messages=CHAT, max_tokens=5)
    assert raised.value.code == "queue_full"
    assert int(raised.value.response.headers["retry-after"]) >= 1
    for thread in threads:
        thread.join(120)
    assert len(answers) == 2  # the accepted ones were all answered


def test_a_request_beyond_the_gpu_profile_is_routed_to_the_cpu(svc: ServiceHandle) -> None:
    status = svc.status()
    assert status["caps"]["n_ctx_per_seq"] == 512 and status["caps"]["cpu_n_ctx"] == 2048
    raw = client_for(svc).chat.completions.with_raw_response.create(
        model="default", messages=LONG_PROMPT, max_tokens=4
    )
    info = failsoft_of(raw.parse())
    assert (info["worker"], info["attempts"], info["fallback_reason"]) == ("cpu", 1, "exceeds_gpu_profile")
    assert raw.headers["x-failsoft-worker"] == "cpu"


def test_with_fallback_never_a_too_long_request_says_which_limit(svc: ServiceHandle) -> None:
    reload_settings(svc, {**SETTINGS, "failover": {**SETTINGS["failover"], "fallback": "never"}})
    try:
        with pytest.raises(openai.BadRequestError) as raised:
            client_for(svc).chat.completions.create(model="default", messages=LONG_PROMPT, max_tokens=4)
        assert raised.value.code == "context_length_exceeded"
        assert "512" in raised.value.message
    finally:
        reload_settings(svc, SETTINGS)


def test_config_reload_reports_what_needs_a_restart(svc: ServiceHandle) -> None:
    answer = reload_settings(
        svc, {**SETTINGS, "budget": {"max_ctx": 1024}, "failover": {**SETTINGS["failover"], "deadline": 30.0}}
    )
    try:
        assert "budget.max_ctx" in answer["needs_restart"]
        assert "failover.deadline" in answer["applied"]
        assert svc.status()["policy"]["deadline"] == 30.0
    finally:
        reload_settings(svc, SETTINGS)


def test_a_background_job_survives_a_restart_of_the_service(tmp_path: Path) -> None:
    data_dir = tmp_path / "shared-data"
    with running_service(tmp_path / "first", settings=SETTINGS, data_dir=data_dir) as first:
        response = httpx.post(
            first.base_url + "/v1/jobs",
            json={**COUNTING, "max_tokens": 400, "seed": 9},
            timeout=30,
        )
        assert response.status_code == 202
        job_id = response.json()["id"]
        wait_until(lambda: job_state(first, job_id)["state"] == "running", what="the job to start")
    # The first service is gone (SIGTERM) with the job unfinished; a new one on the same journal resumes it.
    started = time.monotonic()
    with running_service(tmp_path / "second", settings=SETTINGS, data_dir=data_dir) as second:
        done = wait_until(
            lambda: (s := job_state(second, job_id))["state"] == "completed" and s,
            timeout=180,
            what="resumed job",
        )
        print(f"resumed job completed {time.monotonic() - started:.1f}s after the second start")
        assert done["result"]["choices"][0]["text"]
        assert done["attempts"] >= 2  # the interrupted attempt and the one that finished it
        assert done["result"]["failsoft"]["job_id"] == job_id


def test_config_reload_with_restart_replans_and_restarts_the_workers(tmp_path: Path) -> None:
    with running_service(tmp_path / "svc", settings=SETTINGS) as service:
        before = service.status()
        assert before["caps"]["n_ctx"] == 512
        answer = reload_settings(service, {**SETTINGS, "budget": {"max_ctx": 1024}}, restart=True)
        assert answer["restarted"] is True
        assert answer["needs_restart"] == []
        after = service.wait_workers_ready()
        assert after["caps"]["n_ctx"] == 1024
        assert after["workers"]["gpu"]["health"]["n_ctx"] == 1024
        assert after["workers"]["gpu"]["pid"] != before["workers"]["gpu"]["pid"]
        assert after["workers"]["cpu"]["pid"] != before["workers"]["cpu"]["pid"]
        reply = client_for(service).chat.completions.create(model="default", messages=CHAT, max_tokens=4)
        assert failsoft_of(reply)["worker"] == "gpu"
