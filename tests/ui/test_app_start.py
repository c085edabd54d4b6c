"""Starting `failsoft` where it cannot work explains itself (no display, the service's port taken by another
program); where a Failsoft service took the port, the tray shows that one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.http_server import http_server
from tests.support.service import free_port, write_config
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


def test_a_port_taken_by_another_program_is_named_with_what_to_do(tmp_path: Path) -> None:
    with http_server(404) as port:
        write_config(tmp_path / "config.toml", {"server": {"port": port}})
        env = {
            **os.environ,
            "QT_QPA_PLATFORM": "offscreen",
            "FAILSOFT_CONFIG": str(tmp_path / "config.toml"),
            "FAILSOFT_DATA_DIR": str(tmp_path / "data"),
        }
        result = subprocess.run(
            [sys.executable, "-m", "tray_app", "--simulate-vram", "4GiB"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert result.returncode == 1, result.stderr
    assert f"another program answers at http://127.0.0.1:{port} (HTTP 404)" in result.stderr
    assert "[server] port" in result.stderr and "Traceback" not in result.stderr


def _tray(tmp_path: Path, settings: dict[str, object], *args: str) -> subprocess.CompletedProcess[str]:
    """`failsoft` (the tray, offscreen) with `settings` as its config, its files under `tmp_path`."""
    write_config(tmp_path / "config.toml", settings)
    env = {
        **os.environ,
        "QT_QPA_PLATFORM": "offscreen",
        "FAILSOFT_CONFIG": str(tmp_path / "config.toml"),
        "FAILSOFT_DATA_DIR": str(tmp_path / "data"),
    }
    return subprocess.run(
        [sys.executable, "-m", "tray_app", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_service_that_cannot_start_ends_the_tray_with_why(tmp_path: Path) -> None:
    """It used to leave the tray saying "Starting the service…" for ever, a traceback on stderr."""
    missing = tmp_path / "nowhere" / "model.gguf"
    port = free_port()
    done = _tray(tmp_path, {"server": {"port": port}, "model": {"path": str(missing)}})
    assert done.returncode == 1, done.stderr
    expected = (
        f"failsoft: the service could not start on http://127.0.0.1:{port}: {missing}: model file not found"
    )
    assert expected in done.stderr
    assert "Traceback" not in done.stderr


def test_a_config_error_is_named(tmp_path: Path) -> None:
    done = _tray(tmp_path, {"server": {"port": "not a port"}})
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"failsoft: {tmp_path / 'config.toml'}") and "port" in done.stderr
    assert "Traceback" not in done.stderr
