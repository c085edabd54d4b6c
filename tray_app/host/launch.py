"""Run `failsoft serve` as a child process with its own config, data and log dirs: for drills, benchmarks
and tests, which must never touch the user's journal and must leave no process behind."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tray_app.contract.roles import CHAT_ROLES
from tray_app.contract.status import ServiceStatus
from tray_app.engine import WORKER_KEY_ENV
from tray_app.paths import private_dir
from tray_app.reach import admin_token
from tray_app.supervisor.ports import free_port
from tray_app.supervisor.process import die_with_parent

STOP_TIMEOUT = 20.0


@dataclass
class ServeProcess:
    """A started `failsoft serve`: where it listens and where its output goes."""

    process: subprocess.Popen[bytes]
    port: int
    output_path: Path
    worker_key: str = (
        ""  # the key its workers take (FAILSOFT_WORKER_KEY), for a harness that asks them directly
    )
    admin_token: str = ""  # its control API's token (reach/admin_token.py), for a harness that drives it
    runtime_dir: Path | None = None  # where its simulated GPU's ledger is: a hog run with it takes from it

    @property
    def worker_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.worker_key}"}

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        """What the service printed so far (stdout and stderr), for error messages."""
        try:
            return self.output_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""


def spawn_serve(
    root: Path,
    config_path: Path,
    *,
    data_dir: Path | None = None,
    args: Sequence[str] = (),
    port: int | None = None,
    runtime_dir: Path | None = None,
    own_group: bool = False,
) -> ServeProcess:
    """Start `failsoft serve` on loopback (a free port unless given); its files live under `root`, its
    runtime folder too (unless `runtime_dir`), so its simulated GPU is its own and never a running
    service's. `own_group`: it leads a process group of its own (a test kills that group and nothing else)."""
    port = port or free_port()
    worker_key = secrets.token_urlsafe(24)
    data_dir = data_dir or root / "data"
    admin = admin_token.ensure(private_dir(data_dir))  # the service finds it there and keeps it
    runtime_dir = runtime_dir or root / "run"
    env = {
        **os.environ,
        WORKER_KEY_ENV: worker_key,
        "FAILSOFT_CONFIG": str(config_path),
        "FAILSOFT_DATA_DIR": str(data_dir),
        "FAILSOFT_LOG_DIR": str(root / "logs"),
        "FAILSOFT_RUNTIME_DIR": str(runtime_dir),
        "PYTHONUNBUFFERED": "1",
    }
    command = [sys.executable, "-m", "tray_app", "serve", "--port", str(port), *args]
    output_path = root / f"serve-{port}.log"
    output_path.parent.mkdir(parents=True, exist_ok=True)
    with output_path.open("wb") as output:
        # A bench or drill killed outright (a timeout's SIGKILL) takes its service with it.
        process = subprocess.Popen(
            command,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
            start_new_session=own_group,
        )
    return ServeProcess(process, port, output_path, worker_key, admin, runtime_dir)


def workers_ready(status: ServiceStatus | dict[str, Any] | None) -> bool:
    """Every chat worker the service has (GPU and CPU, unless absent) is ready."""
    workers: Mapping[str, Any] = (status or {}).get("workers") or {}
    states = [(workers.get(role) or {}).get("state") for role in CHAT_ROLES]
    present = [state for state in states if state != "absent"]
    return bool(present) and all(state == "ready" for state in present)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def stop_process_tree(process: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the service (it stops its workers), then make sure nothing it started survives."""
    children = _descendants(process.pid)
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)
    children += _descendants(process.pid)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(children, timeout=timeout)
