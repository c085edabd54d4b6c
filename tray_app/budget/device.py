"""Device memory: an NVIDIA GPU through NVML, a simulated GPU (a ledger of who holds what), or system RAM."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

import psutil

from tray_app.config import DeviceConfig
from tray_app.contract.sizes import format_size, parse_size
from tray_app.device.ledger import Ledger, NoSimulatedDevice
from tray_app.device.snapshot import DeviceSnapshot

DeviceKind = Literal["nvidia", "simulated", "none", "ram"]


@dataclass(frozen=True)
class GpuProcess:
    """A process (or, on a simulated device, a labelled holder) using device memory."""

    pid: int | None
    name: str
    used_bytes: int | None  # NVML may not know (e.g. under some drivers or without permission)


@dataclass(frozen=True)
class DeviceMemory:
    name: str
    kind: DeviceKind
    total_bytes: int
    free_bytes: int
    used_by_others_bytes: int  # in use before our worker counts: other processes, driver, pressure drills
    simulated: bool
    reason: str = ""  # why the device is what it is ("no NVIDIA GPU: ...", "simulated 4.00 GiB")
    processes: tuple[GpuProcess, ...] = field(default_factory=tuple)

    @property
    def available(self) -> bool:
        return self.kind != "none" and self.total_bytes > 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["processes"] = [asdict(process) for process in self.processes]
        return data


class GpuDevice(Protocol):
    """Something whose memory can be read now; the planner reads it, never holds it."""

    @property
    def simulated(self) -> bool: ...

    def memory(self) -> DeviceMemory: ...


def no_gpu(reason: str) -> DeviceMemory:
    return DeviceMemory(
        name="no GPU",
        kind="none",
        total_bytes=0,
        free_bytes=0,
        used_by_others_bytes=0,
        simulated=False,
        reason=reason,
    )


class SimulatedDevice:
    """A GPU of a configured size that exists only as a ledger. Drills `take` memory away to create pressure,
    exactly as another process would on a real card; `release` gives it back. Thread-safe."""

    simulated = True

    def __init__(
        self, total_bytes: int, name: str = "simulated GPU", *, ledger: Ledger | None = None
    ) -> None:
        """`ledger`: keep the holdings in that ledger file (see `on_ledger`) rather than in this process."""
        if total_bytes <= 0:
            raise ValueError(f"a simulated GPU needs a positive size, got {total_bytes}")
        self.total_bytes = total_bytes
        self.name = name
        self.ledger = ledger
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    @classmethod
    def on_ledger(
        cls, total_bytes: int, name: str = "simulated GPU", ledger: Ledger | None = None
    ) -> SimulatedDevice:
        """A simulated GPU whose ledger is a file other processes take memory from too (`failsoft hog`, a
        drill's hog), created (or resized) now and owned by this process; `close()` removes it. This
        process's labels are held under its pid; other processes' holdings count as others'."""
        ledger = ledger if ledger is not None else Ledger()
        state = ledger.create(total_bytes, name)
        return cls(total_bytes, state.name, ledger=ledger)

    def close(self) -> None:
        """The device goes away with its owner: a ledger file is removed (an in-process one has nothing)."""
        if self.ledger is not None:
            self.ledger.remove()

    def take(self, label: str, num_bytes: int) -> None:
        """`label` now holds `num_bytes` (replacing what it held); more than is free raises MemoryError."""
        if num_bytes < 0:
            raise ValueError(f"cannot take a negative size ({num_bytes})")
        if self.ledger is not None:
            self.ledger.take(label, num_bytes)
            return
        with self._lock:
            others = sum(size for holder, size in self._held.items() if holder != label)
            if others + num_bytes > self.total_bytes:
                raise MemoryError(
                    f"{self.name}: cannot take {format_size(num_bytes)} for {label!r}, "
                    f"only {format_size(self.total_bytes - others)} free"
                )
            self._held[label] = num_bytes

    def release(self, label: str) -> int:
        """Give back what `label` held; returns those bytes (0 if it held nothing)."""
        if self.ledger is not None:
            return self.ledger.release(label)
        with self._lock:
            return self._held.pop(label, 0)

    def held(self) -> dict[str, int]:
        """Bytes by label; on a ledger, another process's holding is "label (pid N)"."""
        if self.ledger is not None:
            return {key: size for key, size, _pid in _ledger_holdings(self.ledger)}
        with self._lock:
            return dict(self._held)

    def memory(self, exclude_labels: Iterable[str] = ()) -> DeviceMemory:
        """The ledger as device memory; holders in `exclude_labels` (our own worker) are not "others"."""
        excluded = set(exclude_labels)
        holdings: list[tuple[str, int, int | None]]
        if self.ledger is not None:
            holdings = _ledger_holdings(self.ledger)
        else:
            with self._lock:
                holdings = [(label, size, None) for label, size in self._held.items()]
        used = sum(size for _label, size, _pid in holdings)
        others = sum(size for label, size, _pid in holdings if label not in excluded)
        return DeviceMemory(
            name=self.name,
            kind="simulated",
            total_bytes=self.total_bytes,
            free_bytes=self.total_bytes - used,
            used_by_others_bytes=others,
            simulated=True,
            reason=f"simulated {format_size(self.total_bytes)} GPU (no real device memory is used)",
            processes=tuple(
                GpuProcess(pid=pid, name=label, used_bytes=size) for label, size, pid in holdings
            ),
        )


def _ledger_holdings(ledger: Ledger) -> list[tuple[str, int, int | None]]:
    """(label, bytes, pid) of a ledger's live holdings; none when the ledger is gone."""
    try:
        state = ledger.read()
    except NoSimulatedDevice:
        return []
    own = os.getpid()
    return [
        (h.label if h.pid == own else f"{h.label} (pid {h.pid})", h.num_bytes, h.pid) for h in state.holdings
    ]


def _process_name(pid: int) -> str:
    try:
        return str(psutil.Process(pid).name())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "?"  # another container's pid namespace, or already gone


def nvml_memory(index: int = 0, exclude_pids: Iterable[int] = ()) -> DeviceMemory:
    """Read one NVIDIA GPU through NVML; an NVML failure (no driver, no device) gives kind "none" and why."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return no_gpu(f"no NVIDIA GPU: {error}")
    try:
        count = pynvml.nvmlDeviceGetCount()
        if index >= count:
            return no_gpu(f"no NVIDIA GPU: device index {index} requested, {count} found")
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        processes = tuple(
            GpuProcess(pid=int(p.pid), name=_process_name(int(p.pid)), used_bytes=p.usedGpuMemory)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        )
    except pynvml.NVMLError as error:
        return no_gpu(f"no NVIDIA GPU: {error}")
    finally:
        # shutting down a half-initialised NVML has nothing left to release
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    excluded = set(exclude_pids)
    ours = sum(p.used_bytes or 0 for p in processes if p.pid in excluded)
    total, free = int(info.total), int(info.free)
    return DeviceMemory(
        name=name.decode() if isinstance(name, bytes) else str(name),
        kind="nvidia",
        total_bytes=total,
        free_bytes=free,
        # Everything not free is someone else's (other processes, driver reservation) except our own worker.
        used_by_others_bytes=max(0, total - free - ours),
        simulated=False,
        reason=f"NVIDIA GPU {index} through NVML",
        processes=processes,
    )


class NvmlDevice:
    """A real NVIDIA GPU, read fresh on every call."""

    simulated = False

    def __init__(self, index: int = 0) -> None:
        self.index = index

    def memory(self, exclude_pids: Iterable[int] = ()) -> DeviceMemory:
        return nvml_memory(self.index, exclude_pids)


class AbsentDevice:
    """No GPU: every reading says so, with the reason found at probe time."""

    simulated = False

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def memory(self) -> DeviceMemory:
        return no_gpu(self.reason)


def probe_gpu(device_config: DeviceConfig) -> SimulatedDevice | NvmlDevice | AbsentDevice:
    """The simulated GPU when configured (`device.simulate_vram`), else the NVIDIA GPU if NVML finds one."""
    if device_config.simulate_vram:
        return SimulatedDevice(parse_size(device_config.simulate_vram))
    reading = nvml_memory(device_config.gpu_index)
    if reading.kind == "none":
        return AbsentDevice(reading.reason)
    return NvmlDevice(device_config.gpu_index)


def system_ram() -> DeviceMemory:
    """System RAM as a device: what the CPU worker is planned against."""
    memory = psutil.virtual_memory()
    return DeviceMemory(
        name="system RAM",
        kind="ram",
        total_bytes=int(memory.total),
        free_bytes=int(memory.available),
        used_by_others_bytes=int(memory.total - memory.available),
        simulated=False,
        reason="system RAM (psutil)",
    )


def memory_from_snapshot(snapshot: DeviceSnapshot) -> DeviceMemory:
    """The watcher's reading as the planner's device: Failsoft's own workers' memory counts as available
    (they are what is planned), everything else in use as others'. An unreadable device is no GPU."""
    if snapshot.state != "normal" or snapshot.total_bytes <= 0:
        return no_gpu(f"{snapshot.device}: {snapshot.state} ({snapshot.reason or 'no reading'})")
    others = min(snapshot.others_bytes, snapshot.total_bytes)
    kind: DeviceKind = "simulated" if snapshot.simulated else "nvidia"
    size = format_size(snapshot.total_bytes)
    reason = (
        f"simulated {size} GPU (no real device memory is used)"
        if snapshot.simulated
        else f"{snapshot.device} through {snapshot.source}, as the device watcher read it"
    )
    return DeviceMemory(
        name=snapshot.device,
        kind=kind,
        total_bytes=snapshot.total_bytes,
        free_bytes=snapshot.total_bytes - others,
        used_by_others_bytes=others,
        simulated=snapshot.simulated,
        reason=reason,
        processes=tuple(GpuProcess(p.pid, p.describe(), p.used_bytes) for p in snapshot.others),
    )


class WatchedGpu:
    """The GPU as the device watcher last read it: what the planner plans against once the watcher runs.
    `read` gives the latest reading (reading the device once itself before the first)."""

    def __init__(self, read: Callable[[], DeviceSnapshot], simulated: bool) -> None:
        self._read = read
        self.simulated = simulated

    def memory(self) -> DeviceMemory:
        return memory_from_snapshot(self._read())
