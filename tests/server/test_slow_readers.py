"""Review N1: a streaming client that stops reading (a paused tab, a dead phone link) held its job and its
router slot for as long as the service ran, once it also went away. Through a real `failsoft serve` on fake
workers that flood each stream, and a raw socket client with a tiny receive buffer that reads nothing."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.fake_worker import fake_llama_server
from tests.support.helpers import base_settings
from tests.support.service import ServiceHandle, running_service
from tests.support.waits import wait_until

# 1,500 tokens of 32 KiB each: far more than the kernel's socket buffers and the server's transport hold.
FLOOD = {"prompt": "Count: 1,", "max_tokens": 1500, "stream": True}


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceHandle]:
    root = tmp_path_factory.mktemp("slow-readers")
    engine = fake_llama_server(root, token_delay=0.001, word_bytes=32768)
    settings = base_settings(engine={"llama_server": str(engine)})
    with running_service(root / "service", settings=settings, ready_timeout=30) as handle:
        yield handle


@contextlib.contextmanager
def non_reader(svc: ServiceHandle, body: dict[str, Any]) -> Iterator[socket.socket]:
    """A client that sends a streamed request, then reads nothing: its receive window stays tiny."""
    port = int(svc.base_url.rsplit(":", 1)[1])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    try:
        sock.connect(("127.0.0.1", port))
        payload = json.dumps(body).encode()
        sock.sendall(
            f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        yield sock
    finally:
        sock.close()


def running_jobs(svc: ServiceHandle) -> list[dict[str, Any]]:
    response = httpx.get(
        svc.base_url + "/failsoft/jobs", params={"state": "running"}, headers=svc.headers(), timeout=10
    )
    data: list[dict[str, Any]] = response.json()["data"]
    return data


def gpu_in_flight(svc: ServiceHandle) -> int:
    return int(svc.status()["workers"]["gpu"]["in_flight"])


def blocked_job(svc: ServiceHandle) -> str:
    """The one running job, once its worker has streamed far more than the client could have taken."""
    jobs = wait_until(lambda: running_jobs(svc), what="the flooded job to run")
    assert len(jobs) == 1 and gpu_in_flight(svc) == 1
    return str(jobs[0]["id"])


def test_a_client_that_stops_reading_then_leaves_frees_its_job_and_slot(svc: ServiceHandle) -> None:
    for _ in range(4):  # four such clients took every GPU slot before the fix
        with non_reader(svc, FLOOD):
            job_id = blocked_job(svc)
            # The client is paused this long: the worker fills every buffer between the router and it
            # (32 MiB/s against a few MiB of socket buffers), so the router's write to it blocks.
            time.sleep(2.0)
        # The client closed its socket while the router was blocked writing to it.
        wait_until(lambda: not running_jobs(svc) and gpu_in_flight(svc) == 0, 15, "the job and slot freed")
        job = httpx.get(f"{svc.base_url}/v1/jobs/{job_id}", headers=svc.headers(), timeout=10).json()
        assert job["state"] == "cancelled", job
    answer = httpx.post(
        svc.v1 + "/completions", json={"prompt": "Hi", "max_tokens": 3}, headers=svc.headers(), timeout=30
    )
    assert answer.status_code == 200, answer.text


@pytest.mark.slow  # the router waits its stall limit (15 s) before it drops the client
def test_a_client_that_stops_reading_and_stays_is_dropped_after_the_stall_limit(svc: ServiceHandle) -> None:
    with non_reader(svc, FLOOD) as sock:
        job_id = blocked_job(svc)
        job = wait_until(
            lambda: (
                (
                    j := httpx.get(
                        f"{svc.base_url}/v1/jobs/{job_id}", headers=svc.headers(), timeout=10
                    ).json()
                )["state"]
                != "running"
                and j
            ),
            40,
            "the stalled client to be dropped",
        )
        assert job["state"] == "cancelled" and job["error"]["code"] == "client_stalled", job
        assert gpu_in_flight(svc) == 0
        # The server closed the connection: what was buffered drains, then the stream ends (EOF or reset).
        sock.settimeout(10)
        with contextlib.suppress(ConnectionResetError):
            while sock.recv(1 << 20):
                pass
