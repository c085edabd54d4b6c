"""The simulated GPU's ledger file: taking and giving back, who may own it, dead holders dropped, and
separate processes taking at once without losing or overfilling anything."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.device.conftest import GIB, MIB
from tests.device.takers import take_many, take_one_slot
from tests.support.waits import wait_until
from tray_app.device.ledger import (
    LEDGER_FILE,
    Ledger,
    LedgerBusy,
    NoSimulatedDevice,
    is_alive,
    process_start,
)


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(done.stdout)


def test_take_replace_and_release(ledger: Ledger, runtime_dir: Path) -> None:
    assert ledger.path == runtime_dir / LEDGER_FILE
    state = ledger.take("gpu", 3 * GIB)
    assert (state.used_bytes, state.free_bytes) == (3 * GIB, 5 * GIB)
    ledger.take("gpu", 2 * GIB)  # a label holds one amount: taking again replaces it
    ledger.take("pressure", 1 * GIB)
    read = ledger.read()
    assert read.held_by(os.getpid()) == {"gpu": 2 * GIB, "pressure": 1 * GIB}
    assert "simulated" in read.name and read.total_bytes == 8 * GIB
    with pytest.raises(MemoryError, match=r"only 5\.00 GiB free"):
        ledger.take("big", 6 * GIB)
    assert ledger.release("gpu") == 2 * GIB
    assert ledger.release("gpu") == 0
    assert ledger.read().used_bytes == 1 * GIB
    assert ledger.release_all(os.getpid()) == 1 * GIB
    assert ledger.read().holdings == ()


def test_the_file_says_simulated_and_is_replaced_whole(ledger: Ledger) -> None:
    ledger.take("gpu", 1 * GIB)
    data = json.loads(ledger.path.read_text())
    assert data["simulated"] is True and "simulated" in data["name"]
    assert [(h["pid"], h["label"], h["bytes"]) for h in data["holdings"]] == [(os.getpid(), "gpu", 1 * GIB)]
    # Writes go through a temporary file and a rename: none is left behind.
    assert sorted(p.name for p in ledger.path.parent.iterdir()) == [LEDGER_FILE, LEDGER_FILE + ".lock"]


def test_a_device_name_always_says_simulated(runtime_dir: Path) -> None:
    ledger = Ledger()
    assert ledger.create(1 * GIB, name="RTX 4090").name == "simulated RTX 4090"


def test_no_ledger_means_no_simulated_device(runtime_dir: Path) -> None:
    ledger = Ledger()
    assert not ledger.exists()
    with pytest.raises(NoSimulatedDevice, match="no simulated GPU is running"):
        ledger.take("hog", 1 * MIB)
    assert ledger.release("hog") == 0  # nothing to give back to a device that is gone


def test_a_ledger_whose_owner_died_is_no_device_and_may_be_taken_over(runtime_dir: Path) -> None:
    stale = Ledger()
    stale.create(4 * GIB, owner_pid=_dead_pid())
    with pytest.raises(NoSimulatedDevice, match="that ran it is gone"):
        stale.read()
    state = Ledger().create(2 * GIB)  # a new service starts over it
    assert (state.owner_pid, state.total_bytes, state.holdings) == (os.getpid(), 2 * GIB, ())


def test_a_live_owner_keeps_its_ledger(runtime_dir: Path) -> None:
    parent = os.getppid()  # alive for the whole test
    Ledger().create(4 * GIB, owner_pid=parent)
    with pytest.raises(LedgerBusy):
        Ledger().create(2 * GIB)
    assert not Ledger().remove()  # only the owner removes it
    assert Ledger().remove(owner_pid=parent)
    assert not Ledger().exists()


def test_the_owner_resizing_keeps_live_holdings(ledger: Ledger) -> None:
    ledger.take("gpu", 1 * GIB)
    state = ledger.create(12 * GIB)
    assert state.total_bytes == 12 * GIB and state.held_by(os.getpid()) == {"gpu": 1 * GIB}


def test_liveness_tells_a_reused_pid_and_a_dead_one() -> None:
    me = os.getpid()
    started = process_start(me)
    assert started is not None and is_alive(me, started) and is_alive(me, None)
    assert not is_alive(me, started - 100)  # same pid, another process's start: the holder is gone
    assert not is_alive(_dead_pid(), None)
    assert not is_alive(0, None)


def test_holdings_of_dead_pids_are_dropped_when_read(ledger: Ledger) -> None:
    ledger.take("reused", 1 * GIB)
    ledger.take("gone", 2 * GIB, pid=_dead_pid())
    data = json.loads(ledger.path.read_text())
    assert [h["label"] for h in data["holdings"]] == ["reused", "gone"]  # in the file, until read
    # Forge the first holding's start time: this pid, but not the process that took it.
    data["holdings"][0]["started"] -= 100
    ledger.path.write_text(json.dumps(data))
    state = ledger.read()
    assert state.holdings == () and state.free_bytes == 8 * GIB
    ledger.take("mine", 8 * GIB)  # the dead holders' memory is free to take


@pytest.mark.integration
def test_a_holder_killed_with_sigkill_frees_its_memory(ledger: Ledger) -> None:
    code = (
        "import sys, time; from pathlib import Path; from tray_app.device.ledger import Ledger;"
        "Ledger(Path(sys.argv[1])).take('comfyui', 6 * 1024**3); print('taken', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(ledger.path)], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "taken"
        assert ledger.read().held_by(holder.pid) == {"comfyui": 6 * GIB}
        with pytest.raises(MemoryError):
            ledger.take("gpu", 4 * GIB)
        holder.send_signal(signal.SIGKILL)
        # Not reaped yet, a zombie holds nothing: a driver frees a process's memory when it exits.
        wait_until(lambda: not ledger.read().holdings, timeout=10, what="the killed holder's memory freed")
    finally:
        holder.kill()
        holder.wait()
    ledger.take("gpu", 4 * GIB)


@pytest.mark.integration
def test_processes_taking_at_once_never_overfill_it(runtime_dir: Path) -> None:
    """Ten processes race for five 1 MiB slots: exactly five get one. Without the lock, several would
    read the same free space and all write it as theirs."""
    ledger = Ledger()
    ledger.create(5 * MIB)
    spawn = multiprocessing.get_context("spawn")
    start, release = spawn.Event(), spawn.Event()
    results = spawn.Queue()
    takers = [
        spawn.Process(target=take_one_slot, args=(str(ledger.path), MIB, start, release, results))
        for _ in range(10)
    ]
    for taker in takers:
        taker.start()
    try:
        start.set()
        outcomes = [results.get(timeout=60) for _ in takers]
        winners = {pid for pid, fitted in outcomes if fitted}
        assert len(winners) == 5
        state = ledger.read()
        assert state.used_bytes == 5 * MIB and {h.pid for h in state.holdings} == winners
    finally:
        release.set()
        for taker in takers:
            taker.join(timeout=60)
    assert all(taker.exitcode == 0 for taker in takers)
    assert ledger.read().holdings == ()


@pytest.mark.integration
def test_processes_writing_at_once_lose_no_holding(runtime_dir: Path) -> None:
    ledger = Ledger()
    ledger.create(1 * GIB)
    spawn = multiprocessing.get_context("spawn")
    start, release = spawn.Event(), spawn.Event()
    done = spawn.Queue()
    takers = [
        spawn.Process(target=take_many, args=(str(ledger.path), 25, start, release, done)) for _ in range(4)
    ]
    for taker in takers:
        taker.start()
    try:
        start.set()
        pids = {done.get(timeout=60) for _ in takers}
        state = ledger.read()
        assert {(h.pid, h.label) for h in state.holdings} == {
            (pid, f"label-{index}") for pid in pids for index in range(25)
        }
    finally:
        release.set()
        for taker in takers:
            taker.join(timeout=60)
    assert ledger.read().holdings == ()  # each taker exited: its holdings went with it
