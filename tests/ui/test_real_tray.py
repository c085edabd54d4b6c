"""The real tray on a real (virtual) desktop: Xvfb, the XEmbed tray host `trayer`, and the `failsoft`
command.

The test drives the desktop as a person would (a right click on the icon, the menu's keyboard mnemonics,
typing into the chat window) and reads back what the tray shows from the state file it writes when
FAILSOFT_UI_AUTOMATION is set. Screenshots go to test-artifacts/screenshots/; with
FAILSOFT_UPDATE_SCREENSHOTS=1 the cropped ones are also copied to docs/screenshots/ for the README.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.support.display import start_xvfb
from tests.support.service import free_port, running_service, stop_process_tree, write_config
from tests.support.waits import wait_until
from tray_app.reach import admin_token

pytestmark = pytest.mark.gui

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "screenshots"
DOCS_SCREENSHOTS = REPO / "docs" / "screenshots"
SCREEN = (1100, 720)
START_TIMEOUT = 150.0


@dataclass
class Desktop:
    display: str
    env: dict[str, str]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def run(self, *command: str) -> str:
        result = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=30, check=True)
        return result.stdout

    def screenshot(self, name: str, crop: tuple[int, int, int, int] | None = None) -> Path:
        """The whole screen to <name>-screen.png and, with `crop` (x, y, w, h), that part to <name>.png."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        screen = ARTIFACTS / f"{name}-screen.png"
        self.run("import", "-window", "root", str(screen))
        if crop is None:
            return screen
        x, y, width, height = crop
        x, y = max(x, 0), max(y, 0)
        width, height = min(width, SCREEN[0] - x), min(height, SCREEN[1] - y)
        target = ARTIFACTS / f"{name}.png"
        self.run("convert", str(screen), "-crop", f"{width}x{height}+{x}+{y}", "+repage", str(target))
        if os.environ.get("FAILSOFT_UPDATE_SCREENSHOTS"):
            DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(target, DOCS_SCREENSHOTS / target.name)
        return target


@pytest.fixture
def desktop(tmp_path: Path) -> Iterator[Desktop]:
    """Xvfb with a soft background and trayer as a full-width top panel."""
    log = (tmp_path / "desktop.log").open("wb")
    try:
        display, xvfb = start_xvfb("-screen", "0", f"{SCREEN[0]}x{SCREEN[1]}x24", log=log)
    except BaseException:
        log.close()
        raise
    env = {
        key: value for key, value in os.environ.items() if key not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")
    }
    env["DISPLAY"] = display
    desk = Desktop(display, env, [xvfb])
    try:
        background = tmp_path / "background.png"
        desk.run("convert", "-size", f"{SCREEN[0]}x{SCREEN[1]}", "gradient:#e9eef3-#c3cfdb", str(background))
        # display sets the root window's background and exits non-zero by design; the screenshots show it.
        subprocess.run(["display", "-window", "root", str(background)], env=env, timeout=30, check=False)
        trayer = [
            "trayer", "--edge", "top", "--align", "right", "--widthtype", "percent", "--width", "100",
            "--height", "30", "--transparent", "true", "--alpha", "0", "--tint", "0x2b3038",
            "--SetDockType", "true", "--SetPartialStrut", "true",
        ]  # fmt: skip
        desk.processes.append(subprocess.Popen(trayer, env=env, stdout=log, stderr=log))
        wait_until(lambda: panel_window(desk), 20, "trayer's panel window")
        yield desk
    finally:
        for process in reversed(desk.processes):
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        log.close()


def panel_window(desktop: Desktop) -> str:
    return desktop_window(desktop, "^panel$")


def desktop_window(desktop: Desktop, name: str) -> str:
    """The first window whose name matches `name` (a regular expression), or ""."""
    try:
        return desktop.run("xdotool", "search", "--name", name).split()[0]
    except (subprocess.CalledProcessError, IndexError):
        return ""


def embedded_icon_windows(desktop: Desktop) -> list[str]:
    """Windows named Failsoft inside trayer's panel window: the XEmbed-docked tray icon."""
    tree = desktop.run("xwininfo", "-tree", "-id", panel_window(desktop))
    return [line.strip() for line in tree.splitlines() if '"Failsoft"' in line]


