"""Binding beyond loopback needs an API key; with a key every route wants it. And the in-process service
(what the tray runs) starts, answers and stops without leaving a worker behind."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import anthropic
import httpx
import openai
import psutil
import pytest

from tests.support.helpers import CHAT, base_settings, client_for, failsoft_of
from tests.support.service import running_service, write_config
from tray_app import config
from tray_app.host.thread import ServiceThread

pytestmark = pytest.mark.integration


def test_binding_beyond_loopback_without_a_key_is_refused(isolated_dirs: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tray_app", "serve", "--host", "0.0.0.0", "--simulate-vram", "4GiB"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "server.api_key" in result.stderr


def test_with_an_api_key_requests_need_it(tmp_path: Path) -> None:
    settings = base_settings(server={"api_key": "s3cret"})
    with running_service(tmp_path, settings=settings) as svc:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            response = httpx.get(svc.base_url + "/failsoft/status", headers=headers, timeout=10)
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "invalid_api_key"
        # As llama-server's, the health check is open to monitors without the key: it tells only states.
        health = httpx.get(svc.base_url + "/health", timeout=10)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=svc.v1, api_key="wrong", max_retries=0).models.list()
        completion = client_for(svc).chat.completions.create(model="default", messages=CHAT, max_tokens=2)
        assert failsoft_of(completion)["worker"] == "gpu"
        # Anthropic's clients send the key as x-api-key, and are refused in their API's shape.
        wrong = anthropic.Anthropic(base_url=svc.base_url, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as refused:
            wrong.messages.create(model="default", messages=CHAT, max_tokens=2)  # type: ignore[arg-type]
        assert refused.value.body == {
            "type": "error",
            "error": {"type": "authentication_error", "message": refused.value.body["error"]["message"]},  # type: ignore[index]
        }
        right = anthropic.Anthropic(base_url=svc.base_url, api_key="s3cret", max_retries=0, timeout=60)
        message = right.messages.create(model="default", messages=CHAT, max_tokens=2)  # type: ignore[arg-type]
        assert (message.model_extra or {})["failsoft"]["worker"] == "gpu"


def test_the_in_process_service_starts_answers_and_stops_cleanly(isolated_dirs: Path) -> None:
    write_config(isolated_dirs / "config.toml", base_settings(device={"simulate_vram": "4GiB"}))
    runner = ServiceThread(config.load(), port=0)
    base_url = runner.start()
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 120
        health = httpx.get(base_url + "/health", timeout=10)
        while health.status_code != 200 and time.monotonic() < deadline:
            # Until a worker can answer: llama-server's own "Loading model".
            assert health.status_code == 503
            assert health.json()["error"] == {
                "code": 503,
                "message": "Loading model",
                "type": "unavailable_error",
            }
            time.sleep(0.1)
            health = httpx.get(base_url + "/health", timeout=10)
        assert health.json()["status"] == "ok"
        while time.monotonic() < deadline:
            workers = httpx.get(base_url + "/failsoft/status", timeout=10).json()["workers"]
            if all(workers[role]["state"] == "ready" for role in ("gpu", "cpu")):
                pids = [workers[role]["pid"] for role in ("gpu", "cpu")]
                break
            time.sleep(0.1)
        assert len(pids) == 2
        answer = httpx.post(
            base_url + "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2}, timeout=60
        )
        assert answer.status_code == 200 and answer.json()["failsoft"]["worker"] == "gpu"
    finally:
        runner.stop()
    _gone, alive = psutil.wait_procs(
        [psutil.Process(pid) for pid in pids if psutil.pid_exists(pid)], timeout=15
    )
    assert not alive
