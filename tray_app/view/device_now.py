"""The device now and the GPU path, from `/failsoft/status` (`device_now`, `gpu_path`): who holds the GPU's
memory, in words, for the tray and `failsoft status`. No Qt here. A status from an older service has neither
section: everything here then says nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tray_app.contract.sizes import format_size
from tray_app.contract.status import ServiceStatus

PATH_WORDS = {
    "normal": "normal",
    "squeezed": "squeezed by another program",
    "yielded": "yielded to another program",
    "lost": "lost (the device failed)",
}


@dataclass(frozen=True)
class Holder:
    describe: str  # "comfyui (python3, pid 4242)"
    used_bytes: int | None
    own: bool

    def line(self) -> str:
        size = format_size(self.used_bytes) if self.used_bytes is not None else "size not reported"
        return f"{self.describe} {size}"


def device_now(status: ServiceStatus) -> dict[str, Any]:
    now = status.get("device_now")
    return now if isinstance(now, dict) else {}


def holders(status: ServiceStatus, *, own: bool | None = None) -> list[Holder]:
    """The processes on the card, largest first; `own`: only Failsoft's workers (True) or only others."""
    found = []
    for process in device_now(status).get("processes") or []:
        if not isinstance(process, dict) or (own is not None and bool(process.get("own")) != own):
            continue
        describe = process.get("describe") or f"{process.get('name') or '?'} (pid {process.get('pid')})"
        used = process.get("used_bytes")
        found.append(
            Holder(str(describe), int(used) if isinstance(used, int) else None, bool(process.get("own")))
        )
    return sorted(found, key=lambda h: h.used_bytes or 0, reverse=True)


def others_bytes(status: ServiceStatus) -> int | None:
    """Memory in use by everything but Failsoft's workers now; None when nothing is watched."""
    now = device_now(status)
    value = now.get("others_bytes")
    return int(value) if now.get("state") == "normal" and isinstance(value, int) else None


def others_detail(status: ServiceStatus) -> str:
    """ "comfyui (python3, pid 4242) 6.10 GiB, Xorg (pid 900) 120.00 MiB", for a tooltip."""
    now = device_now(status)
    listed = holders(status, own=False)
    if listed:
        return ", ".join(h.line() for h in listed)
    if now and not now.get("processes_known", True):
        return str(now.get("reason") or "the processes are not known for this device")
    return ""


def gpu_path(status: ServiceStatus) -> dict[str, Any]:
    path = status.get("gpu_path")
    return path if isinstance(path, dict) else {}


def path_state(status: ServiceStatus) -> str:
    return str(gpu_path(status).get("state") or "normal")


def path_line(status: ServiceStatus) -> str:
    """ "GPU path: squeezed by another program: <why>" ("" while normal)."""
    path = gpu_path(status)
    state = str(path.get("state") or "normal")
    if state == "normal":
        return ""
    line = f"GPU path: {PATH_WORDS.get(state, state)}"
    return f"{line}: {path['reason']}" if path.get("reason") else line


def device_lines(status: ServiceStatus) -> list[str]:
    """`failsoft status`'s lines on the device now: the path, then who holds what."""
    now = device_now(status)
    if not now.get("watching"):
        return []
    lines = []
    if path := path_line(status):
        lines.append(path)
        action = gpu_path(status).get("action")
        if action:
            lines.append(f"  Failsoft: {action}")
        waiting = (gpu_path(status).get("yielded") or {}).get("waiting")
        if waiting:
            lines.append(f"  back when: {waiting}")
    # A GPU worker started with less than its plan (the memory free then, or what its last load lacked).
    lines += [str(note) for note in (gpu_path(status).get("smaller") or {}).values() if note]
    total, free = int(now.get("total_bytes") or 0), int(now.get("free_bytes") or 0)
    if now.get("state") != "normal":
        lines.append(f"Device now: {now.get('state')} ({now.get('reason') or 'no reading'})")
        return lines
    polled = f", read every {now['poll_seconds']:g} s" if now.get("poll_seconds") else ""
    lines.append(f"Device now: {format_size(free)} free of {format_size(total)}{polled}")
    for holder in holders(status):
        lines.append(f"  {'Failsoft' if holder.own else 'other':<8} {holder.line()}")
    if not now.get("processes_known", True):
        lines.append(f"  (who holds the rest is not known: {now.get('reason') or 'no process list'})")
    return lines
