"""A crash with background jobs queued and running: the service SIGKILLed (its workers die with it), then
started again on the same data folder. Every job accepted before the crash completes, under its id, run to
completion once. (They were failed with no_cpu_worker: the restart routed them before it had told its workers
to start, and read the CPU worker's readiness before waiting for it.)"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.support.helpers import COUNTING, base_settings
from tests.support.service import ServiceHandle, stop_process_tree, write_config
from tests.support.waits import wait_until
from tray_app.host.launch import spawn_serve
from tray_app.server.http import JOB_TOKEN_HEADER

pytestmark = pytest.mark.integration

JOBS = 6
MAX_TOKENS = 120
BEFORE_KILL_SECONDS = 1.5
FINAL = {"completed", "failed", "cancelled", "rejected"}
# The default config, with two GPU slots instead of four: the six jobs take three rounds, so some are still
# queued or running at the kill on a fast machine too.
SETTINGS = base_settings(budget={"n_parallel": 2})


@contextlib.contextmanager
def serve_in_own_group(root: Path, data_dir: Path, runtime_dir: Path) -> Iterator[ServiceHandle]:
    """`failsoft serve --simulate-vram 2GiB` as `tests.support.service` runs it (its own config and logs;
    here the data and runtime folders, with the simulated GPU's ledger, are the caller's, as a user's are
    from one run to the next), but leading its own process group, so that the test can SIGKILL the group and
    nothing else. Yields at once: the caller waits for what it needs."""
    root.mkdir(parents=True, exist_ok=True)
    config_path = root / "config.toml"
    write_config(config_path, SETTINGS)
    serve = spawn_serve(
        root,
        config_path,
        data_dir=data_dir,
        args=["--simulate-vram", "2GiB"],
        runtime_dir=runtime_dir,
        own_group=True,
    )
    process, port, output_path = serve.process, serve.port, serve.output_path
    handle = ServiceHandle(
        base_url=f"http://127.0.0.1:{port}",
        process=process,
        root=root,
        config_path=config_path,
        data_dir=data_dir,
        log_dir=root / "logs",
        output_path=output_path,
        worker_key=serve.worker_key,
        admin_token=serve.admin_token,
        runtime_dir=runtime_dir,
    )
    try:
        yield handle
    finally:
        stop_process_tree(process)


def submit(svc: ServiceHandle, key: str) -> httpx.Response:
    return httpx.post(
        svc.base_url + "/v1/jobs",
        json={**COUNTING, "max_tokens": MAX_TOKENS},
        headers={**svc.headers(), "Idempotency-Key": key},
        timeout=30,
    )


def read_as_creator(svc: ServiceHandle, job_id: str, token: str) -> dict[str, Any] | None:
    """The job as its creator reads it (its read token, no admin token); None while the service does not
    answer yet."""
    try:
        response = httpx.get(
            f"{svc.base_url}/v1/jobs/{job_id}", headers={JOB_TOKEN_HEADER: token}, timeout=10
        )
    except httpx.HTTPError:
        return None
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def test_background_jobs_accepted_before_a_crash_complete_after_the_restart(tmp_path: Path) -> None:
    data_dir, runtime_dir = tmp_path / "shared-data", tmp_path / "run"
    accepted: dict[str, tuple[str, str]] = {}  # Idempotency-Key -> (job id, read token)
    with serve_in_own_group(tmp_path / "first", data_dir, runtime_dir) as first:
        first.wait_workers_ready()
        for number in range(JOBS):
            key = f"crash-{number}-{uuid.uuid4().hex}"
            response = submit(first, key)
            assert response.status_code == 202, response.text
            accepted[key] = (response.json()["id"], response.json()["read_token"])
        workers = first.status()["workers"]
        worker_pids = [pid for worker in workers.values() if isinstance(pid := worker.get("pid"), int)]
        assert worker_pids, workers
        time.sleep(BEFORE_KILL_SECONDS)
        before = {job_id: _state(first, job_id, token) for job_id, token in accepted.values()}
        os.killpg(first.process.pid, signal.SIGKILL)
        first.process.wait(timeout=30)
        # The workers die with the service (they lead groups of their own, and go when their parent does).
        wait_until(lambda: not any(_alive(pid) for pid in worker_pids), timeout=30, what="the workers to die")
    print(f"\nat the kill: {sorted(before.values())}")
    assert any(state != "completed" for state in before.values()), "every job finished before the kill"

    with serve_in_own_group(tmp_path / "second", data_dir, runtime_dir) as second:
        started = time.monotonic()
        final: dict[str, dict[str, Any]] = {}

        def all_final() -> bool:
            for job_id, token in accepted.values():
                if job_id not in final:
                    job = read_as_creator(second, job_id, token)
                    if job is not None and job["state"] in FINAL:
                        final[job_id] = job
            return len(final) == JOBS

        wait_until(all_final, timeout=300, what=f"the {JOBS} resumed jobs to end")
        print(f"all ended {time.monotonic() - started:.1f} s after the restart")
        for job_id, job in final.items():
            print(job_id, [(attempt["worker"], attempt["outcome"]) for attempt in job["attempt_log"]])
        for job_id, job in final.items():
            assert job["state"] == "completed", (job_id, job.get("error"), second.output())
            assert job["id"] == job_id and job["result"]["failsoft"]["job_id"] == job_id
            assert job["result"]["choices"][0]["text"]
            log = job["attempt_log"]
            # Run to completion exactly once; an attempt the crash cut off is closed, not left open.
            assert [attempt["outcome"] for attempt in log].count("completed") == 1, log
            assert all(attempt["ended_at"] is not None for attempt in log), log
            assert log[-1]["outcome"] == "completed", log
        # The same request again, under its key: the job made before the crash, with its stored answer.
        for key, (job_id, _) in accepted.items():
            again = submit(second, key)
            assert again.status_code == 200, again.text
            assert again.json()["id"] == job_id


def _state(svc: ServiceHandle, job_id: str, token: str) -> str:
    job = read_as_creator(svc, job_id, token)
    return str(job["state"]) if job is not None else "unknown"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
