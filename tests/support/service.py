"""Start a real `failsoft serve` for a test: its own config, data and log dirs, a free port, and no orphans.

    with running_service(tmp_path, enable_faults=True) as svc:
        client = openai.OpenAI(base_url=svc.base_url + "/v1", api_key="unused", max_retries=0)
        ...

The context manager returns once `/failsoft/status` reports both workers ready, and on exit stops the service
with SIGTERM (then SIGKILL) and kills any worker process it left behind. A test module whose tests share one
service has it as a fixture:

    svc = module_service(enable_faults=True, settings=SETTINGS)
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomli_w

from tray_app.host.launch import free_port, spawn_serve, stop_process_tree
from tray_app.reach import admin_token

__all__ = [
    "ServiceHandle",
    "at_port",
    "free_port",
    "module_service",
    "running_service",
    "stop_process_tree",
    "write_config",
]

READY_TIMEOUT = 120.0


@dataclass
class ServiceHandle:
    """A running service: where it listens and where it keeps its files."""

    base_url: str
    process: subprocess.Popen[bytes]
    root: Path
    config_path: Path
    data_dir: Path
    log_dir: Path
    api_key: str = ""
    output_path: Path = field(default_factory=Path)
    worker_key: str = ""  # what its workers take: lets a test ask a worker directly
    admin_token: str = ""  # what its control API takes (tray_app.reach.admin_token)
    runtime_dir: Path = field(default_factory=Path)  # its own: its simulated GPU's ledger is there

    def hog_env(self) -> dict[str, str]:
        """The environment a `failsoft hog` needs to take memory from this service's simulated GPU."""
        return {**os.environ, "FAILSOFT_RUNTIME_DIR": str(self.runtime_dir)}

    @property
    def worker_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.worker_key}"}

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])

    @property
    def v1(self) -> str:
        """The base URL the openai client wants."""
        return self.base_url + "/v1"

    def headers(self) -> dict[str, str]:
        """The API key (if the service has one) and the admin token: what the tray sends."""
        key = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return {**key, **admin_token.headers(self.admin_token)}

    def status(self) -> dict[str, Any]:
        """`GET /failsoft/status` (the shape of tray_app.contract.status.ServiceStatus)."""
        response = httpx.get(self.base_url + "/failsoft/status", headers=self.headers(), timeout=10)
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data

    def wait_workers_ready(self, timeout: float = READY_TIMEOUT) -> dict[str, Any]:
        """Poll /failsoft/status until both workers are ready (e.g. after a fault restarted one)."""
        return _wait_ready(self, time.monotonic() + timeout)

    def output(self) -> str:
        """What the service printed so far (stdout and stderr), for failure messages."""
        try:
            return self.output_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""


def _both_ready(status: dict[str, Any]) -> bool:
    workers = status.get("workers") or {}
    return all((workers.get(role) or {}).get("state") == "ready" for role in ("gpu", "cpu"))


def _wait_ready(handle: ServiceHandle, deadline: float) -> dict[str, Any]:
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        if handle.process.poll() is not None:
            raise RuntimeError(
                f"failsoft serve exited with {handle.process.returncode} before it was ready:\n"
                f"{handle.output()}"
            )
        try:
            status = handle.status()
        except (httpx.HTTPError, ValueError) as error:
            last_error = repr(error)
        else:
            if _both_ready(status):
                return status
            last_error = f"workers: {status.get('workers')}"
        time.sleep(0.1)
    raise TimeoutError(f"service not ready in time ({last_error}):\n{handle.output()}")


def write_config(path: Path, settings: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(settings), encoding="utf-8")


def at_port(settings: dict[str, Any], port: int) -> dict[str, Any]:
    """`settings` with the service's port in `[server]`: its address in its config, as a user's config has
    it, so the `failsoft` commands and the tray with this config take it for the local service (and send it
    the admin token found on this machine: admin_token.for_url)."""
    return {**settings, "server": {**settings.get("server", {}), "port": port}}


@contextlib.contextmanager
def running_service(
    root: Path,
    *,
    simulate_vram: str = "4GiB",
    enable_faults: bool = False,
    settings: dict[str, Any] | None = None,
    data_dir: Path | None = None,
    ready_timeout: float = READY_TIMEOUT,
    extra_args: list[str] | None = None,
    port: int | None = None,
) -> Iterator[ServiceHandle]:
    """Run `failsoft serve` in `root` (config/data/logs live there); yields once both workers are ready.

    `settings` is the TOML config as a dict (e.g. {"failover": {"fallback": "approval"}}); pass the same
    `data_dir` to a second service to see the first one's journal (restart tests).
    """
    root.mkdir(parents=True, exist_ok=True)
    config_path = root / "config.toml"
    data_dir = data_dir or root / "data"
    log_dir = root / "logs"
    port = port or free_port()
    write_config(config_path, at_port(settings or {}, port))
    args = [
        "--simulate-vram",
        simulate_vram,
        *(["--enable-faults"] if enable_faults else []),
        *(extra_args or []),
    ]
    serve = spawn_serve(root, config_path, data_dir=data_dir, args=args, port=port)
    process, port, output_path = serve.process, serve.port, serve.output_path
    api_key = str((settings or {}).get("server", {}).get("api_key", ""))
    handle = ServiceHandle(
        base_url=f"http://127.0.0.1:{port}",
        process=process,
        root=root,
        config_path=config_path,
        data_dir=data_dir,
        log_dir=log_dir,
        api_key=api_key,
        output_path=output_path,
        worker_key=serve.worker_key,
        admin_token=serve.admin_token,
        runtime_dir=serve.runtime_dir or root / "run",
    )
    try:
        _wait_ready(handle, time.monotonic() + ready_timeout)
        yield handle
    finally:
        stop_process_tree(process)


def module_service(**options: Any) -> Any:
    """The fixture `svc`, module-scoped: one service started by running_service(module_root, **options) for
    all of a module's tests, stopped after the last one. A module takes it as `svc = module_service(...)`."""

    @pytest.fixture(scope="module", name="svc")
    def svc(module_root: Path) -> Iterator[ServiceHandle]:
        """The module's service (tests.support.service.module_service)."""
        with running_service(module_root, **options) as handle:
            yield handle

    return svc
