"""No worker outlives its supervisor: not after stop(), not after the supervisor's process is SIGKILLed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.supervisor.conftest import SupervisorFactory
from tests.supervisor.helpers import process_alive
from tests.support.waits import wait_until_async
from tray_app.engine.profile import WorkerProfile

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]


async def test_stop_leaves_no_worker_behind(
    make_supervisor: SupervisorFactory, gpu_profile: WorkerProfile, cpu_profile: WorkerProfile
) -> None:
    gpu, cpu = make_supervisor(gpu_profile), make_supervisor(cpu_profile)
    assert await asyncio.gather(gpu.start(), cpu.start()) == [True, True]
    pids = [gpu.pid, cpu.pid]
    await asyncio.gather(gpu.stop(), cpu.stop())
    assert [process_alive(pid) for pid in pids if pid is not None] == [False, False]
    assert gpu.state == cpu.state == "stopped" and gpu.base_url is None and gpu.pid is None


async def test_sigkill_of_the_supervisor_process_takes_its_workers_down(
    model_path: Path, tmp_path: Path
) -> None:
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).with_name("supervisor_child.py")),
        str(model_path),
        str(tmp_path / "logs"),
        stdout=asyncio.subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
    )
    assert child.stdout is not None
    worker_pids: list[int] = []
    try:
        # The child's first line comes once both of its workers are ready.
        report = json.loads(await asyncio.wait_for(child.stdout.readline(), timeout=60))
        assert report["ready"] == [True, True]
        worker_pids = report["pids"]
        assert all(process_alive(pid) for pid in worker_pids)
        child.kill()
        await child.wait()
        took = await wait_until_async(
            lambda: not any(process_alive(pid) for pid in worker_pids),
            5,
            "workers gone after the supervisor died",
        )
        print(f"\nworkers gone {took:.3f} s after the supervisor was SIGKILLed")
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
        for pid in worker_pids:  # survivors here mean the assertion above already failed: clean up anyway
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)
