"""Where readings of the device come from, each behind `read() -> DeviceSnapshot`.

- NVML (nvidia-ml-py, module `pynvml`): memory, and the compute and graphics processes with their memory.
- The simulated GPU's ledger: the same snapshot, built by the same code once the holders are read.
- Free memory only (AMD through sysfs, or what llama.cpp lists for any backend): the snapshot says that
  the processes are not known.

A source never raises on a failed reading: the snapshot's state and reason say what happened. Failsoft's
own workers are told apart by the pids `own_pids()` returns at the time of the reading.
"""

from __future__ import annotations

import contextlib
import importlib
import subprocess
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import psutil

from tray_app.device.ledger import Ledger, NoSimulatedDevice
from tray_app.device.snapshot import (
    DeviceProcess,
    DeviceSnapshot,
    DeviceState,
    SourceKind,
    measured_snapshot,
    unknown_snapshot,
)
from tray_app.engine.devices import DeviceListError, parse_device_list

OwnPids = Callable[[], Collection[int]]


def no_pids() -> Collection[int]:
    return ()


class SourceUnavailable(RuntimeError):
    """This kind of device cannot be read on this machine (no driver, no card); the message says why."""


class DeviceSource(Protocol):
    @property
    def kind(self) -> SourceKind: ...

    @property
    def blocking(self) -> bool:
        """Whether a read may wait on a driver or a process; such a source is read off the event loop."""
        ...

    def read(self) -> DeviceSnapshot: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Holder:
    """A holder as a source found it, before names and ownership are attached."""

    pid: int
    used_bytes: int | None
    label: str = ""


class ProcessNames:
    """psutil names by pid, kept while the pid stays on the device (a name is a /proc read)."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}

    def name(self, pid: int) -> str:
        if pid not in self._names:
            try:
                self._names[pid] = str(psutil.Process(pid).name())
            except psutil.Error:
                self._names[pid] = "?"  # gone already, or in another pid namespace (a container)
        return self._names[pid]

    def keep_only(self, pids: Iterable[int]) -> None:
        keep = set(pids)
        for pid in [pid for pid in self._names if pid not in keep]:
            del self._names[pid]


def device_processes(
    holders: Iterable[Holder], own: Collection[int], names: ProcessNames
) -> tuple[DeviceProcess, ...]:
    """The holders with their names and ownership attached, for NVML and the ledger alike; the names of pids
    no longer listed are forgotten."""
    listed = tuple(holders)
    names.keep_only(h.pid for h in listed)
    return tuple(
        DeviceProcess(
            pid=h.pid, name=names.name(h.pid), used_bytes=h.used_bytes, own=h.pid in own, label=h.label
        )
        for h in listed
    )


class LedgerSource:
    """The simulated GPU, read from its ledger file."""

    kind: ClassVar[SourceKind] = "simulated"
    blocking = False  # a small file in the runtime folder and a /proc read per holder

    def __init__(self, ledger: Ledger | None = None, own_pids: OwnPids = no_pids) -> None:
        self.ledger = ledger if ledger is not None else Ledger()
        self._own_pids = own_pids
        self._names = ProcessNames()

    def read(self) -> DeviceSnapshot:
        at = time.time()
        try:
            state = self.ledger.read()
        except NoSimulatedDevice as error:
            return unknown_snapshot(at, self.kind, "simulated GPU", True, str(error))
        holders = (Holder(h.pid, h.num_bytes, h.label) for h in state.holdings)
        return measured_snapshot(
            at,
            self.kind,
            state.name,
            True,
            state.total_bytes,
            state.free_bytes,
            processes=device_processes(holders, set(self._own_pids()), self._names),
        )

    def close(self) -> None:
        pass  # nothing held open between reads


# NVML errors that mean the card itself is gone or unusable until reset; any other failed call leaves the
# state unknown (a timeout, a permission), not a GPU failure.
_LOST_ERRORS = ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_RESET_REQUIRED")
# Listing processes is refused on some set-ups (vGPU, no permission): memory is still known.
_NO_PROCESS_LIST_ERRORS = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION")


class _NeverRaised(Exception):
    pass


class NvmlSource:
    """One NVIDIA GPU through NVML, initialised once for the source's life (nvmlInit is reference
    counted, so other code's own init and shutdown pairs do not disturb it)."""

    kind: ClassVar[SourceKind] = "nvml"
    blocking = True  # driver calls; ctypes lets go of the GIL while they run

    def __init__(self, index: int = 0, own_pids: OwnPids = no_pids, *, nvml: Any = None) -> None:
        """`nvml`: the pynvml module, or an object shaped like it (tests). SourceUnavailable when there is
        no NVML library, no driver, or no device at `index`."""
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError as error:
                raise SourceUnavailable(f"no NVIDIA GPU: nvidia-ml-py is not installed ({error})") from error
        self._nvml = nvml
        self._own_pids = own_pids
        self._names = ProcessNames()
        self._memory_v2 = True
        self._open = False
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            raise SourceUnavailable(f"no NVIDIA GPU: {error}") from error
        self._open = True
        try:
            self._handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = nvml.nvmlDeviceGetName(self._handle)
        except nvml.NVMLError as error:
            self.close()
            raise SourceUnavailable(f"no NVIDIA GPU at index {index}: {error}") from error
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        self.index = index

    def read(self) -> DeviceSnapshot:
        nvml = self._nvml
        at = time.time()
        try:
            total, free = self._memory()
        except nvml.NVMLError as error:
            state = self._state_of(error)
            return unknown_snapshot(at, self.kind, self.name, False, f"NVML: {error}", state=state)
        holders: list[Holder] = []
        known, reason = True, ""
        try:
            holders = self._processes()
        except nvml.NVMLError as error:
            if self._is(error, _LOST_ERRORS):
                return unknown_snapshot(at, self.kind, self.name, False, f"NVML: {error}", state="lost")
            known, reason = False, f"NVML does not list the processes here: {error}"
        return measured_snapshot(
            at,
            self.kind,
            self.name,
            False,
            total,
            free,
            processes=device_processes(holders, set(self._own_pids()), self._names),
            processes_known=known,
            reason=reason,
        )

    def close(self) -> None:
        if self._open:
            self._open = False
            # A lost device may refuse even this; nothing is left to release then.
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()

    def _memory(self) -> tuple[int, int]:
        nvml = self._nvml
        if self._memory_v2:
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(self._handle, version=nvml.nvmlMemory_v2)
                return int(info.total), int(info.free)
            except nvml.NVMLError as error:
                if not self._is(error, ("NVML_ERROR_FUNCTION_NOT_FOUND",)):
                    raise
                self._memory_v2 = False  # a driver older than the v2 call: v1 from now on
        info = nvml.nvmlDeviceGetMemoryInfo(self._handle)
        return int(info.total), int(info.free)

    def _processes(self) -> list[Holder]:
        """Compute and graphics processes, one entry per pid (a process may be in both lists)."""
        by_pid: dict[int, int | None] = {}
        for kind in ("Compute", "Graphics"):
            for process in self._listed(kind):
                pid, used = int(process.pid), process.usedGpuMemory
                used = None if used is None else int(used)
                if pid not in by_pid or by_pid[pid] is None:
                    by_pid[pid] = used
                elif used is not None:
                    by_pid[pid] = max(used, by_pid[pid] or 0)
        return [Holder(pid, used) for pid, used in by_pid.items()]

    def _listed(self, kind: str) -> list[Any]:
        nvml = self._nvml
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", _NeverRaised)
        try:
            return list(getattr(nvml, f"nvmlDeviceGet{kind}RunningProcesses")(self._handle))
        except mismatch:
            # The unversioned call is v3; a driver that lacks it still has v2.
            return list(getattr(nvml, f"nvmlDeviceGet{kind}RunningProcesses_v2")(self._handle))

    def _is(self, error: Any, names: Iterable[str]) -> bool:
        codes = {getattr(self._nvml, name, None) for name in names}
        return getattr(error, "value", None) in codes - {None}

    def _state_of(self, error: Any) -> DeviceState:
        return "lost" if self._is(error, _LOST_ERRORS) else "unknown"


