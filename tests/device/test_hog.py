"""`failsoft hog` as a real separate process: a watcher on the simulated GPU sees it, by pid and name,
within two polls of its taking, and sees it gone within two polls of its exit."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.device.conftest import GIB
from tray_app.contract.events import Event, OtherProcessAppeared, OtherProcessLeft
from tray_app.device.ledger import Ledger
from tray_app.device.sources import LedgerSource
from tray_app.device.watcher import DeviceWatcher

pytestmark = pytest.mark.integration

FAILSOFT = str(Path(sys.executable).with_name("failsoft"))
POLL_SECONDS = 0.5


async def test_a_hog_is_seen_within_two_polls_and_gone_after_sigterm(ledger: Ledger) -> None:
    events: list[Event] = []
    watcher = DeviceWatcher(LedgerSource(ledger), events.append, poll_seconds=POLL_SECONDS)
    watcher.start()
    hog = await asyncio.create_subprocess_exec(
        FAILSOFT, "hog", "3GiB", "--name", "comfyui", stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert hog.stdout is not None
        taken = (await asyncio.wait_for(hog.stdout.readline(), 60)).decode()
        assert f"comfyui (pid {hog.pid}) holds 3.00 GiB of simulated GPU" in taken
        polls = watcher.polls
        seen = await watcher.wait_for(lambda s: any(p.pid == hog.pid for p in s.processes), timeout=30)
        assert watcher.polls - polls <= 2
        (process,) = seen.others
        assert (process.label, process.used_bytes, process.own) == ("comfyui", 3 * GIB, False)
        assert seen.free_bytes == 5 * GIB
        appeared = [e for e in events if isinstance(e, OtherProcessAppeared)]
        assert [(e.pid, e.label, e.used_bytes) for e in appeared] == [(hog.pid, "comfyui", 3 * GIB)]

        hog.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(hog.wait(), 30) == 0
        polls = watcher.polls
        gone = await watcher.wait_for(lambda s: not s.processes, timeout=30)
        assert watcher.polls - polls <= 2 and gone.free_bytes == 8 * GIB
        left = [e for e in events if isinstance(e, OtherProcessLeft)]
        assert [(e.pid, e.label) for e in left] == [(hog.pid, "comfyui")]
        rest = (await hog.stdout.read()).decode()
        assert "comfyui gave back 3.00 GiB" in rest
    finally:
        if hog.returncode is None:
            hog.kill()
            await hog.wait()
        await watcher.stop()


def test_a_hog_killed_with_sigkill_leaves_nothing_held(ledger: Ledger) -> None:
    hog = subprocess.Popen([FAILSOFT, "hog", "2GiB", "--name", "game"], stdout=subprocess.PIPE, text=True)
    try:
        assert hog.stdout is not None and "holds 2.00 GiB" in hog.stdout.readline()
        assert ledger.read().held_by(hog.pid) == {"game": 2 * GIB}
    finally:
        hog.kill()
        hog.wait()
    assert ledger.read().holdings == ()


def test_a_hog_with_a_hold_time_gives_back_by_itself(ledger: Ledger) -> None:
    done = subprocess.run(
        [FAILSOFT, "hog", "1GiB", "--name", "blender", "--hold", "0.2"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "for 0.2 s" in done.stdout and "blender gave back 1.00 GiB" in done.stdout
    assert ledger.read().holdings == ()


def test_a_hog_refuses_without_room(ledger: Ledger) -> None:
    ledger.take("gpu", 6 * GIB)
    done = subprocess.run([FAILSOFT, "hog", "3GiB", "--name", "comfyui"], capture_output=True, text=True)
    assert done.returncode == 1
    assert "cannot take 3.00 GiB for 'comfyui', only 2.00 GiB free" in done.stderr
    assert ledger.read().held_by(ledger.read().owner_pid) == {"gpu": 6 * GIB}


def test_a_hog_refuses_without_a_simulated_gpu(runtime_dir: Path) -> None:
    done = subprocess.run([FAILSOFT, "hog", "1GiB", "--name", "comfyui"], capture_output=True, text=True)
    assert done.returncode == 1
    assert "no simulated GPU is running" in done.stderr and "--simulate-vram" in done.stderr
    assert not Ledger().exists()
