"""What changed between two readings of the device, beyond a threshold: pure, over snapshots."""

from __future__ import annotations

from dataclasses import dataclass

from tray_app.contract.sizes import format_size
from tray_app.device.snapshot import DeviceProcess, DeviceSnapshot


@dataclass(frozen=True)
class Change:
    reasons: tuple[str, ...]  # empty: nothing worth telling
    appeared: tuple[DeviceProcess, ...] = ()
    left: tuple[DeviceProcess, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.reasons)


def _size(num_bytes: int | None) -> str:
    return "unknown" if num_bytes is None else format_size(num_bytes)


def compare(before: DeviceSnapshot | None, now: DeviceSnapshot, threshold_bytes: int) -> Change:
    """`now` against `before` (the last reading that was told): a new state, device or size, free memory
    moved by at least `threshold_bytes`, a process came or went, or one's memory moved by the threshold."""
    if before is None:
        return Change(("first reading",), appeared=now.processes)
    reasons: list[str] = []
    if now.state != before.state:
        reasons.append(f"state {before.state} -> {now.state}" + (f" ({now.reason})" if now.reason else ""))
    if (now.device, now.total_bytes) != (before.device, before.total_bytes):
        reasons.append(
            f"device {before.device} {_size(before.total_bytes)} -> {now.device} {_size(now.total_bytes)}"
        )
    if now.processes_known != before.processes_known:
        reasons.append("processes " + ("known" if now.processes_known else f"unknown ({now.reason})"))
    if abs(now.free_bytes - before.free_bytes) >= threshold_bytes:
        reasons.append(f"free {_size(before.free_bytes)} -> {_size(now.free_bytes)}")
    old = {p.key: p for p in before.processes}
    new = {p.key: p for p in now.processes}
    appeared = tuple(p for key, p in new.items() if key not in old)
    left = tuple(p for key, p in old.items() if key not in new)
    reasons.extend(f"{p.describe()} appeared with {_size(p.used_bytes)}" for p in appeared)
    reasons.extend(f"{p.describe()} left, freeing {_size(p.used_bytes)}" for p in left)
    for key, process in new.items():
        was = old.get(key)
        if was is not None and _moved(was.used_bytes, process.used_bytes, threshold_bytes):
            reasons.append(f"{process.describe()} {_size(was.used_bytes)} -> {_size(process.used_bytes)}")
    return Change(tuple(reasons), appeared, left)


def _moved(before: int | None, now: int | None, threshold_bytes: int) -> bool:
    if before is None or now is None:
        return (before is None) != (now is None)
    return abs(now - before) >= threshold_bytes
