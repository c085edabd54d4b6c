"""One tray per service address: a second start asks the first to show its chat window and exits; a tray
that crashed leaves nothing that keeps the next one out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tray_app.ui.single_instance import TrayInstance

URL = "http://127.0.0.1:8750"


def test_the_second_start_for_an_address_shows_the_first_one(tmp_path: Path, qtbot: Any) -> None:
    first = TrayInstance(URL, tmp_path)
    second = TrayInstance(URL, tmp_path)
    try:
        assert first.claim()
        assert not second.claim()
        with qtbot.waitSignal(first.activated, timeout=5000):
            assert second.activate_running()
    finally:
        first.release()
    third = TrayInstance(URL, tmp_path)  # the first one quit: the next start is the tray
    assert third.claim()
    third.release()


def test_trays_for_other_addresses_do_not_meet(tmp_path: Path) -> None:
    here, there = TrayInstance(URL, tmp_path), TrayInstance("http://127.0.0.1:9000", tmp_path)
    try:
        assert here.claim() and there.claim()
    finally:
        here.release()
        there.release()


def test_a_tray_that_was_killed_does_not_keep_the_next_one_out(tmp_path: Path, qtbot: Any) -> None:
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from PySide6.QtCore import QCoreApplication\n"
        "from tray_app.ui.single_instance import TrayInstance\n"
        "app = QCoreApplication([])\n"
        "tray = TrayInstance(sys.argv[1], Path(sys.argv[2]))\n"
        "print(tray.claim(), flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, URL, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "True"
        assert not TrayInstance(URL, tmp_path).claim()  # alive: its lock holds
        child.kill()  # no clean exit: the lock file and the socket stay behind
        child.wait(timeout=10)
        assert any(tmp_path.iterdir())
        after = TrayInstance(URL, tmp_path)
        assert after.claim()  # the dead owner's lock is stale, its socket replaced
        try:
            with qtbot.waitSignal(after.activated, timeout=5000):
                assert TrayInstance(URL, tmp_path).activate_running()
        finally:
            after.release()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
