"""One simulated GPU per runtime folder: a second `failsoft serve --simulate-vram` that finds the device held
says in one line which process holds it and what to do, exits 1, and leaves the holder's device alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.service import free_port, running_service, write_config
from tray_app.device.ledger import LEDGER_FILE, Ledger

HINT = "stop that process, or set FAILSOFT_RUNTIME_DIR to another folder to run a second one"


def serve_simulated(root: Path, runtime_dir: Path) -> subprocess.CompletedProcess[str]:
    """`failsoft serve --simulate-vram 2GiB` with its own config, data and log dirs, on `runtime_dir`."""
    write_config(root / "config.toml", {"cpu": {"threads": 1}})
    env = {
        **os.environ,
        "FAILSOFT_CONFIG": str(root / "config.toml"),
        "FAILSOFT_DATA_DIR": str(root / "data"),
        "FAILSOFT_LOG_DIR": str(root / "logs"),
        "FAILSOFT_RUNTIME_DIR": str(runtime_dir),
    }
    command = [
        sys.executable,
        "-m",
        "tray_app",
        "serve",
        "--port",
        str(free_port()),
        "--simulate-vram",
        "2GiB",
    ]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)


def the_one_line(done: subprocess.CompletedProcess[str]) -> str:
    output = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in output, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0] == done.stderr.strip(), output
    return lines[0]


def test_a_device_held_by_a_live_process_refuses_the_service_naming_the_process(tmp_path: Path) -> None:
    runtime_dir = tmp_path / "shared-run"
    holder = Ledger(runtime_dir / LEDGER_FILE)
    holder.create(4 * 1024**3, owner_pid=os.getpid())  # this test's process holds the device
    line = the_one_line(serve_simulated(tmp_path / "second", runtime_dir))
    assert line.startswith("failsoft serve: the simulated GPU ("), line
    assert f"is held by process {os.getpid()} (" in line and "pytest" in line and line.endswith(HINT), line
    assert holder.read().owner_pid == os.getpid() and holder.read().total_bytes == 4 * 1024**3


@pytest.mark.integration
def test_a_second_simulated_service_on_the_same_runtime_folder_is_refused_in_one_line(tmp_path: Path) -> None:
    with running_service(tmp_path / "first", simulate_vram="2GiB", settings={"cpu": {"threads": 1}}) as first:
        port = first.base_url.rsplit(":", 1)[1]
        line = the_one_line(serve_simulated(tmp_path / "second", first.runtime_dir))
        assert f"is held by process {first.process.pid} (" in line, line
        assert f"-m tray_app serve --port {port} --simulate-vram 2GiB)" in line and line.endswith(HINT), line
        # The first service keeps its device and serves on.
        assert Ledger(first.runtime_dir / LEDGER_FILE).read().owner_pid == first.process.pid
        assert first.status()["workers"]["gpu"]["state"] == "ready"
