"""The real tray runs the service as its child process: a crash of the service (SIGKILL here, as the kernel
would end it after a segfault in llama.cpp) leaves the tray running; it starts the service again within
seconds and says so, the background jobs the crashed run had accepted complete once each, and no native
inference code is loaded in the tray's own process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support.helpers import COUNTING
from tests.support.service import free_port, stop_process_tree, write_config
from tests.support.waits import wait_until
from tests.ui import test_real_tray as real_tray
from tests.ui.test_real_tray import START_TIMEOUT, Desktop, Tray
from tray_app.server.http import JOB_TOKEN_HEADER

pytestmark = pytest.mark.gui

desktop = real_tray.desktop  # the same Xvfb desktop with trayer as its panel
RESTART_LIMIT_S = 5.0
JOBS = 6
FINAL = {"completed", "failed", "cancelled", "rejected"}
NATIVE_LIBRARIES = ("libllama", "libggml", "libcuda", "llama_cpp")


@pytest.fixture
def tray(desktop: Desktop, tmp_path: Path) -> Iterator[Tray]:
    """`python -m tray_app --simulate-vram 2GiB` with its own config, data, log and runtime folders."""
    port = free_port()
    config_path = tmp_path / "config.toml"
    write_config(config_path, {"server": {"port": port}, "cpu": {"threads": 1}, "budget": {"max_ctx": 2048}})
    automation = tmp_path / "automation"
    env = {
        **desktop.env,
        "FAILSOFT_CONFIG": str(config_path),
        "FAILSOFT_DATA_DIR": str(tmp_path / "data"),
        "FAILSOFT_LOG_DIR": str(tmp_path / "logs"),
        "FAILSOFT_RUNTIME_DIR": str(tmp_path / "run"),
        "FAILSOFT_UI_AUTOMATION": str(automation),
        "PYTHONUNBUFFERED": "1",
    }
    output = (tmp_path / "failsoft.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "tray_app", "--simulate-vram", "2GiB"],
        env=env,
        stdout=output,
        stderr=subprocess.STDOUT,
    )
    try:
        yield Tray(
            process, automation / "ui-state.json", f"http://127.0.0.1:{port}", desktop, tmp_path / "data"
        )
    finally:
        stop_process_tree(process)
        output.close()


def service_pid(tray: Tray) -> int:
    """The service's pid: from its status (`service.pid`) where it reports it, else the port's listener."""
    run = httpx.get(f"{tray.base_url}/failsoft/status", timeout=10).json().get("service")
    if isinstance(run, dict) and isinstance(run.get("pid"), int):
        return int(run["pid"])
    port = int(tray.base_url.rsplit(":", 1)[1])
    for process in psutil.Process(tray.process.pid).children(recursive=True):
        try:
            sockets = process.net_connections(kind="tcp")
        except psutil.Error:
            continue
        if any(s.status == psutil.CONN_LISTEN and s.laddr.port == port for s in sockets):
            return process.pid
    raise AssertionError(f"nothing the tray started listens on port {port}")


def health_answers(base_url: str) -> bool:
    try:
        httpx.get(f"{base_url}/health", timeout=0.5)
    except httpx.HTTPError:
        return False
    return True


def mapped_native_libraries(pid: int) -> list[str]:
    maps = Path(f"/proc/{pid}/maps").read_text(encoding="utf-8", errors="replace")
    return sorted(
        {line.split()[-1] for line in maps.splitlines() if any(n in line for n in NATIVE_LIBRARIES)}
    )


def test_a_killed_service_is_started_again_by_the_tray_which_says_so(tray: Tray, tmp_path: Path) -> None:
    wait_until(
        lambda: (s := tray.state()).get("level") == "serving" and s.get("events_connected"),
        START_TIMEOUT,
        "the tray to show its service serving",
    )
    assert not tray.state()["attached"]  # the tray started this service: it is its child
    old = service_pid(tray)
    assert old != tray.process.pid
    assert old in {p.pid for p in psutil.Process(tray.process.pid).children()}
    assert os.getpgid(old) == old  # a process group of its own
    accepted: dict[str, str] = {}  # job id -> its read token
    for number in range(JOBS):
        response = httpx.post(
            f"{tray.base_url}/v1/jobs",
            json={**COUNTING, "max_tokens": 120},
            headers={"Idempotency-Key": f"tray-crash-{number}"},
            timeout=30,
        )
        assert response.status_code == 202, response.text
        accepted[response.json()["id"]] = response.json()["read_token"]
    time.sleep(1.5)  # some of them run, the others wait for a slot

    os.kill(old, signal.SIGKILL)
    killed_at = time.monotonic()
    lines: set[str] = set()

    def answers_again() -> bool:
        lines.add(str(tray.state().get("service_line") or ""))  # the tray is still alive: state() checks
        return health_answers(tray.base_url)

    wait_until(answers_again, RESTART_LIMIT_S, "a new service to answer /health after the kill")
    took = time.monotonic() - killed_at
    assert took <= RESTART_LIMIT_S, took
    assert tray.process.poll() is None
    assert "The service stopped (signal 9); restarting…" in lines, lines

    state = wait_until(
        lambda: (s := tray.state()).get("service_line", "").startswith("The service restarted") and s,
        30,
        "the tray to show the restart",
    )
    assert state["service_line"].endswith("(signal 9)"), state["service_line"]
    assert state["service_line"] in state["tooltip"]
    wait_until(lambda: "Failsoft service restarted" in tray.state().get("notices", []), 15, "the message")
    new = service_pid(tray)
    assert new != old and not psutil.pid_exists(old)
    wait_until(lambda: tray.state().get("level") == "serving", START_TIMEOUT, "the new service to serve")

    final: dict[str, dict[str, object]] = {}

    def all_final() -> bool:
        for job_id, token in accepted.items():
            if job_id not in final:
                answer = httpx.get(
                    f"{tray.base_url}/v1/jobs/{job_id}", headers={JOB_TOKEN_HEADER: token}, timeout=10
                )
                if answer.status_code == 200 and answer.json()["state"] in FINAL:
                    final[job_id] = answer.json()
        return len(final) == JOBS

    wait_until(all_final, 300, f"the {JOBS} jobs the crashed run accepted to end")
    for job_id, job in final.items():
        assert job["state"] == "completed", (job_id, job.get("error"))
        outcomes = [attempt["outcome"] for attempt in job["attempt_log"]]  # type: ignore[attr-defined]
        assert outcomes.count("completed") == 1, (job_id, outcomes)  # run to its end once

    log = (tmp_path / "logs" / "service.log").read_text(encoding="utf-8", errors="replace")
    assert f"failsoft serve (pid {old}) ended unasked: signal 9 (SIGKILL)" in log
    assert "listening on" in log  # the service's own output goes to its log file
    # The tray runs no native inference code: a crash there cannot take the tray with it.
    assert mapped_native_libraries(tray.process.pid) == []

    tray.process.send_signal(signal.SIGTERM)  # as a logout would: the tray stops the service it started
    assert tray.process.wait(timeout=60) == 0
    wait_until(lambda: not psutil.pid_exists(new), 20, "the service to end with the tray")
