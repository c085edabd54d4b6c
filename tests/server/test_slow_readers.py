"""Review N1: a streaming client that stops reading (a paused tab, a dead phone link) held its job and its
router slot for as long as the service ran, once it also went away. Through a real `failsoft serve` on fake
workers that flood each stream, and a raw socket client with a tiny receive buffer that reads nothing.

Review F1: with a keep-alive shorter than the stall limit, the comments restamped the stall clock, so such a
client was never dropped: four of them held every GPU slot. Through real llama.cpp workers."""

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
RECEIVE_BUFFER = 2048
# The segment size the client announces: on loopback (a 64 KiB MTU) the server's send buffer is sized from
# it, so a small one keeps what the kernel takes before the router's write blocks to about 100 KB.
SEGMENT = 536


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceHandle]:
    root = tmp_path_factory.mktemp("slow-readers")
    engine = fake_llama_server(root, token_delay=0.001, word_bytes=32768)
    settings = base_settings(engine={"llama_server": str(engine)})
    with running_service(root / "service", settings=settings, ready_timeout=30) as handle:
        yield handle


@contextlib.contextmanager
def non_reader(
    svc: ServiceHandle, body: dict[str, Any], path: str = "/v1/completions"
) -> Iterator[socket.socket]:
    """A client that sends a streamed request, then reads nothing: its receive window stays tiny."""
    port = int(svc.base_url.rsplit(":", 1)[1])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, SEGMENT)
    try:
        sock.connect(("127.0.0.1", port))
        payload = json.dumps(body).encode()
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
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


# Review F1's settings: a keep-alive (5 s) shorter than the stall limit, which the test supervisor's health
# settings leave at its floor.
KEEPALIVE = 5.0
STALL = 15.0
MARGIN = 45.0  # the answers' way to a blocked write (some 50 tokens each), and a busy machine
# A streamed chat with 20 log probabilities per token (about 2 KB a piece) that goes on until its write is
# blocked: `ignore_eos` so the model does not end it first.
CHATTY = {
    "model": "default",
    "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}],
    "max_tokens": 1500,
    "ignore_eos": True,
    "logprobs": True,
    "top_logprobs": 20,
    "stream": True,
}


@pytest.fixture(scope="module")
def real_svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceHandle]:
    settings = base_settings(server={"keepalive_seconds": KEEPALIVE})
    with running_service(tmp_path_factory.mktemp("keepalive-stall"), settings=settings) as handle:
        assert handle.status()["workers"]["gpu"]["slots"] == 4
        yield handle


def job_record(svc: ServiceHandle, job_id: str) -> dict[str, Any]:
    response = httpx.get(f"{svc.base_url}/v1/jobs/{job_id}", headers=svc.headers(), timeout=10)
    record: dict[str, Any] = response.json()
    return record


@pytest.mark.integration
def test_keep_alive_comments_do_not_keep_clients_that_stopped_reading_on_every_slot(
    real_svc: ServiceHandle,
) -> None:
    svc = real_svc
    with contextlib.ExitStack() as clients:
        for _ in range(4):  # one per GPU slot; none of them reads a byte, none leaves
            clients.enter_context(non_reader(svc, CHATTY, "/v1/chat/completions"))
        jobs = wait_until(
            lambda: len(found := running_jobs(svc)) == 4 and gpu_in_flight(svc) == 4 and found,
            60,
            "the four chats to take every GPU slot",
        )
        ids = sorted(str(job["id"]) for job in jobs)
        # Before the fix the comments kept every one of them alive until the clients went away.
        wait_until(
            lambda: not running_jobs(svc) and gpu_in_flight(svc) == 0,
            STALL + MARGIN,
            "every stalled client dropped and its slot free",
        )
        for job_id in ids:
            record = job_record(svc, job_id)
            assert record["state"] == "cancelled" and record["error"]["code"] == "client_stalled", record
        dropped = [line for line in svc.output().splitlines() if "the client read nothing for" in line]
        assert sorted(i for i in ids for line in dropped if i in line) == ids, dropped
        # The slots are free for someone else, while the four sockets are still open.
        answer = httpx.post(
            svc.v1 + "/chat/completions",
            json={"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3},
            headers=svc.headers(),
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-failsoft-worker"] == "gpu"
