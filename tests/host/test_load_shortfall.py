"""A GPU load that runs out of memory teaches the next start what it lacked, through real processes.

`failsoft serve --simulate-vram` with the tiny MoE model and no reserve: the plan fills the budget by its
compute estimate, and this CPU build's compute buffer is larger than that (3.01 MiB printed, 2.89 planned),
so the first load fails its load check allocating the compute buffer, as a card would. The restart holds
back what the load had reached beyond the plan (the supervisor read it from the load's lines), starts with
a smaller plan, loads, and answers; `failsoft status` says why it started smaller. With the bundled model
and a stale measurement the smaller start has a shorter context, and requests are routed by that one."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.support.helpers import base_settings, client_for, failsoft_of, failsoft_status, gpu_worker_starts
from tests.support.moe_service import tiny_moe_service
from tests.support.service import ServiceHandle, running_service

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
VRAM = "6656KiB"


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceHandle]:
    with tiny_moe_service(tmp_path_factory.mktemp("load-shortfall"), vram=VRAM, reserve_min="0") as handle:
        yield handle


def test_the_restart_after_a_load_out_of_memory_is_smaller_and_loads(svc: ServiceHandle) -> None:
    status = svc.status()
    gpu = status["workers"]["gpu"]
    assert gpu["state"] == "ready" and gpu["restarts"] >= 1
    assert gpu["last_failure"]["kind"] == "oom_load", gpu["last_failure"]
    assert "failed to allocate compute buffers" in gpu["last_failure"]["message"]
    # What the first load lacked: a fraction of the compute buffer (its estimate's error), not all of it.
    lacked = status["gpu_path"]["load_shortfall"]["gpu"]
    assert 0 < lacked < MIB, lacked
    note = status["gpu_path"]["smaller"]["gpu"]
    assert note.startswith("gpu starts with a smaller plan") and "its last load ran out of memory" in note
    starts = gpu_worker_starts(svc)
    assert len(starts) == gpu["restarts"] + 1
    assert starts[-1] != starts[0]  # another placement: less on the device
    answer = client_for(svc).chat.completions.create(
        model="tiny-moe", messages=[{"role": "user", "content": "hello"}], max_tokens=4
    )
    assert failsoft_of(answer)["worker"] == "gpu"


def test_failsoft_status_says_why_the_gpu_worker_started_smaller(svc: ServiceHandle) -> None:
    shown = failsoft_status(svc)
    assert shown.returncode == 0, shown.stderr
    assert "gpu starts with a smaller plan" in shown.stdout, shown.stdout
    assert "its last load ran out of memory" in shown.stdout, shown.stdout


# ------------------------------------------------------------ a stale measurement, a dense model
N_CTX = 4096


@pytest.fixture(scope="module")
def stale(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceHandle]:
    """The bundled model with a compute buffer measured far too small (a measurement from before a driver or
    llama.cpp update, say): the plan takes the full context on the strength of it, the load fails at the
    compute buffer, and the restart holds back what it lacked with a shorter context."""
    root = tmp_path_factory.mktemp("stale-calibration")
    data = root / "data"
    settings = base_settings(
        budget={"reserve_percent": 0.0, "reserve_min": "0", "max_ctx": N_CTX, "n_parallel": 1}
    )
    with running_service(root / "measure", settings=settings, data_dir=data) as first:
        gpu = first.status()["workers"]["gpu"]["health"]
        buffers = gpu["buffers"]
        assert gpu["n_ctx"] == N_CTX
    # The GPU worker's own measurement (the CPU worker's settings differ: its context is longer).
    (measured,) = [
        path
        for path in (data / "calibration").rglob("*.json")
        if json.loads(path.read_text())["settings"]["n_ctx"] == N_CTX
    ]
    record = json.loads(measured.read_text())
    record["buffers"]["compute_bytes"] = 64 * 1024
    measured.write_text(json.dumps(record))
    compute = int(buffers["compute_bytes"])
    vram = (
        int(buffers["model_bytes"]) + int(buffers["kv_bytes"]) + int(buffers["output_bytes"]) + compute // 2
    )
    with running_service(root / "service", simulate_vram=f"{vram}B", settings=settings, data_dir=data) as svc:
        yield svc


def test_requests_are_routed_by_the_context_the_gpu_worker_runs_with(stale: ServiceHandle) -> None:
    status = stale.status()
    gpu = status["workers"]["gpu"]
    assert status["plan"]["n_ctx_per_seq"] == N_CTX  # what the stale measurement let the plan take
    assert gpu["last_failure"]["kind"] == "oom_load", gpu["last_failure"]
    running = gpu["health"]["n_ctx_per_slot"]
    assert 0 < running < N_CTX, status["gpu_path"]
    # What the service says and routes by is the running worker's context, not the plan's.
    assert status["caps"]["n_ctx_per_seq"] == running
    short = client_for(stale).chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    assert failsoft_of(short)["worker"] == "gpu"
    words = " ".join(["apple"] * (running + 200))  # longer than the GPU worker's slot, within the plan's
    long = client_for(stale).chat.completions.create(
        model="default", messages=[{"role": "user", "content": words}], max_tokens=4
    )
    assert failsoft_of(long)["worker"] == "cpu"
    assert long.usage is not None and running < long.usage.prompt_tokens < N_CTX
