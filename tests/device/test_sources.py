"""The sources behind the watcher. NVML here is an object shaped like nvidia-ml-py's `pynvml` module,
answering as the documented calls do (fast tier only); the real path, a real card and driver, is for
`make gpu-check`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.device.conftest import GIB, MIB
from tray_app.device.ledger import Ledger
from tray_app.device.sources import (
    FreeMemorySource,
    LedgerSource,
    NvmlSource,
    SourceUnavailable,
    amdgpu_cards,
    amdgpu_reader,
    pick_source,
)


class FakeNvml:
    """The parts of pynvml the source calls, with its error codes and its error class's `value`."""

    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NO_PERMISSION = 4
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_RESET_REQUIRED = 16
    nvmlMemory_v2 = 0x02000028

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

    class NVMLLibraryMismatchError(Exception):
        pass

    def __init__(self) -> None:
        self.init_error: int | None = None
        self.memory_error: int | None = None
        self.process_error: int | None = None
        self.has_memory_v2 = True
        self.v3_missing = False
        self.total, self.free = 24 * GIB, 20 * GIB
        self.compute: list[Any] = []
        self.graphics: list[Any] = []
        self.shutdowns = 0

    def _raise(self, code: int | None) -> None:
        if code is not None:
            raise self.NVMLError(code)

    def nvmlInit(self) -> None:
        self._raise(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"handle-{index}"

    def nvmlDeviceGetName(self, handle: str) -> bytes:
        return b"NVIDIA GeForce RTX 4090"

    def nvmlDeviceGetMemoryInfo(self, handle: str, version: int | None = None) -> Any:
        self._raise(self.memory_error)
        if version is not None and not self.has_memory_v2:
            self._raise(self.NVML_ERROR_FUNCTION_NOT_FOUND)
        return SimpleNamespace(total=self.total, free=self.free, used=self.total - self.free, reserved=0)

    def _processes(self, listed: list[Any], versioned: bool) -> list[Any]:
        self._raise(self.process_error)
        if self.v3_missing and not versioned:
            raise self.NVMLLibraryMismatchError("unversioned call, old driver")
        return list(listed)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:
        return self._processes(self.compute, versioned=False)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: str) -> list[Any]:
        return self._processes(self.graphics, versioned=False)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: str) -> list[Any]:
        return self._processes(self.compute, versioned=True)

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: str) -> list[Any]:
        return self._processes(self.graphics, versioned=True)


def proc(pid: int, used: int | None) -> Any:
    return SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0, computeInstanceId=0)


def dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(done.stdout)


def test_nvml_reading_names_processes_and_tells_own_from_others() -> None:
    nvml = FakeNvml()
    me, parent, gone = os.getpid(), os.getppid(), dead_pid()
    nvml.compute = [proc(me, 2 * GIB), proc(gone, None)]  # None: the driver does not say (WDDM)
    nvml.graphics = [proc(parent, 512 * MIB), proc(me, 2 * GIB)]  # a process may be in both lists
    source = NvmlSource(0, own_pids=lambda: {me}, nvml=nvml)
    snapshot = source.read()
    assert (snapshot.source, snapshot.device, snapshot.simulated, snapshot.state) == (
        "nvml",
        "NVIDIA GeForce RTX 4090",
        False,
        "normal",
    )
    assert (snapshot.total_bytes, snapshot.free_bytes, snapshot.used_bytes) == (24 * GIB, 20 * GIB, 4 * GIB)
    by_pid = {p.pid: p for p in snapshot.processes}
    assert set(by_pid) == {me, parent, gone}
    assert by_pid[me].own and by_pid[me].used_bytes == 2 * GIB
    assert not by_pid[parent].own and by_pid[parent].used_bytes == 512 * MIB
    assert by_pid[gone].used_bytes is None and by_pid[gone].name == "?"
    assert by_pid[me].name == by_pid[me].name.strip() and by_pid[me].name != "?"
    assert snapshot.processes_known and (snapshot.own_bytes, snapshot.others_bytes) == (2 * GIB, 2 * GIB)
    source.close()
    source.close()
    assert nvml.shutdowns == 1


