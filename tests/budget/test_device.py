"""Device memory: the simulated GPU's ledger, the NVML probe as it really behaves here, and system RAM."""

from __future__ import annotations

import ctypes.util
import threading

import pytest

from tray_app.budget.device import (
    AbsentDevice,
    NvmlDevice,
    SimulatedDevice,
    nvml_memory,
    probe_gpu,
    system_ram,
)
from tray_app.config import DeviceConfig

GIB = 1024**3
MIB = 1024**2


def test_simulated_device_is_a_ledger() -> None:
    device = SimulatedDevice(4 * GIB)
    empty = device.memory()
    assert (empty.kind, empty.simulated, empty.total_bytes, empty.free_bytes) == (
        "simulated",
        True,
        4 * GIB,
        4 * GIB,
    )
    assert "simulated" in empty.reason
    device.take("gpu-worker", 1 * GIB)
    device.take("drill", 512 * MIB)
    reading = device.memory(exclude_labels=["gpu-worker"])
    assert reading.free_bytes == 4 * GIB - 1 * GIB - 512 * MIB
    assert reading.used_by_others_bytes == 512 * MIB  # our own worker is not "others"
    assert {(p.name, p.used_bytes) for p in reading.processes} == {
        ("gpu-worker", 1 * GIB),
        ("drill", 512 * MIB),
    }
    device.take("drill", 256 * MIB)  # a label holds one amount: taking again replaces it
    assert device.held() == {"gpu-worker": 1 * GIB, "drill": 256 * MIB}
    assert device.release("drill") == 256 * MIB
    assert device.release("drill") == 0
    assert device.memory().free_bytes == 3 * GIB


def test_simulated_device_refuses_more_than_is_free() -> None:
    device = SimulatedDevice(1 * GIB)
    device.take("worker", 768 * MIB)
    with pytest.raises(MemoryError, match=r"only 256\.00 MiB free"):
        device.take("drill", 512 * MIB)
    assert device.held() == {"worker": 768 * MIB}
    with pytest.raises(ValueError, match="positive size"):
        SimulatedDevice(0)


def test_simulated_device_ledger_is_thread_safe() -> None:
    device = SimulatedDevice(64 * MIB)
    refused: list[str] = []

    def grab(label: str) -> None:
        for _ in range(200):
            try:
                device.take(label, 1 * MIB)
            except MemoryError:
                refused.append(label)
            device.release(label)
        device.take(label, 1 * MIB)

    threads = [threading.Thread(target=grab, args=(f"t{i}",)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert refused == []  # 16 holders of 1 MiB never exceed 64 MiB
    assert device.memory().free_bytes == 48 * MIB


def _nvml_library_present() -> bool:
    return ctypes.util.find_library("nvidia-ml") is not None


def test_nvml_probe_reports_what_this_machine_has() -> None:
    reading = nvml_memory(0)
    if _nvml_library_present():
        assert reading.kind in ("nvidia", "none")
        assert reading.kind == "none" or reading.total_bytes > 0
    else:
        # the real path without a driver: no exception, a reading that says why
        assert (reading.kind, reading.total_bytes, reading.simulated) == ("none", 0, False)
        assert reading.reason.startswith("no NVIDIA GPU: ")
        assert not reading.available


def test_probe_prefers_the_configured_simulation() -> None:
    device = probe_gpu(DeviceConfig(simulate_vram="4GiB"))
    assert isinstance(device, SimulatedDevice) and device.total_bytes == 4 * GIB
    assert device.memory().simulated


def test_probe_without_simulation_matches_nvml() -> None:
    device = probe_gpu(DeviceConfig())
    reading = nvml_memory(0)
    if reading.kind == "none":
        assert isinstance(device, AbsentDevice)
        assert device.memory().reason == reading.reason
    else:
        assert isinstance(device, NvmlDevice)
    assert not device.memory().simulated


def test_system_ram() -> None:
    ram = system_ram()
    assert (ram.kind, ram.simulated) == ("ram", False)
    assert 0 < ram.free_bytes <= ram.total_bytes
    assert ram.used_by_others_bytes == ram.total_bytes - ram.free_bytes
    assert ram.to_dict()["processes"] == []
