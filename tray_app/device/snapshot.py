"""A reading of the device as plain frozen data: memory, the processes holding it, and what is not known."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

# normal: read fine. lost: the device answered that it is gone or needs a reset (a GPU failure).
# unknown: nothing could be read this time (no simulated device running, a driver call that failed).
DeviceState = Literal["normal", "lost", "unknown"]
SourceKind = Literal["nvml", "simulated", "free_memory"]


@dataclass(frozen=True)
class DeviceProcess:
    """One process holding device memory. On the simulated device a process may hold several labelled
    amounts (the service's workers, a drill's pressure): each is its own entry with its label."""

    pid: int
    name: str  # the executable's name from psutil, "?" where it cannot be read (another pid namespace)
    used_bytes: int | None  # None: the driver does not say (NVML under WDDM, some vGPUs)
    own: bool  # one of Failsoft's own workers
    label: str = ""  # the ledger's label on the simulated device; empty for a real one

    @property
    def key(self) -> tuple[int, str]:
        return (self.pid, self.label)

    def describe(self) -> str:
        """ "comfyui (python3, pid 4242)" where there is a label, else "python3 (pid 4242)"."""
        if self.label and self.label != self.name:
            return f"{self.label} ({self.name}, pid {self.pid})"
        return f"{self.name} (pid {self.pid})"


@dataclass(frozen=True)
class DeviceSnapshot:
    at: float  # wall clock of the reading
    source: SourceKind
    device: str  # the device's name; a simulated one always says "simulated"
    simulated: bool
    state: DeviceState
    total_bytes: int
    free_bytes: int
    used_bytes: int
    processes: tuple[DeviceProcess, ...] = ()
    processes_known: bool = True  # False: only free memory is known, not who holds the rest
    reason: str = ""  # why the state is what it is, or what is not known

    @property
    def own_bytes(self) -> int:
        return sum(p.used_bytes or 0 for p in self.processes if p.own)

    @property
    def others(self) -> tuple[DeviceProcess, ...]:
        return tuple(p for p in self.processes if not p.own)

    @property
    def others_bytes(self) -> int:
        """Everything in use that is not Failsoft's own: other processes, and on a real card the driver's
        reservation and memory no process listing accounts for."""
        return max(0, self.used_bytes - self.own_bytes)

    def process(self, key: tuple[int, str]) -> DeviceProcess | None:
        return next((p for p in self.processes if p.key == key), None)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["processes"] = [dataclasses.asdict(p) for p in self.processes]
        data["own_bytes"] = self.own_bytes
        data["others_bytes"] = self.others_bytes
        return data


def measured_snapshot(
    at: float,
    source: SourceKind,
    device: str,
    simulated: bool,
    total_bytes: int,
    free_bytes: int,
    *,
    processes: tuple[DeviceProcess, ...] = (),
    processes_known: bool = True,
    reason: str = "",
    state: DeviceState = "normal",
) -> DeviceSnapshot:
    """The one place a snapshot is made: used is what is not free, free kept within 0..total."""
    free = max(0, min(free_bytes, total_bytes))
    return DeviceSnapshot(
        at=at,
        source=source,
        device=device,
        simulated=simulated,
        state=state,
        total_bytes=total_bytes,
        free_bytes=free,
        used_bytes=total_bytes - free,
        processes=processes,
        processes_known=processes_known,
        reason=reason,
    )


def unknown_snapshot(
    at: float, source: SourceKind, device: str, simulated: bool, reason: str, state: DeviceState = "unknown"
) -> DeviceSnapshot:
    """A reading that could not be made: no memory figures, nothing known about processes."""
    return measured_snapshot(
        at,
        source,
        device,
        simulated,
        0,
        0,
        processes_known=False,
        reason=reason,
        state=state,
    )
