"""The budget's SimulatedDevice backed by the ledger file: what it plans against includes what other
processes took, and what it takes they see."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.device.conftest import GIB
from tray_app.budget.device import SimulatedDevice
from tray_app.device.ledger import Ledger


def test_a_ledger_backed_device_sees_other_processes(runtime_dir: Path) -> None:
    device = SimulatedDevice.on_ledger(4 * GIB)
    other = os.getppid()  # stands in for a separate process that took memory (alive all test long)
    try:
        assert Ledger().exists() and "simulated" in device.name
        device.take("gpu-worker", 1 * GIB)
        Ledger().take("comfyui", 1 * GIB, pid=other)
        reading = device.memory(exclude_labels=["gpu-worker"])
        assert (reading.kind, reading.simulated, reading.free_bytes) == ("simulated", True, 2 * GIB)
        assert reading.used_by_others_bytes == 1 * GIB  # our worker is not "others"; the other process is
        assert {(p.pid, p.name, p.used_bytes) for p in reading.processes} == {
            (os.getpid(), "gpu-worker", 1 * GIB),
            (other, f"comfyui (pid {other})", 1 * GIB),
        }
        assert device.held() == {"gpu-worker": 1 * GIB, f"comfyui (pid {other})": 1 * GIB}
        with pytest.raises(MemoryError, match=r"only 3\.00 GiB free"):
            device.take("gpu-worker", 3 * GIB + 1)
        assert Ledger().read().held_by(os.getpid()) == {"gpu-worker": 1 * GIB}  # seen from outside too
        assert device.release("gpu-worker") == 1 * GIB
    finally:
        device.close()
    assert not Ledger().exists()
    assert device.memory().free_bytes == 4 * GIB  # the device is gone: nothing is held any more


def test_without_a_ledger_it_stays_in_this_process(runtime_dir: Path) -> None:
    device = SimulatedDevice(4 * GIB)
    device.take("drill", 1 * GIB)
    device.close()
    assert device.ledger is None and not Ledger().exists() and device.held() == {"drill": 1 * GIB}
