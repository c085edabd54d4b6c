"""Who holds the GPU's memory, as the tray and `failsoft status` show it: the live "Other processes" segment
with names, the reserve eaten into, the GPU path in the headline and the terminal, and the timeline's
stacked series, all from a status (and a history) as the service sends them."""

from __future__ import annotations

from typing import Any

from tests.support.status_samples import make_status
from tray_app.contract.status import ServiceStatus
from tray_app.view import device_now
from tray_app.view.budget_split import status_segments
from tray_app.view.state import DEGRADED, summarize
from tray_app.view.timeline import stacked, timeline

MiB = 1024**2
GiB = 1024**3


def process(pid: int, label: str, used: int, own: bool = False, name: str = "python3") -> dict[str, Any]:
    described = f"{label} ({name}, pid {pid})" if label else f"{name} (pid {pid})"
    return {"pid": pid, "name": name, "label": label, "used_bytes": used, "own": own, "describe": described}


def watched(
    others: list[dict[str, Any]], gpu: str = "ready", path: str = "normal", **extra: Any
) -> ServiceStatus:
    status = make_status(gpu=gpu)
    own = [process(4242, "gpu", 344 * MiB, own=True, name="llama-server")]
    used = sum(p["used_bytes"] for p in own + others)
    status["device_now"] = {
        "watching": True,
        "state": "normal",
        "total_bytes": 4 * GiB,
        "free_bytes": 4 * GiB - used,
        "used_bytes": used,
        "own_bytes": 344 * MiB,
        "others_bytes": used - 344 * MiB,
        "processes": own + others,
        "processes_known": True,
        "poll_seconds": 1.0,
    }
    status["gpu_path"] = {"state": path, "reason": extra.get("reason", ""), "action": extra.get("action", "")}
    return status


def segment(status: ServiceStatus, key: str) -> Any:
    return next(s for s in status_segments(status) if s.key == key)


def test_the_other_processes_segment_is_live_and_named() -> None:
    status = watched([process(7, "comfyui", 2 * GiB), process(9, "", 64 * MiB, name="Xorg")])
    other = segment(status, "other")
    assert other.bytes == 2 * GiB + 64 * MiB  # not the plan's 1 GiB from when it was made
    assert other.detail == "comfyui (python3, pid 7) 2.00 GiB, Xorg (pid 9) 64.00 MiB"
    assert sum(s.bytes for s in status_segments(status)) == 4 * GiB  # still adds up to the device


def test_others_beyond_free_eat_into_the_reserve() -> None:
    status = watched([process(7, "game", 3500 * MiB)])
    reserve, free = segment(status, "reserve"), segment(status, "free")
    assert free.bytes == 0 and reserve.bytes < 410 * MiB
    assert "eaten into by other programs" in reserve.detail
    assert sum(s.bytes for s in status_segments(status)) == 4 * GiB


def test_a_stopped_gpu_worker_leaves_its_share_free() -> None:
    status = watched([process(7, "comfyui", 2 * GiB)], gpu="stopped", path="yielded")
    assert [segment(status, key).bytes for key in ("weights", "kv", "compute")] == [0, 0, 0]


def test_without_a_watcher_the_plan_is_shown_as_before() -> None:
    status = make_status()
    assert segment(status, "other").bytes == 1024 * MiB and not segment(status, "other").detail
    assert device_now.device_lines(status) == []


def test_the_gpu_path_leads_the_headline() -> None:
    yielded = summarize(watched([], gpu="stopped", path="yielded"), reachable=True)
    assert (yielded.level, yielded.headline) == (DEGRADED, "GPU yielded, CPU serving")
    squeezed = summarize(watched([], path="squeezed"), reachable=True)
    assert squeezed.headline == "GPU serving, squeezed by another program"


def test_failsoft_status_lists_who_holds_the_gpu_and_the_path() -> None:
    status = watched(
        [process(7, "comfyui", 3500 * MiB)],
        path="squeezed",
        reason="comfyui (python3, pid 7) holds 3.42 GiB",
        action="nothing new starts on the GPU",
    )
    lines = device_now.device_lines(status)
    assert lines[0] == "GPU path: squeezed by another program: comfyui (python3, pid 7) holds 3.42 GiB"
    assert lines[1] == "  Failsoft: nothing new starts on the GPU"
    assert lines[2].startswith("Device now: ") and "free of 4.00 GiB, read every 1 s" in lines[2]
    assert lines[3:] == [
        "  other    comfyui (python3, pid 7) 3.42 GiB",
        "  Failsoft gpu (llama-server, pid 4242) 344.00 MiB",
    ]


def sample(at: float, hog: int) -> dict[str, Any]:
    own = process(4242, "gpu", 344 * MiB, own=True, name="llama-server")
    others = [process(7, "comfyui", hog)] if hog else []
    used = 344 * MiB + hog + 16 * MiB  # 16 MiB that no process accounts for
    return {
        "at": at,
        "state": "normal",
        "total_bytes": 4 * GiB,
        "free_bytes": 4 * GiB - used,
        "used_bytes": used,
        "processes": [own, *others],
    }


def test_the_timeline_stacks_the_main_model_others_and_free_up_to_the_total() -> None:
    history = {
        "watching": True,
        "reserve_bytes": 410 * MiB,
        "samples": [sample(100.0, 0), sample(101.0, 1 * GiB), sample(102.0, 0)],
        "markers": [
            {"at": 101.2, "kind": "path", "text": "GPU squeezed"},
            {"at": 5.0, "kind": "load", "text": "old"},
        ],
    }
    line = timeline(history, make_status()["plan"])
    assert line.times == [-2.0, -1.0, 0.0]
    keys = [band.key for band in line.series]
    assert keys == ["weights", "kv", "compute", "program:comfyui (python3, pid 7)", "unlisted", "free"]
    weights = next(band for band in line.series if band.key == "weights")
    share = round(344 * MiB * 98 / (98 + 180 + 66))  # the plan's split of the main worker's share
    assert round(weights.values[0]) == share
    tops = stacked(line.series)
    assert [round(top) for top in tops[-1]] == [4 * GiB] * 3  # every reading adds up to the device
    assert [(round(m.at, 3), m.kind) for m in line.markers] == [(-0.8, "path")]  # older ones dropped


def test_no_timeline_without_a_watched_gpu() -> None:
    line = timeline({"watching": False, "reason": "no NVIDIA GPU", "samples": []}, None)
    assert line.empty and line.note == "no NVIDIA GPU"
