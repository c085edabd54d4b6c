"""The GPU path's state as the service shows it (normal, squeezed, yielded, lost), worked out after every
reading of the device and every start the gate held back (jobs.gpu_policy decides), and told as a
`GpuPathChanged` event naming who caused it and what Failsoft does about it."""

from __future__ import annotations

import time
from typing import Any

from tray_app.contract.events import EventBus, GpuPathChanged
from tray_app.contract.sizes import format_size
from tray_app.device.snapshot import DeviceSnapshot
from tray_app.jobs import gpu_policy

# What Failsoft does on each path, in words (the notification and the status say it).
ACTIONS: dict[gpu_policy.GpuPath, str] = {
    "normal": "the GPU serves as planned",
    "squeezed": (
        "what is loaded on the GPU keeps serving; nothing new starts there until the memory is free again, "
        "so new work goes to the stand-in or the CPU by the usual rules"
    ),
    "yielded": (
        "the GPU worker finishes the jobs it has and stops; new work goes to the CPU or the stand-in, and "
        "the GPU worker comes back by itself once the memory has stayed free (gpu.return_after)"
    ),
    "lost": "the GPU counts as failed: work goes to the CPU until the device answers again",
}


def squeeze_reason(snapshot: DeviceSnapshot, reserve_bytes: int, held_back: dict[str, str]) -> str:
    """Why the path is squeezed: a start held back (its own reason names who), or the reserve eaten."""
    if held_back:
        return next(iter(held_back.values()))
    others = gpu_policy.holders_text(gpu_policy.Holder(p.describe(), p.used_bytes) for p in snapshot.others)
    return (
        f"{format_size(snapshot.free_bytes)} free on {snapshot.device}, less than the "
        f"{format_size(reserve_bytes)} reserve: {others}"
    )


class GpuPathTracker:
    """Owns the path's state; `update` works it out again and tells a change."""

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus
        self.state: gpu_policy.GpuPath = "normal"
        self.reason = ""
        self.since = time.time()

    def update(
        self,
        snapshot: DeviceSnapshot | None,
        reserve_bytes: int,
        held_back: dict[str, str],
        yielded: str | None,
    ) -> gpu_policy.GpuPath:
        """`yielded`: why the GPU is yielded (None: it is not)."""
        if snapshot is None:
            return self.state  # nothing is watched: nothing to tell
        state = gpu_policy.gpu_path_state(
            device_state=snapshot.state,
            yielded=yielded is not None,
            free_bytes=snapshot.free_bytes,
            reserve_bytes=reserve_bytes,
            held_back=bool(held_back),
        )
        if state == "lost":
            reason = f"{snapshot.device}: {snapshot.reason or 'the device is gone'}"
        elif state == "yielded":
            reason = yielded or ""
        elif state == "squeezed":
            reason = squeeze_reason(snapshot, reserve_bytes, held_back)
        else:
            reason = "the memory the plan needs is free" if self.state != "normal" else ""
        if state != self.state:
            previous, self.state, self.since = self.state, state, time.time()
            self.reason = reason
            self._bus.publish(
                GpuPathChanged(state=state, previous=previous, reason=reason, action=ACTIONS[state])
            )
        else:
            self.reason = reason
        return state

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "reason": self.reason,
            "action": ACTIONS[self.state],
            "since": self.since,
        }
