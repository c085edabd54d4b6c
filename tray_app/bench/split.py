"""A third worker for the bench on a real GPU: the service's GPU profile with half its layers on the GPU,
standing for a planned CPU/GPU split. Runs the same llama-server as the service, stopped (and gone) at the
end."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from tray_app.engine import binary
from tray_app.engine.argv import llama_server_argv
from tray_app.engine.profile import WorkerProfile
from tray_app.host.launch import free_port, stop_process_tree

READY_TIMEOUT = 180.0


def split_profile(gpu: dict[str, Any]) -> WorkerProfile:
    """The GPU worker's profile (as /failsoft/status shows it), half its offloaded layers kept on the CPU."""
    fields = {key: value for key, value in gpu.items() if key in WorkerProfile.__dataclass_fields__}
    profile = WorkerProfile(**{**fields, "model_path": Path(str(gpu["model_path"]))})
    return replace(profile, n_gpu_layers=max(profile.n_gpu_layers // 2, 1), enable_faults=False)


@contextlib.contextmanager
def split_worker(profile: WorkerProfile, log_path: Path) -> Iterator[str]:
    """Run a worker with `profile` on a free port; yields its base URL once /health says ready."""
    port = free_port()
    command = llama_server_argv(binary.find("").path, profile, port)
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the split worker exited with {process.returncode}; see {log_path}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the split worker was not ready after {READY_TIMEOUT:.0f}s; see {log_path}"
                )
            time.sleep(0.2)
        yield url
    finally:
        stop_process_tree(process)
