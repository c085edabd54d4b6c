"""`failsoft doctor` as a user runs it (`python -m tray_app doctor`): what this machine offers, what blocks
running, and the exit status that says so."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.display import start_xvfb
from tests.support.http_server import http_server
from tests.support.service import running_service
from tray_app.doctor.tray_host import probe


def doctor(*args: str, env: dict[str, str] | None = None, before: tuple[str, ...] = ()) -> tuple[int, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tray_app", *before, "doctor", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {check["name"]: check for check in report["checks"]}


def test_this_machine_has_no_gpu_a_cpu_engine_and_nothing_blocking() -> None:
    status, report = doctor("--port", "0")
    checks = by_name(report)
    assert status == 0 and report["ok"], report
    assert set(checks) == {"gpu", "engine", "llama_devices", "model", "port", "tray", "dirs"}
    assert checks["gpu"]["details"]["nvml"]["kind"] == "none"
    assert checks["gpu"]["summary"].startswith("no NVIDIA GPU: ")  # NVML's reason, said once
    assert checks["gpu"]["summary"].count("no NVIDIA GPU") == 1
    engine = checks["engine"]["details"]
    assert engine["backend"] == "cpu" and engine["binding_supports_gpu_offload"] is False
    assert engine["commit"] and checks["llama_devices"]["details"]["devices"] == []
    assert "CPU only" in checks["llama_devices"]["summary"]
    assert checks["dirs"]["details"]["data_dir"] == os.environ["FAILSOFT_DATA_DIR"]


def test_text_output_names_each_check() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tray_app", "doctor", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for name in ("gpu", "engine", "llama_devices", "model", "port", "tray", "dirs"):
        assert f"] {name}" in done.stdout
    assert done.stdout.rstrip().endswith("nothing blocks running Failsoft")


def test_a_port_taken_by_another_program_blocks_with_what_answers_and_the_fix() -> None:
    with http_server(404) as port:
        status, report = doctor("--port", str(port))
    check = by_name(report)["port"]
    assert status == 1 and not report["ok"]
    assert check["level"] == "blocking" and f"127.0.0.1:{port} is taken" in check["summary"]
    assert f"another program answers at http://127.0.0.1:{port} (HTTP 404)" in check["summary"]
    assert "--port" in check["fix"]


def test_a_port_that_a_stopped_service_left_waiting_is_free() -> None:
    """Connections the service closed linger in TIME_WAIT for a minute; the service binds over them."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()  # the server side closes first: its end waits in TIME_WAIT
        client.close()
    _status, report = doctor("--port", str(port))
    assert by_name(report)["port"]["level"] == "ok", report


@pytest.mark.integration
def test_failsoft_already_running_on_the_port_is_not_a_problem(tmp_path: Path) -> None:
    with running_service(tmp_path) as svc:
        status, report = doctor("--port", svc.base_url.rsplit(":", 1)[1])
    check = by_name(report)["port"]
    assert status == 0 and report["ok"], report
    assert check["level"] == "info" and check["details"]["running"] == "failsoft"
    assert f"at {svc.base_url} is running" in check["summary"]


def test_a_missing_model_blocks(tmp_path: Path) -> None:
    status, report = doctor("--port", "0", before=("--model", str(tmp_path / "gone.gguf")))
    check = by_name(report)["model"]
    assert status == 1 and check["level"] == "blocking" and "does not exist" in check["summary"]
    assert check["fix"].startswith("failsoft models add ")


def test_a_missing_model_names_one_found_in_an_ollama_store(tmp_path: Path, model_path: Path) -> None:
    from tests.library.stores import ollama_store

    ollama_store(tmp_path / "ollama", model_path)
    env = {**os.environ, "OLLAMA_MODELS": str(tmp_path / "ollama")}
    status, report = doctor("--port", "0", env=env, before=("--model", str(tmp_path / "gone.gguf")))
    check = by_name(report)["model"]
    assert status == 1 and check["fix"].startswith("failsoft models add smollm2:135m")
    assert [found["name"] for found in check["details"]["found"]] == ["smollm2:135m"]


def test_a_missing_engine_blocks(tmp_path: Path) -> None:
    config = tmp_path / "engine.toml"
    config.write_text(f'[engine]\nllama_server = "{tmp_path / "no-llama-server"}"\n')
    status, report = doctor("--port", "0", before=("--config", str(config)))
    check = by_name(report)["engine"]
    assert status == 1 and check["level"] == "blocking" and "no such file" in check["summary"]
    assert check["fix"].startswith("failsoft engine build")


@pytest.fixture
def xembed_desktop(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Xvfb and the XEmbed tray host trayer, nothing else."""
    log_path = tmp_path / "desktop.log"
    log = log_path.open("wb")
    try:
        display, xvfb = start_xvfb(log=log)  # returns once Xvfb accepts clients
    except BaseException:
        log.close()
        print(log_path.read_text(errors="replace"))
        raise
    env = {**os.environ, "DISPLAY": display}
    env.pop("DBUS_SESSION_BUS_ADDRESS", None)
    processes = [xvfb]
    try:
        processes.append(subprocess.Popen(["trayer"], env=env, stdout=log, stderr=log))
        yield env
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(timeout=10)
        log.close()
        print(log_path.read_text(errors="replace"))  # shown by pytest when the test fails


@pytest.mark.gui
def test_an_xembed_tray_host_is_found(
    xembed_desktop: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in xembed_desktop.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    deadline = time.monotonic() + 20
    while probe().xembed.answer != "yes" and time.monotonic() < deadline:
        time.sleep(0.2)  # trayer takes the selection once it has started
    host = probe()
    assert host.xembed.answer == "yes" and "_NET_SYSTEM_TRAY_S0" in host.xembed.detail, host.xembed.detail
    status, report = doctor("--port", "0", env=xembed_desktop)
    assert status == 0 and by_name(report)["tray"]["details"]["answer"] == "yes"


def test_no_display_and_no_bus_means_no_tray(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("DISPLAY", "DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(key, raising=False)
    host = probe()
    assert (host.answer, host.xembed.answer, host.status_notifier.answer) == ("no", "no", "no")