MemoryReader = Callable[[], tuple[int, int]]  # (total, free) bytes; OSError or ValueError when it cannot


class FreeMemorySource:
    """A device whose free memory can be read but not who holds it (AMD, Intel)."""

    kind: ClassVar[SourceKind] = "free_memory"

    def __init__(self, device: str, reader: MemoryReader, *, blocking: bool = False) -> None:
        self.device = device
        self._reader = reader
        self.blocking = blocking

    def read(self) -> DeviceSnapshot:
        at = time.time()
        try:
            total, free = self._reader()
        except (OSError, ValueError) as error:
            return unknown_snapshot(at, self.kind, self.device, False, f"free memory unreadable: {error}")
        return measured_snapshot(
            at,
            self.kind,
            self.device,
            False,
            total,
            free,
            processes_known=False,
            reason="only free memory is known for this device, not which processes hold the rest",
        )

    def close(self) -> None:
        pass


def amdgpu_cards(drm: Path = Path("/sys/class/drm")) -> list[Path]:
    """The amdgpu devices that report their VRAM in sysfs (card*/device/mem_info_vram_total)."""
    return sorted(
        card / "device"
        for card in drm.glob("card[0-9]*")
        if "-" not in card.name and (card / "device" / "mem_info_vram_total").is_file()
    )


def amdgpu_reader(device_dir: Path) -> MemoryReader:
    """amdgpu's own counters: two small sysfs files, cheap enough to read every second."""

    def read() -> tuple[int, int]:
        total = int((device_dir / "mem_info_vram_total").read_text())
        used = int((device_dir / "mem_info_vram_used").read_text())
        return total, total - used

    return read


def engine_reader(binary: Path, device_name: str, timeout: float = 60.0) -> MemoryReader:
    """What `llama-server --list-devices` says is free on `device_name` ("Vulkan0"): any backend, but a
    process start and a driver initialisation per reading, so poll it every minute or so, not every second."""

    def read() -> tuple[int, int]:
        try:
            done = subprocess.run(
                [str(binary), "--list-devices"],
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                check=True,
            )
            devices = parse_device_list(done.stdout).devices
        except (subprocess.SubprocessError, DeviceListError) as error:
            raise OSError(f"{binary} --list-devices: {error}") from error
        for device in devices:
            if device.name == device_name:
                return device.total_bytes, device.free_bytes
        raise ValueError(f"{device_name} is not among the devices {binary} lists")

    return read


def pick_source(
    *,
    simulated: bool,
    gpu_index: int = 0,
    own_pids: OwnPids = no_pids,
    ledger: Ledger | None = None,
) -> tuple[DeviceSource | None, str]:
    """The source for this machine and why: the ledger when the GPU is simulated, else NVML, else an amdgpu
    card's sysfs counters; None when there is nothing to watch."""
    if simulated:
        return LedgerSource(ledger, own_pids), "the simulated GPU's ledger"
    try:
        return NvmlSource(gpu_index, own_pids), "NVML"
    except SourceUnavailable as error:
        nvml_reason = str(error)
    cards = amdgpu_cards()
    if cards:
        card = cards[0]
        return FreeMemorySource(f"AMD GPU ({card.parent.name})", amdgpu_reader(card)), "amdgpu sysfs"
    return None, f"{nvml_reason}; no amdgpu card in sysfs"
