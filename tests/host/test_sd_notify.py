"""The systemd notify protocol, against a real unix datagram socket standing in for systemd."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tray_app.host import sd_notify


def test_without_notify_socket_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sd_notify.notify("READY=1") is False


def test_ready_reaches_the_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(path))
        server.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        assert sd_notify.notify("READY=1\nSTATUS=serving") is True
        assert server.recv(1024) == b"READY=1\nSTATUS=serving"


def test_watchdog_interval_is_half_the_period(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sd_notify.watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert sd_notify.watchdog_interval() is None


@pytest.mark.integration
def test_serve_tells_systemd_ready_and_stopping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`failsoft serve` under a Type=notify unit: READY=1 once the workers are up, STOPPING=1 on SIGTERM."""
    from tests.support.service import running_service

    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind(str(path))
        systemd.settimeout(120)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        with running_service(tmp_path / "svc", settings={"cpu": {"threads": 1}}) as service:
            messages = [systemd.recv(1024).decode()]
            while not messages[-1].startswith("READY=1"):
                messages.append(systemd.recv(1024).decode())
            assert "gpu ready" in messages[-1] and "cpu ready" in messages[-1], messages
            assert service.status()["workers"]["gpu"]["state"] == "ready"
        assert systemd.recv(1024).decode() == "STOPPING=1"
