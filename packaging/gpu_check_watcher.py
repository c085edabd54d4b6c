"""The GPU check's watcher phase: another program (a torch process, the `drill` extra) takes memory on the
real GPU; the service's device watcher must name it by pid with its memory in `/failsoft/status`, then see
it go.

What NVML reports for the hog is read beside it, so the report shows both figures for the same pid.
The verdict (`judge_watcher`) is pure and tested on sample numbers.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from check_report import MIB, Report, say

from tray_app.drill.launcher import service_status
from tray_app.host.launch import ServeProcess

HOG_MIB = 1024
SEEN_WITHIN = 5.0  # seconds: two poll intervals (device.poll_seconds 1) and the hog's own CUDA start-up slack
POLL = 0.1

# A separate process, as ComfyUI would be: it holds the memory until its stdin closes.
HOG_SCRIPT = f"""
import sys, torch
block = torch.empty({HOG_MIB} * 1024 * 1024, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print("holding", flush=True)
sys.stdin.read()
"""


def listed(status: dict[str, Any] | None, pid: int) -> dict[str, Any] | None:
    """The device watcher's entry for `pid` in a status, if it lists it."""
    processes = ((status or {}).get("device_now") or {}).get("processes") or []
    return next((p for p in processes if p.get("pid") == pid), None)


def judge_watcher(
    seen_after: float | None, entry: dict[str, Any] | None, gone_after: float | None, hog_bytes: int
) -> list[str]:
    """The problems with what the watcher showed: the hog seen within SEEN_WITHIN, not as one of Failsoft's
    own, with at least the memory it allocated (the CUDA context adds to it), and gone once it exited."""
    if seen_after is None or entry is None:
        return [f"the watcher did not list the hog within {SEEN_WITHIN:.0f} s"]
    problems = []
    if seen_after > SEEN_WITHIN:
        problems.append(f"the hog was listed after {seen_after:.1f} s, more than {SEEN_WITHIN:.0f} s")
    if entry.get("own"):
        problems.append("the hog was listed as one of Failsoft's own workers")
    used = entry.get("used_bytes")
    if used is not None and used < hog_bytes:
        taken = f"{used / MIB:.0f} MiB, less than the {hog_bytes / MIB:.0f} MiB"
        problems.append(f"the hog was listed with {taken} it took")
    if gone_after is None:
        problems.append(f"the hog was still listed {SEEN_WITHIN:.0f} s after it exited")
    return problems


def _wait(probe: Callable[[], Any], timeout: float) -> tuple[float | None, Any]:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        found = probe()
        if found:
            return time.monotonic() - started, found
        time.sleep(POLL)
    return None, None


def phase_watcher(report: Report, service: ServeProcess, python: str = sys.executable) -> None:
    with report.phase("watcher") as entry:
        hog = subprocess.Popen(
            [python, "-c", HOG_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            if hog.stdout is None or hog.stdout.readline().strip() != "holding":
                entry["status"] = "skipped"
                report.problem("the torch hog did not start (is the drill extra installed?)")
                return
            seen_after, seen = _wait(
                lambda: listed(service_status(service.base_url), hog.pid), SEEN_WITHIN * 2
            )
            entry["seen_after_seconds"] = None if seen_after is None else round(seen_after, 2)
            entry["listed"] = seen
            entry["nvml_processes"] = nvml_processes()
        finally:
            if hog.stdin is not None:
                hog.stdin.close()
            hog.wait(timeout=30)
        gone_after, _ = _wait(lambda: listed(service_status(service.base_url), hog.pid) is None, SEEN_WITHIN)
        entry["gone_after_seconds"] = None if gone_after is None else round(gone_after, 2)
        entry["problems"] = judge_watcher(seen_after, seen, gone_after, HOG_MIB * MIB)
        for problem in entry["problems"]:
            report.problem(f"watcher: {problem}")
        seen_text = f"listed after {entry['seen_after_seconds']} s"
        say(f"watcher: hog pid {hog.pid} {seen_text}, gone after {entry['gone_after_seconds']} s")


def nvml_processes() -> list[dict[str, Any]]:
    """NVML's own list of compute processes on device 0 (pid, memory), beside what the watcher showed."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            found = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            return [{"pid": p.pid, "used_bytes": p.usedGpuMemory} for p in found]
        finally:
            pynvml.nvmlShutdown()
    except Exception as error:  # the report says it; the watcher's own figures stand without it
        return [{"error": str(error)}]
