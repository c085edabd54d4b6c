"""The VRAM timeline window on a real (virtual) desktop, over a real service's history: a program appears
on the simulated GPU, the GPU is yielded to another, a worker is killed and the GPU comes back; the window
shows the bands, the reserve line and the markers. The screenshot goes to test-artifacts/screenshots/ (and,
with FAILSOFT_UPDATE_SCREENSHOTS=1, to docs/screenshots/timeline.png)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.fake_worker import fake_llama_server
from tests.support.helpers import arm, base_settings, client_for
from tests.support.hog import hog
from tests.support.service import running_service
from tests.support.waits import wait_until
from tests.ui.test_real_tray import Desktop, desktop

pytestmark = pytest.mark.gui
__all__ = ["desktop"]  # the fixture, used by name

CHAT = {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}


def visible_window(desktop: Desktop, name: str) -> str:
    """The first mapped window whose name matches `name`, or "" (Qt keeps unmapped helpers of one name)."""
    try:
        return desktop.run("xdotool", "search", "--onlyvisible", "--name", name).split()[0]
    except (subprocess.CalledProcessError, IndexError):
        return ""


def gpu_path(base_url: str) -> str:
    return str(httpx.get(base_url + "/failsoft/status", timeout=10).json()["gpu_path"]["state"])


def test_the_timeline_window_shows_what_happened_on_the_gpu(desktop: Desktop, tmp_path: Path) -> None:
    engine = fake_llama_server(tmp_path, token_delay=0.02)
    settings = base_settings(
        engine={"llama_server": str(engine)},
        device={"poll_seconds": 0.5},
        gpu={"yield_to": ["comfyui"], "return_after": 2.0},
    )
    with running_service(
        tmp_path / "service", enable_faults=True, settings=settings, ready_timeout=30
    ) as svc:
        client = client_for(svc)
        client.chat.completions.create(**CHAT)
        time.sleep(3)
        with hog(svc, "768MiB", "blender"):
            time.sleep(3)
            arm(svc, "kill")  # a restart marker; it comes back with the blender still there
            svc.wait_workers_ready()
            time.sleep(2)
            with hog(svc, "2GiB", "comfyui"):
                wait_until(lambda: gpu_path(svc.base_url) == "yielded", 20, "the yield")
                client.chat.completions.create(**CHAT)  # on the CPU meanwhile
                time.sleep(4)
        wait_until(lambda: svc.status()["workers"]["gpu"]["state"] == "ready", 30, "the GPU back")
        time.sleep(3)
        log = (tmp_path / "timeline.log").open("wb")
        window = subprocess.Popen(
            [sys.executable, "-m", "tray_app.ui.timeline_window", svc.base_url],
            env=desktop.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            found = wait_until(lambda: visible_window(desktop, "VRAM timeline"), 30, "the timeline window")
            time.sleep(3)  # its first fetch and drawing
            assert window.poll() is None, (tmp_path / "timeline.log").read_text()
            geometry = desktop.run("xdotool", "getwindowgeometry", "--shell", found)
            values = dict(line.split("=") for line in geometry.split())
            x, y, width, height = (int(values[key]) for key in ("X", "Y", "WIDTH", "HEIGHT"))
            shot = desktop.screenshot("timeline", (x, y, width, height))
            assert shot.stat().st_size > 10_000  # a drawn plot, not an empty window
            history = httpx.get(svc.base_url + "/failsoft/device/history", timeout=10).json()
            kinds = {marker["kind"] for marker in history["markers"]}
            assert {"restart", "load", "path"} <= kinds
        finally:
            window.terminate()
            window.wait(timeout=10)
            log.close()
