"""Helpers for tests against a real service: request bodies, settings, the openai client, fault arming,
config reloads, the `failsoft` command line and waits (the one polling helper, `wait_until`, is in
tests/support/waits.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai

from tests.support.hog import FAILSOFT
from tests.support.service import ServiceHandle, at_port, write_config
from tests.support.waits import wait_until
from tray_app.reach import admin_token

CHAT = [{"role": "user", "content": "Write one short sentence about the sea."}]
# A completion that runs to max_tokens (counting, end-of-text tokens 0 and 2 banned): for tests that need a
# request still running when they act.
COUNTING: dict[str, object] = {
    "model": "default",
    "prompt": "1, 2, 3, 4, 5, 6, 7,",
    "temperature": 0,
    "logit_bias": {"0": -100, "2": -100},
}

# Fast failure detection for tests: a hung worker is found within about a second.
TEST_SUPERVISOR = {"health_interval": 0.5, "health_timeout": 1.0, "backoff_initial": 0.2, "stable_after": 1.0}


def base_settings(**sections: dict[str, Any]) -> dict[str, Any]:
    settings: dict[str, Any] = {"supervisor": dict(TEST_SUPERVISOR), "server": {"queue_timeout": 60.0}}
    for name, values in sections.items():
        settings.setdefault(name, {}).update(values)
    return settings


def seeded_chat(*, max_tokens: int, seed: int) -> dict[str, Any]:
    """A chat request for CHAT at temperature 0 with a pinned seed: the same answer every time it is asked."""
    return {"model": "default", "messages": CHAT, "max_tokens": max_tokens, "temperature": 0, "seed": seed}


def client_for(svc: ServiceHandle, **options: Any) -> openai.OpenAI:
    options.setdefault("max_retries", 0)
    options.setdefault("timeout", 120)
    return openai.OpenAI(base_url=svc.v1, api_key=svc.api_key or "unused", **options)


def arm(svc: ServiceHandle, kind: str, after_tokens: int = 0, role: str = "gpu") -> dict[str, Any]:
    """Arm a worker fault through the service, once the worker is ready (a previous fault's restart may
    still be under way: 409 until then)."""

    def try_arm() -> httpx.Response | None:
        svc.wait_workers_ready()
        response = httpx.post(
            svc.base_url + "/failsoft/debug/faults",
            json={"kind": kind, "after_tokens": after_tokens, "role": role},
            headers=svc.headers(),
            timeout=10,
        )
        assert response.status_code in (200, 409), response.text
        return response if response.status_code == 200 else None

    response: httpx.Response = wait_until(try_arm, what=f"arming {kind} on the {role} worker")
    data: dict[str, Any] = response.json()
    return data


def stop_gpu_worker(svc: ServiceHandle) -> None:
    """Stop the GPU worker through the service's control API: every request then needs the CPU worker."""
    stopped = httpx.post(f"{svc.base_url}/failsoft/workers/gpu/stop", timeout=60, headers=svc.headers())
    assert stopped.status_code == 200, stopped.text


def wait_replaced(svc: ServiceHandle, old_pid: int, role: str = "gpu") -> dict[str, Any]:
    """Wait until a failed worker has been replaced by a new, ready process."""

    def replaced() -> dict[str, Any] | None:
        status = svc.status()
        worker = status["workers"][role]
        return status if worker["state"] == "ready" and worker["pid"] not in (None, old_pid) else None

    result: dict[str, Any] = wait_until(replaced, what=f"the {role} worker to be replaced")
    return result


def reload_settings(svc: ServiceHandle, settings: dict[str, Any], *, restart: bool = False) -> dict[str, Any]:
    """Rewrite the service's config file (its port kept) and ask it to take over what it can live (or restart
    workers)."""
    write_config(svc.config_path, at_port(settings, svc.port))
    response = httpx.post(
        svc.base_url + "/failsoft/config/reload",
        json={"restart": restart},
        headers=svc.headers(),
        timeout=180 if restart else 10,
    )
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def job_state(svc: ServiceHandle, job_id: str) -> dict[str, Any]:
    response = httpx.get(f"{svc.base_url}/v1/jobs/{job_id}", timeout=10, headers=svc.headers())
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def run_failsoft(
    config: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A `failsoft` command line against a service from tests.support.service, as its owner types it."""
    environment = {name: value for name, value in os.environ.items() if name != "FAILSOFT_API_KEY"}
    # The service's data folder is beside its config (tests.support.service): its admin token is there.
    environment[admin_token.ENV_VARIABLE] = admin_token.read(config.parent / "data" / admin_token.FILE_NAME)
    return subprocess.run(
        [sys.executable, "-m", "tray_app", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**environment, **(env or {})},
    )


def failsoft_status(svc: ServiceHandle) -> subprocess.CompletedProcess[str]:
    """`failsoft status --url` for the service: the installed command, run with no config of the service's."""
    return subprocess.run(
        [FAILSOFT, "status", "--url", svc.base_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def gpu_worker_starts(svc: ServiceHandle) -> list[str]:
    """Each start of the GPU worker, as the supervisor wrote its command line at the top of the log."""
    lines = [
        line
        for path in sorted(Path(svc.log_dir).glob("*gpu*.log"))
        for line in path.read_text(errors="replace").splitlines()
        if "worker started, pid" in line
    ]
    assert lines, f"no GPU worker log with its command line in {sorted(Path(svc.log_dir).iterdir())}"
    return lines


def failsoft_of(obj: Any) -> dict[str, Any]:
    extra = obj.model_extra or {}
    assert "failsoft" in extra, f"no failsoft object in {obj}"
    data: dict[str, Any] = extra["failsoft"]
    return data


@contextmanager
def events_until_completed(
    svc: ServiceHandle, timeout: float = 30
) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """The service's /failsoft/events as (type, data) pairs, from when the listener is connected until a
    job_state "completed" arrives (or `timeout`); the list is complete when the block ends."""
    seen: list[tuple[str, dict[str, Any]]] = []
    connected = threading.Event()

    def listen() -> None:
        with httpx.stream("GET", svc.base_url + "/failsoft/events", timeout=timeout) as response:
            event_type = ""
            for line in response.iter_lines():
                if line.startswith(": connected"):
                    connected.set()
                elif line.startswith("event: "):
                    event_type = line[7:]
                elif line.startswith("data: "):
                    seen.append((event_type, json.loads(line[6:])))
                    if event_type == "job_state" and seen[-1][1]["state"] == "completed":
                        return

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert connected.wait(timeout), "the event stream did not connect"
    yield seen
    thread.join(timeout)
