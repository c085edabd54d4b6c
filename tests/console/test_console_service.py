"""`failsoft status`, `approvals`, `approve` and `reject` against a real `failsoft serve`: what a headless
home server's owner sees and decides from a terminal, with the same effect as the tray's buttons."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.helpers import CHAT, base_settings, client_for, job_state, wait_until
from tests.support.helpers import run_failsoft as failsoft
from tests.support.service import ServiceHandle, running_service, write_config
from tray_app.contract.sizes import format_size

pytestmark = pytest.mark.integration

# The CPU is taken to make 1 token per second: 40 tokens are estimated at 40 s, past a 1 s deadline.
SETTINGS = base_settings(failover={"cpu_tokens_per_second": 1.0})
REQUEST: dict[str, Any] = {"model": "default", "messages": CHAT, "max_tokens": 40, "temperature": 0}


@pytest.fixture(scope="module")
def svc(module_root: Path) -> Iterator[ServiceHandle]:
    with running_service(module_root, settings=SETTINGS) as handle:
        yield handle


def test_status_shows_the_device_budget_and_workers_as_the_service_has_them(svc: ServiceHandle) -> None:
    status = svc.status()
    shown = failsoft(svc.config_path, "status", "--url", svc.base_url)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "GPU: simulated GPU, 4.00 GiB [SIMULATED]" in text
    assert (
        f"engine: llama-server {status['engine']['version']} (llama.cpp {status['engine']['commit']})" in text
    )
    weights = next(line for line in text.splitlines() if line.strip().startswith("Weights"))
    assert weights.endswith(format_size(status["plan"]["weights_bytes"]))
    for role in ("gpu", "cpu"):
        worker = status["workers"][role]
        assert f"{role.upper()} worker: ready · 0/{worker['slots']} slots busy · pid {worker['pid']}" in text
    assert "0 awaiting approval" in text
    as_json = failsoft(svc.config_path, "status", "--url", svc.base_url, "--json")
    assert json.loads(as_json.stdout)["workers"]["gpu"]["pid"] == status["workers"]["gpu"]["pid"]


def _waiting_job(svc: ServiceHandle) -> str:
    """A chat the client gives up on after 1 s: with the GPU worker stopped its job waits for approval."""
    with pytest.raises(openai.InternalServerError) as raised:
        client_for(svc).chat.completions.create(**REQUEST, extra_headers={"X-Failsoft-Deadline": "1"})
    assert raised.value.code == "cpu_too_slow"
    job_id: str = raised.value.body["job_id"]  # type: ignore[index]
    return job_id


def _completed_on_the_cpu(svc: ServiceHandle, job_id: str) -> dict[str, Any]:
    job = wait_until(lambda: (j := job_state(svc, job_id))["state"] == "completed" and j, what=job_id)
    assert job["worker"] == "cpu" and job["result"]["choices"][0]["message"]["content"]
    return dict(job)


def test_waiting_jobs_are_listed_approved_and_rejected_from_a_terminal(svc: ServiceHandle) -> None:
    config, url = svc.config_path, svc.base_url
    assert failsoft(config, "approvals", "--url", url).stdout.strip() == "No job waits for approval."
    stopped = httpx.post(f"{url}/failsoft/workers/gpu/stop", headers=svc.headers(), timeout=60)
    assert stopped.status_code == 200, stopped.text
    try:
        first, second, third = (_waiting_job(svc) for _ in range(3))
        listed = failsoft(config, "approvals", "--url", url).stdout
        assert listed.startswith("3 jobs wait for approval")
        for job_id in (first, second, third):
            assert f"  {job_id}  waiting " in listed
        assert "on the CPU in about" in listed
        assert "3 awaiting approval" in failsoft(config, "status", "--url", url).stdout

        approved = failsoft(config, "approve", first, "--url", url)
        assert approved.returncode == 0, approved.stderr
        assert approved.stdout.startswith(f"{first}: approved for the CPU")
        _completed_on_the_cpu(svc, first)

        rejected = failsoft(config, "reject", second, "--url", url)
        assert rejected.returncode == 0, rejected.stderr
        assert job_state(svc, second)["state"] == "rejected"
        again = failsoft(config, "approve", second, "--url", url)
        assert again.returncode == 1
        assert again.stderr.strip() == f"failsoft approve: job {second} is rejected, not awaiting approval"

        everything = failsoft(config, "approve", "--all", "--url", url)
        assert everything.returncode == 0, everything.stderr
        assert everything.stdout.splitlines() == ["approved 1 job", f"  {third}"]
        _completed_on_the_cpu(svc, third)
        assert failsoft(config, "approvals", "--url", url).stdout.strip() == "No job waits for approval."
    finally:
        httpx.post(f"{url}/failsoft/workers/gpu/start", headers=svc.headers(), timeout=120)
        svc.wait_workers_ready()


def test_a_worker_is_restarted_stopped_and_started_from_a_terminal(svc: ServiceHandle) -> None:
    config, url = svc.config_path, svc.base_url
    before = svc.status()["workers"]["gpu"]
    restarted = failsoft(config, "worker", "restart", "gpu", "--url", url)
    assert restarted.returncode == 0, restarted.stderr
    after = svc.status()["workers"]["gpu"]
    assert after["pid"] != before["pid"] and after["restarts"] == before["restarts"] + 1
    assert restarted.stdout.startswith(
        f"GPU worker: ready · 0/{after['slots']} slots busy · pid {after['pid']}"
    )
    try:
        stopped = failsoft(config, "worker", "stop", "gpu", "--url", url)
        assert stopped.stdout.startswith("GPU worker: stopped")  # no pid, no slots
        assert svc.status()["workers"]["gpu"]["pid"] is None
    finally:
        started = failsoft(config, "worker", "start", "gpu", "--url", url)
    assert started.returncode == 0 and started.stdout.startswith("GPU worker: ready")
    unknown = failsoft(config, "worker", "restart", "gpu2", "--url", url)
    assert unknown.returncode == 1
    assert "unknown worker 'gpu2'; workers are gpu, cpu" in unknown.stderr


def test_the_key_comes_from_the_environment_or_the_config(tmp_path: Path) -> None:
    settings = base_settings(server={"api_key": "s3cret"})
    keyless = tmp_path / "keyless.toml"
    write_config(keyless, {})
    with running_service(tmp_path / "service", settings=settings) as svc:
        refused = failsoft(keyless, "status", "--url", svc.base_url)
        assert refused.returncode == 1
        assert "wants an API key: set FAILSOFT_API_KEY, or [server] api_key in the config" in refused.stderr
        wrong = failsoft(keyless, "status", "--url", svc.base_url, env={"FAILSOFT_API_KEY": "wrong"})
        assert wrong.returncode == 1
        from_environment = failsoft(
            keyless, "status", "--url", svc.base_url, env={"FAILSOFT_API_KEY": "s3cret"}
        )
        assert from_environment.returncode == 0, from_environment.stderr
        from_config = failsoft(svc.config_path, "approvals", "--url", svc.base_url)
        assert (from_config.returncode, from_config.stdout.strip()) == (0, "No job waits for approval.")
