"""Starting `failsoft` where it cannot work explains itself: no display, or the service's port taken."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.support.service import write_config
from tray_app.ui.app import display_problem

DISPLAY_VARS = ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")


def test_failsoft_without_display_points_to_serve() -> None:
    env = {key: value for key, value in os.environ.items() if key not in DISPLAY_VARS}
    result = subprocess.run(
        [sys.executable, "-m", "tray_app"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert "no display found" in result.stderr
    assert "failsoft serve" in result.stderr
    assert "Aborted" not in result.stderr and "qt.qpa" not in result.stderr


def test_a_display_with_no_x_server_is_named() -> None:
    problem = display_problem({"DISPLAY": ":987"}, platform="linux")
    assert problem is not None and "no X server answers on DISPLAY=:987" in problem


def test_offscreen_or_wayland_or_other_systems_are_left_to_qt() -> None:
    assert display_problem({"QT_QPA_PLATFORM": "offscreen"}, platform="linux") is None
    assert display_problem({"WAYLAND_DISPLAY": "wayland-0"}, platform="linux") is None
    assert display_problem({}, platform="darwin") is None


def test_wildcard_binds_are_reached_on_loopback() -> None:
    from tray_app.ui.app import local_url

    assert local_url("0.0.0.0", 8750) == "http://127.0.0.1:8750"
    assert local_url("192.168.1.5", 9000) == "http://192.168.1.5:9000"
    assert local_url("::1", 8750) == "http://[::1]:8750"


def test_taken_port_says_so_and_points_to_attach(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        write_config(tmp_path / "config.toml", {"server": {"port": port}})
        env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "FAILSOFT_CONFIG": str(tmp_path / "config.toml")}
        result = subprocess.run(
            [sys.executable, "-m", "tray_app", "--simulate-vram", "4GiB"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert result.returncode == 1, result.stderr
    assert f"the service could not start on 127.0.0.1:{port}" in result.stderr
    assert f"failsoft --attach http://127.0.0.1:{port}" in result.stderr
