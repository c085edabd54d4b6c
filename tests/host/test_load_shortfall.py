"""A GPU load that runs out of memory teaches the next start what it lacked, through real processes.

`failsoft serve --simulate-vram` with the tiny MoE model and no reserve: the plan fills the budget by its
compute estimate, and this CPU build's compute buffer is larger than that (3.01 MiB printed, 2.89 planned),
so the first load fails its load check allocating the compute buffer, as a card would. The restart holds
back what the load had reached beyond the plan (the supervisor read it from the load's lines), starts with
a smaller plan, loads, and answers; `failsoft status` says why it started smaller."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.helpers import base_settings, client_for, failsoft_of
from tests.support.hog import FAILSOFT
from tests.support.service import ServiceHandle, running_service
from tests.support.tiny_moe import write_tiny_moe

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
VRAM = "6656KiB"


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceHandle]:
    root = tmp_path_factory.mktemp("load-shortfall")
    model = write_tiny_moe(root / "tiny-moe.gguf")
    settings = base_settings(
        model={"path": str(model), "name": "tiny-moe"},
        budget={"reserve_percent": 0.0, "reserve_min": "0", "n_ctx": 1024, "n_parallel": 1},
        cpu={"threads": 1},
    )
    with running_service(root / "service", simulate_vram=VRAM, settings=settings) as handle:
        yield handle


def started_command_lines(svc: ServiceHandle) -> list[str]:
    """Each start of the GPU worker, as the supervisor wrote its command line at the top of the log."""
    lines = [
        line
        for path in sorted(Path(svc.log_dir).glob("*gpu*.log"))
        for line in path.read_text(errors="replace").splitlines()
        if "worker started, pid" in line
    ]
    assert lines, f"no GPU worker log in {sorted(Path(svc.log_dir).iterdir())}"
    return lines


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
    starts = started_command_lines(svc)
    assert len(starts) == gpu["restarts"] + 1
    assert starts[-1] != starts[0]  # another placement: less on the device
    answer = client_for(svc).chat.completions.create(
        model="tiny-moe", messages=[{"role": "user", "content": "hello"}], max_tokens=4
    )
    assert failsoft_of(answer)["worker"] == "gpu"


def test_failsoft_status_says_why_the_gpu_worker_started_smaller(svc: ServiceHandle) -> None:
    shown = subprocess.run(
        [str(FAILSOFT), "status", "--url", svc.base_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "gpu starts with a smaller plan" in shown.stdout, shown.stdout
    assert "its last load ran out of memory" in shown.stdout, shown.stdout
