"""`failsoft rpc serve`: llama.cpp's rpc-server, built with the engine, bound only to a LAN address the user
names; a real one on loopback is a device another llama-server lists (`--list-devices --rpc`)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tray_app.engine import binary
from tray_app.engine.devices import parse_device_list
from tray_app.engine.rpc_command import RpcRefused, checked_host, rpc_argv, rpc_server_path
from tray_app.host.launch import free_port


@pytest.mark.parametrize("host", ["127.0.0.1", "192.168.1.20", "10.0.0.7", "169.254.3.4", "fd00::1"])
def test_a_lan_address_is_served(host: str) -> None:
    assert checked_host(host) == host


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("0.0.0.0", "every address"),
        ("::", "every address"),
        ("8.8.8.8", "not a LAN address"),
        ("gaming-pc.local", "as an IP"),
    ],
)
def test_anything_else_is_refused(host: str, why: str) -> None:
    with pytest.raises(RpcRefused, match=why):
        checked_host(host)


def test_the_command_line_it_runs() -> None:
    server = Path("/engine/bin/rpc-server")
    assert rpc_argv(server, "127.0.0.1", 50052, None, False) == [
        "/engine/bin/rpc-server",
        "--host",
        "127.0.0.1",
        "--port",
        "50052",
    ]
    assert rpc_argv(server, "10.0.0.7", 6000, 4, True)[-3:] == ["--threads", "4", "--cache"]


def test_an_engine_without_rpc_server_says_how_to_get_one(tmp_path: Path) -> None:
    llama_server = tmp_path / "llama-server"
    llama_server.write_text("")
    with pytest.raises(binary.EngineError, match="failsoft engine build"):
        rpc_server_path(llama_server)


@pytest.mark.integration
def test_a_real_rpc_server_is_a_device_for_llama_server(tmp_path: Path) -> None:
    port = free_port()
    failsoft = [sys.executable, "-m", "tray_app", "rpc", "serve", "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(failsoft, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        else:
            raise AssertionError("rpc-server did not listen")
        llama_server = binary.locate("")
        listed = subprocess.run(
            # --rpc first: --list-devices prints the devices known when it is read, and exits
            [str(llama_server), "--rpc", f"127.0.0.1:{port}", "--list-devices"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        devices = parse_device_list(listed.stdout + listed.stderr).devices
        (rpc,) = [device for device in devices if device.prefix == "RPC"]
        assert rpc.description == f"127.0.0.1:{port}" and rpc.total_bytes > 0, listed.stdout
        assert not rpc.is_gpu  # a device on another machine, not this one's GPU
    finally:
        process.terminate()
        _, said = process.communicate(timeout=30)
    assert "no authentication and no encryption" in said
