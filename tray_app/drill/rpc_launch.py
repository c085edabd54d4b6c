"""The RPC box of scenario o: `failsoft rpc serve` on a free loopback port (rpc-server on this machine's
backend, another machine's device as the GPU worker meets it) and the config of a service that spans it."""

from __future__ import annotations

import contextlib
import copy
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from tray_app.drill.launcher import LaunchError
from tray_app.host.launch import free_port, stop_process_tree
from tray_app.supervisor.process import die_with_parent

BOX_NAME = "drill-box"
# Sized for the bundled model (SmolLM2-135M, 31 layers): the simulated GPU holds about half of them, the box
# the last few (the output layer with them), the CPU the rest: three places, as in tests/peers/test_rpc_box.
SIMULATED_VRAM = "120MiB"
BOX_MEMORY = "60MiB"
RESERVE = "16MiB"
BOX_READY = 30.0  # rpc-server listens within a second; the venv's python start is most of it


@dataclass(frozen=True)
class RpcBox:
    """The box as the drill reaches it: its name in the service's `[[peers]]`, its host:port and its
    process (rpc-server itself: `failsoft rpc serve` execs it, so killing the pid kills the device)."""

    name: str
    endpoint: str
    pid: int


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def box_config(settings: dict[str, Any], endpoint: str) -> dict[str, Any]:
    """The service's config: the drill's own on a simulated GPU too small for the model, the box its one
    peer, at most BOX_MEMORY of it. One CPU thread: on a small machine rpc-server, the GPU worker (a CPU
    build when simulated) and the CPU worker share the cores."""
    data = copy.deepcopy(settings)
    data["device"]["simulate_vram"] = SIMULATED_VRAM
    data["budget"].update(reserve_min=RESERVE, reserve_percent=0)
    data["cpu"]["threads"] = 1
    data["peers"] = [{"name": BOX_NAME, "rpc": endpoint, "rpc_memory": BOX_MEMORY}]
    return data


@contextlib.contextmanager
def launched_box(settings: dict[str, Any], ready_timeout: float = BOX_READY) -> Iterator[RpcBox]:
    """`failsoft rpc serve` on a free loopback port with the drill's config (its engine's rpc-server), from
    a temporary directory; yields once it listens and kills it on exit (if a scenario has not)."""
    with tempfile.TemporaryDirectory(prefix="failsoft-drill-box-") as tmp:
        root = Path(tmp)
        config_path = root / "config.toml"
        config_path.write_text(tomli_w.dumps(settings), encoding="utf-8")
        port = free_port()
        env = {**os.environ, "FAILSOFT_DATA_DIR": str(root / "data"), "FAILSOFT_LOG_DIR": str(root / "logs")}
        command = [sys.executable, "-m", "tray_app", "--config", str(config_path), "rpc", "serve"]
        command += ["--host", "127.0.0.1", "--port", str(port)]
        output_path = root / "rpc-serve.log"
        with output_path.open("wb") as output:
            # Dies with the drill, a timeout's SIGKILL included.
            process = subprocess.Popen(
                command, env=env, stdout=output, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
            )
        try:
            deadline = time.monotonic() + ready_timeout
            while not _listening(port):
                printed = output_path.read_text(errors="replace")
                if process.poll() is not None:
                    raise LaunchError(f"failsoft rpc serve exited with {process.returncode}:\n{printed}")
                if time.monotonic() > deadline:
                    raise LaunchError(
                        f"failsoft rpc serve did not listen after {ready_timeout:.0f}s:\n{printed}"
                    )
                time.sleep(0.1)
            yield RpcBox(BOX_NAME, f"127.0.0.1:{port}", process.pid)
        finally:
            stop_process_tree(process)