@dataclass
class Tray:
    process: subprocess.Popen[bytes]
    state_file: Path
    base_url: str
    desktop: Desktop
    data_dir: Path | None = None  # where its in-process service keeps its admin token

    def headers(self) -> dict[str, str]:
        return admin_token.headers(admin_token.read(admin_token.token_path(self.data_dir)))

    def state(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.state_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        assert self.process.poll() is None, f"failsoft exited with {self.process.returncode}"
        return data

    def icon_center(self) -> tuple[int, int]:
        x, y, width, height = self.state()["tray_geometry"]
        return x + width // 2, y + height // 2

    def open_menu(self) -> dict[str, Any]:
        x, y = self.icon_center()
        self.desktop.run("xdotool", "mousemove", str(x), str(y), "click", "3")
        return wait_until(lambda: self.state().get("menu_geometry") and self.state(), 15, "the tray menu")

    def choose(self, mnemonic: str) -> None:
        """Open the menu and pick an entry by its underlined letter."""
        self.open_menu()
        self.desktop.run("xdotool", "key", mnemonic)
        wait_until(lambda: not self.state().get("menu_visible"), 10, "the menu to close")

    def window(self, name: str) -> list[int]:
        geometry: list[int] = wait_until(
            lambda: self.state().get("windows", {}).get(name), 15, f"the {name} window"
        )
        return geometry


@pytest.fixture
def tray(desktop: Desktop, tmp_path: Path) -> Iterator[Tray]:
    port = free_port()
    config_path = tmp_path / "config.toml"
    write_config(
        config_path,
        {
            "server": {"port": port},
            "cpu": {"threads": 1},  # on a busy 2-core machine, two OpenMP threads per worker thrash
            # A 2048-token GPU profile: long background jobs need the CPU and wait for approval, while a
            # short replay after a GPU failure (at most 30 s on the CPU) is approved automatically.
            "budget": {"max_ctx": 2048},
            "failover": {"fallback": "approval", "cpu_tokens_per_second": 40.0, "auto_approve_seconds": 30.0},
        },
    )
    automation = tmp_path / "automation"
    env = {
        **desktop.env,
        "FAILSOFT_CONFIG": str(config_path),
        "FAILSOFT_DATA_DIR": str(tmp_path / "data"),
        "FAILSOFT_LOG_DIR": str(tmp_path / "logs"),
        "FAILSOFT_UI_AUTOMATION": str(automation),
        "PYTHONUNBUFFERED": "1",
    }
    command = [str(Path(sys.executable).parent / "failsoft"), "--simulate-vram", "4GiB", "--enable-faults"]
    output = (tmp_path / "failsoft.log").open("wb")
    process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
    handle = Tray(
        process, automation / "ui-state.json", f"http://127.0.0.1:{port}", desktop, tmp_path / "data"
    )
    try:
        yield handle
    finally:
        stop_process_tree(process)
        output.close()


def submit_long_job(base_url: str, text: str, max_tokens: int) -> str:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
    response = httpx.post(f"{base_url}/v1/jobs", json=body, timeout=30)
    assert response.status_code == 202, response.text
    assert response.json()["state"] == "awaiting_approval"
    job_id: str = response.json()["id"]
    return job_id


def test_tray_icon_menu_approvals_and_chat_on_a_real_desktop(desktop: Desktop, tray: Tray) -> None:
    state = wait_until(
        lambda: (
            (s := tray.state()).get("workers") == {"gpu": "ready", "cpu": "ready"}
            and s.get("level") == "serving"
            and s.get("events_connected")
            and s
        ),
        START_TIMEOUT,
        "the tray to show the GPU serving and both workers ready",
    )
    # The icon is really docked in the tray host, where Qt says it is.
    assert state["tray_available"] and state["tray_visible"]
    assert embedded_icon_windows(desktop), desktop.run("xwininfo", "-root", "-tree")
    x, y, width, height = state["tray_geometry"]
    assert width > 0 and height > 0 and y < 30 and x > SCREEN[0] // 2
    assert state["simulated"] and "simulated 4.00 GiB" in state["tooltip"]
    workers = {process.pid for process in psutil.Process(tray.process.pid).children(recursive=True)}
    assert len(workers) >= 2  # the GPU and CPU workers of the in-process service

    menu = tray.open_menu()["menu_geometry"]
    mx, my, _width, mh = menu
    desktop.screenshot("tray-menu", (mx - 16, 0, SCREEN[0] - mx + 16, my + mh + 16))
    desktop.run("xdotool", "key", "Escape")
    wait_until(lambda: not tray.state().get("menu_visible"), 10, "the menu to close")

    submit_long_job(tray.base_url, "Summarise the attached meeting notes into a one-page brief.", 3000)
    submit_long_job(tray.base_url, "Translate the user manual for the heat pump into French.", 2400)
    wait_until(lambda: "Approval needed" in tray.state().get("notices", []), 20, "the approval message")
    bx, by, bw, bh = wait_until(lambda: tray.state().get("message_geometry"), 10, "the message balloon")
    desktop.screenshot("notification", (bx - 16, 0, SCREEN[0] - bx + 16, by + bh + 16))
    # Clicking the message opens the approvals window.
    desktop.run("xdotool", "mousemove", str(bx + bw // 2), str(by + bh // 2), "click", "1")
    ax, ay, aw, ah = tray.window("approvals")
    wait_until(lambda: tray.state().get("approvals_rows") == 2, 15, "two jobs in the approvals window")
    desktop.screenshot("approvals", (ax, ay, aw, ah))

    tray.choose("c")
    cx, cy, cw, ch = tray.window("chat")
    # No window manager hands out focus: the pointer over the input box gives it the keyboard.
    desktop.run("xdotool", "mousemove", str(cx + cw // 2), str(cy + ch - 80), "click", "1")
    desktop.run("xdotool", "type", "--delay", "15", "In one sentence: what does a GPU do?")
    desktop.run("xdotool", "key", "ctrl+Return")
    badges = wait_until(lambda: [b for b in tray.state().get("chat_badges", []) if b], 150, "the chat answer")
    assert badges[0].startswith("GPU (simulated)"), badges
    # A drill: the GPU worker aborts mid-answer (as on a CUDA error); the answer finishes on the CPU.
    armed = httpx.post(
        f"{tray.base_url}/failsoft/debug/faults",
        json={"kind": "abort", "after_tokens": 6},
        timeout=30,
        headers=tray.headers(),
    )
    assert armed.status_code == 200, armed.text
    desktop.run("xdotool", "type", "--delay", "15", "And what does a CPU do?")
    desktop.run("xdotool", "key", "ctrl+Return")
    badges = wait_until(
        lambda: [b for b in tray.state().get("chat_badges", []) if b][1:], 150, "the answer after the failure"
    )
    assert badges[0].startswith("Failed over to CPU: GPU worker crashed · "), badges
    desktop.screenshot("chat", (cx, cy, cw, ch))

    tray.choose("q")
    assert tray.process.wait(timeout=60) == 0
    wait_until(lambda: not any(psutil.pid_exists(pid) for pid in workers), 20, "the workers to exit")


def test_the_tray_started_beside_a_running_service_shows_it_and_a_second_start_opens_its_chat(
    desktop: Desktop, tmp_path: Path
) -> None:
    """The README's home-server set-up: `failsoft serve` as a systemd unit, and the tray started at login."""
    with running_service(tmp_path / "service", settings={"cpu": {"threads": 1}}) as svc:
        automation = tmp_path / "automation"
        port = int(svc.base_url.rsplit(":", 1)[1])
        write_config(tmp_path / "tray.toml", {"server": {"port": port}})  # the unit's address
        env = {
            **desktop.env,
            "FAILSOFT_CONFIG": str(tmp_path / "tray.toml"),
            "FAILSOFT_DATA_DIR": str(tmp_path / "tray-data"),
            "FAILSOFT_ADMIN_TOKEN": svc.admin_token,  # the unit's, readable by the user's group
            "FAILSOFT_LOG_DIR": str(tmp_path / "tray-logs"),
            "FAILSOFT_UI_AUTOMATION": str(automation),
            "PYTHONUNBUFFERED": "1",
        }
        command = [str(Path(sys.executable).parent / "failsoft")]
        output = (tmp_path / "tray.log").open("wb")
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
        tray = Tray(process, automation / "ui-state.json", svc.base_url, desktop)
        try:
            state = wait_until(
                lambda: (s := tray.state()).get("level") == "serving" and s.get("events_connected") and s,
                START_TIMEOUT,
                "the tray to show the running service",
            )
            assert state["attached"] and state["tray_visible"] and not state["windows"]
            assert not psutil.Process(process.pid).children(recursive=True)  # no service of its own

            again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
            assert again.returncode == 0, again.stderr
            assert f"Failsoft's tray for {svc.base_url} is already running; it opens its chat window" in (
                again.stdout
            )
            tray.window("chat")

            tray.choose("q")  # "Quit tray (service keeps running)"
            assert process.wait(timeout=60) == 0
            assert svc.status()["workers"]["gpu"]["state"] == "ready"
        finally:
            stop_process_tree(process)
            output.close()


def test_a_start_from_the_desktop_that_cannot_go_on_says_why_in_a_window(
    desktop: Desktop, tmp_path: Path
) -> None:
    """Started from a menu, nobody reads stderr: the reason is shown, and the tray ends when it is read."""
    write_config(tmp_path / "config.toml", {"server": {"port": "not a port"}})
    env = {
        **desktop.env,
        "FAILSOFT_CONFIG": str(tmp_path / "config.toml"),
        "FAILSOFT_DATA_DIR": str(tmp_path / "data"),
    }
    command = [str(Path(sys.executable).parent / "failsoft")]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        window = wait_until(
            lambda: desktop_window(desktop, "Failsoft could not start"), 60, "the message box"
        )
        geometry = dict(
            line.split("=", 1)
            for line in desktop.run("xdotool", "getwindowgeometry", "--shell", window).split()
        )
        x, y, width, height = (int(geometry[key]) for key in ("X", "Y", "WIDTH", "HEIGHT"))
        desktop.screenshot("cannot-start", (x, y, width, height))
        # No window manager hands out focus: a click gives the box the keyboard, Return presses its OK.
        desktop.run("xdotool", "mousemove", str(x + width // 2), str(y + 10), "click", "1")
        desktop.run("xdotool", "key", "Return")
        _out, err = process.communicate(timeout=30)
    finally:
        stop_process_tree(process)
    assert process.returncode == 2, err
    assert err.startswith(f"failsoft: {tmp_path / 'config.toml'}") and "port" in err
