"""The GPU check's watcher verdict on sample figures: a hog must be listed soon, as another program, with at
least the memory it took, and be gone after it exits."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging"))

from gpu_check_watcher import judge_watcher, listed  # noqa: E402

MIB = 1024 * 1024
HOG = 1024 * MIB


def test_a_hog_listed_in_time_with_its_memory_and_gone_after_passes() -> None:
    entry = {"pid": 4242, "name": "python3", "used_bytes": HOG + 300 * MIB, "own": False}
    assert judge_watcher(1.2, entry, 0.9, HOG) == []


def test_each_failure_is_named() -> None:
    assert judge_watcher(None, None, None, HOG) == ["the watcher did not list the hog within 5 s"]
    late_own_small = {"pid": 4242, "used_bytes": 10 * MIB, "own": True}
    problems = judge_watcher(7.5, late_own_small, None, HOG)
    assert [p.split(" ")[3] for p in problems] == ["listed", "listed", "listed", "still"]
    assert "after 7.5 s" in problems[0] and "10 MiB" in problems[2]


def test_unknown_memory_is_not_held_against_the_watcher() -> None:
    # NVML under WDDM and some vGPUs report no per-process memory: the pid alone is what can be checked.
    assert judge_watcher(1.0, {"pid": 4242, "used_bytes": None, "own": False}, 1.0, HOG) == []


def test_listed_finds_the_pid_in_the_status() -> None:
    status = {"device_now": {"processes": [{"pid": 1, "own": True}, {"pid": 4242, "own": False}]}}
    assert listed(status, 4242) == {"pid": 4242, "own": False}
    assert listed(status, 7) is None and listed(None, 4242) is None
