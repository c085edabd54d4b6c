"""The VRAM timeline's failover marker says where the job went: the CPU, or the peer by name."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

from tray_app.contract.events import FallbackStarted
from tray_app.host.gpu_side import GpuSide


def marker_text(event: FallbackStarted) -> str:
    side: Any = SimpleNamespace(markers=deque())  # _mark reads and writes nothing else
    GpuSide._mark(side, event)
    (marker,) = side.markers
    assert marker["kind"] == "failover"
    return str(marker["text"])


def test_a_failover_marker_names_the_cpu_or_the_peer() -> None:
    assert marker_text(FallbackStarted(job_id="job-0123456789ab-x", reason="oom_decode")) == (
        "job job-01234567 to the CPU: oom_decode"
    )
    to_peer = FallbackStarted(job_id="job-1", reason="crash_abort", to="peer:gaming-pc")
    assert marker_text(to_peer) == "job job-1 to gaming-pc: crash_abort"