def test_nvml_absent_when_init_fails() -> None:
    nvml = FakeNvml()
    nvml.init_error = nvml.NVML_ERROR_LIBRARY_NOT_FOUND
    with pytest.raises(SourceUnavailable, match="no NVIDIA GPU"):
        NvmlSource(nvml=nvml)


def test_nvml_lost_device_and_other_failures() -> None:
    nvml = FakeNvml()
    source = NvmlSource(nvml=nvml)
    nvml.memory_error = nvml.NVML_ERROR_GPU_IS_LOST
    lost = source.read()
    assert lost.state == "lost" and not lost.processes_known and "NVML" in lost.reason
    nvml.memory_error = nvml.NVML_ERROR_TIMEOUT
    assert source.read().state == "unknown"  # a failed call, not a GPU failure
    nvml.memory_error = None
    nvml.process_error = nvml.NVML_ERROR_RESET_REQUIRED
    assert source.read().state == "lost"


def test_nvml_without_a_process_list_still_gives_memory() -> None:
    nvml = FakeNvml()
    nvml.process_error = nvml.NVML_ERROR_NOT_SUPPORTED
    snapshot = NvmlSource(nvml=nvml).read()
    assert snapshot.state == "normal" and snapshot.free_bytes == 20 * GIB
    assert not snapshot.processes_known and "does not list the processes" in snapshot.reason


def test_nvml_on_an_older_driver_uses_the_older_calls() -> None:
    nvml = FakeNvml()
    nvml.has_memory_v2 = False
    nvml.v3_missing = True
    nvml.compute = [proc(os.getppid(), GIB)]
    snapshot = NvmlSource(nvml=nvml).read()
    assert snapshot.free_bytes == 20 * GIB and [p.used_bytes for p in snapshot.processes] == [GIB]


def test_the_ledger_source_reads_the_simulated_gpu(ledger: Ledger) -> None:
    me = os.getpid()
    ledger.take("gpu", 2 * GIB)
    ledger.take("comfyui", 3 * GIB, pid=os.getppid())
    source = LedgerSource(ledger, own_pids=lambda: set())
    snapshot = source.read()
    assert snapshot.simulated and snapshot.source == "simulated" and "simulated" in snapshot.device
    assert (snapshot.total_bytes, snapshot.free_bytes) == (8 * GIB, 3 * GIB)
    assert {(p.pid, p.label, p.used_bytes, p.own) for p in snapshot.processes} == {
        (me, "gpu", 2 * GIB, False),
        (os.getppid(), "comfyui", 3 * GIB, False),
    }
    # The worker pids are asked at each reading: a worker started since is told apart from then on.
    owned = LedgerSource(ledger, own_pids=lambda: {me}).read()
    assert (owned.own_bytes, owned.others_bytes) == (2 * GIB, 3 * GIB)
    comfy = next(p for p in owned.processes if p.label == "comfyui")
    assert comfy.describe() == f"comfyui ({comfy.name}, pid {os.getppid()})"


def test_the_ledger_source_without_a_device_says_unknown(runtime_dir: Path) -> None:
    snapshot = LedgerSource(Ledger()).read()
    assert snapshot.state == "unknown" and snapshot.simulated and "no simulated GPU" in snapshot.reason


def test_free_memory_only_says_processes_are_unknown(tmp_path: Path) -> None:
    card = tmp_path / "drm" / "card0" / "device"
    card.mkdir(parents=True)
    (tmp_path / "drm" / "card0-DP-1").mkdir()  # a connector, not a card
    (card / "mem_info_vram_total").write_text(f"{16 * GIB}\n")
    (card / "mem_info_vram_used").write_text(f"{5 * GIB}\n")
    assert amdgpu_cards(tmp_path / "drm") == [card]
    source = FreeMemorySource("AMD GPU (card0)", amdgpu_reader(card))
    snapshot = source.read()
    assert (snapshot.source, snapshot.state, snapshot.free_bytes) == ("free_memory", "normal", 11 * GIB)
    assert not snapshot.processes_known and snapshot.processes == ()
    assert "not which processes" in snapshot.reason
    (card / "mem_info_vram_used").unlink()
    assert source.read().state == "unknown"


def test_pick_source_takes_the_ledger_for_a_simulated_gpu(ledger: Ledger) -> None:
    source, why = pick_source(simulated=True, ledger=ledger)
    assert isinstance(source, LedgerSource) and "ledger" in why
