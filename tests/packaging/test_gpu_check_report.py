"""The GPU check's report without a GPU: each phase's own budget (the total limit only keeps later phases from
starting), the report and the logs written as each phase ends, what comes back from the GPU machine packed
as at most 8 files, and the run's clean stop where there is no GPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "packaging" / "gpu_check.py"
sys.path.insert(0, str(ROOT / "packaging"))

import check_report  # noqa: E402
from check_report import (  # noqa: E402
    MAX_OUT_FILE_BYTES,
    PHASE_BUDGETS,
    SERVICE_PHASES,
    PhaseStop,
    Report,
    budget_of,
    pack_out,
)

from tests.packaging.test_gpu_check import _has_nvidia_gpu  # noqa: E402

MIB = 1024 * 1024
OUT_NAME = re.compile(r"^[A-Za-z0-9._-]+$")  # what the GPU machine sends back


def _report(tmp_path: Path, seconds_left: float) -> Report:
    return Report(tmp_path / "gpu-check.json", time.time() + seconds_left)


def _on_disk(report: Report) -> dict[str, object]:
    data: dict[str, object] = json.loads(report.path.read_text())
    return data


# ------------------------------------------------------------------------------------------ budgets
def test_a_phase_keeps_its_whole_budget_however_little_of_the_total_is_left(tmp_path: Path) -> None:
    """The issue: `--time-limit 300` cut the engine's build at 97 s because its budget was the total less the
    later phases'. Now the engine's budget is its own."""
    report = _report(tmp_path, seconds_left=5)
    with report.phase("engine") as entry:
        assert entry["budget_seconds"] == PHASE_BUDGETS["engine"] == 480
    with report.phase("bench", 33) as entry:
        assert entry["budget_seconds"] == 33  # a budget given is taken as it is, not cut to what is left
    assert report.phases["engine"]["status"] == "ok"


def test_once_the_total_is_spent_no_phase_starts_but_teardown(tmp_path: Path) -> None:
    report = _report(tmp_path, seconds_left=0.3)
    ran = []
    with report.phase("smoke"):
        time.sleep(0.4)  # runs past the total: it is not cut, it ends as it would
        ran.append("smoke")
    with pytest.raises(PhaseStop) as stopped, report.phase("service"):
        ran.append("service")
    assert stopped.value.status == "out_of_time"
    with report.phase("teardown"):
        ran.append("teardown")
    assert ran == ["smoke", "teardown"]
    phases = _on_disk(report)["phases"]
    assert isinstance(phases, dict)
    assert phases["smoke"]["status"] == "ok" and phases["smoke"]["seconds"] >= 0.4
    assert phases["service"]["status"] == "not_started"
    assert "total time limit" in phases["service"]["message"]
    assert phases["teardown"]["status"] == "ok"


def test_the_budgets_in_order_and_what_the_service_half_may_take() -> None:
    names = list(PHASE_BUDGETS)
    assert names[:7] == ["host", "gpu", "python_env", "engine", "model", "probe", "smoke"]
    assert names[-1] == "teardown" and "bench" in names
    assert list(SERVICE_PHASES) == names[names.index("smoke") :]
    assert budget_of(SERVICE_PHASES) == sum(PHASE_BUDGETS[name] for name in SERVICE_PHASES)
    # Everything before the service half fits a 10-minute device call even with an on-device build.
    assert budget_of(names[: names.index("smoke")]) <= 1000


def test_a_phase_over_its_budget_says_so(tmp_path: Path) -> None:
    report = _report(tmp_path, seconds_left=60)
    with report.phase("gpu", 0.01):
        time.sleep(0.05)
    assert report.phases["gpu"]["over_budget"] is True


# ------------------------------------------------------------------------------------ as each phase ends
def test_the_report_is_on_disk_as_each_phase_ends(tmp_path: Path) -> None:
    report = _report(tmp_path, seconds_left=60)
    with report.phase("host") as entry:
        entry["found"] = 1
        assert _on_disk(report)["phases"] == {"host": {"status": "running", "budget_seconds": 120}}
    with report.phase("gpu"):
        phases = _on_disk(report)["phases"]
        assert isinstance(phases, dict)
        assert phases["host"]["status"] == "ok" and phases["host"]["found"] == 1
        assert phases["gpu"]["status"] == "running"
    with pytest.raises(PhaseStop), report.phase("engine"):
        raise RuntimeError("the build broke")
    phases = _on_disk(report)["phases"]
    assert isinstance(phases, dict)
    assert phases["engine"]["status"] == "failed"
    assert phases["engine"]["message"] == "RuntimeError: the build broke"
    assert not list(tmp_path.glob("*.partial"))


def test_the_logs_go_under_out_as_each_phase_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    monkeypatch.setenv("OUT", str(out))
    report = Report(out / "gpu-check.json", time.time() + 60)
    report.add_log_dirs(logs)
    (logs / "engine-build.log").write_text("[1/414] compiling\n")
    with report.phase("engine"):
        pass
    assert (out / "gpu-check-engine.log").read_text() == "[1/414] compiling\n"
    (logs / "engine-build.log").write_text("[1/414] compiling\n[414/414] linking\n")
    (logs / "probe-import.log").write_text("Fatal Python error: Segmentation fault\n")
    with pytest.raises(PhaseStop), report.phase("probe"):
        raise RuntimeError("killed")  # a phase that fails writes them too
    assert "[414/414] linking" in (out / "gpu-check-engine.log").read_text()
    assert "Segmentation fault" in (out / "gpu-check-probe.log").read_text()
    assert json.loads((out / "gpu-check.json").read_text())["phases"]["probe"]["status"] == "failed"


# ------------------------------------------------------------------------------------------ at most 8 files
def _logs(tmp_path: Path) -> list[Path]:
    made = []
    names = {
        "state/logs": ["engine-build.log", "probe-import.log", "probe-serve_gpu.log", "probe-vocab_only.log"],
        "state/service": ["serve-41234.log"],
        "state/service/logs": ["gpu-worker.log", "cpu-worker.log", "failsoft.log", "bench-split-worker.log"],
        "state/moe/logs": [f"moe-{budget}.log" for budget in (36, 40, 44, 48, 52, 96)],
    }
    for folder, files in names.items():
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        for name in files:
            path = tmp_path / folder / name
            path.write_text(f"first line of {name}\n" + "x" * 100 + f"\nlast line of {name}\n")
            made.append(path)
    big = tmp_path / "state/service/logs/gpu-worker.log"
    big.write_bytes(b"early\n" * (6 * MIB // 6) + b"the very end of the gpu worker's log\n")
    return made


def test_everything_comes_back_as_at_most_eight_files(tmp_path: Path) -> None:
    made = _logs(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "gpu-check.json").write_text("{}")
    folders = sorted({path.parent for path in made})
    written = pack_out(out, folders)
    files = sorted(path.name for path in out.iterdir())
    assert len(files) <= 8 and "gpu-check.json" in files
    assert set(written) | {"gpu-check.json"} == set(files)
    assert all(OUT_NAME.match(name) for name in files)
    assert all((out / name).stat().st_size <= MAX_OUT_FILE_BYTES + 1024 for name in files)
    kinds = ("engine", "probe", "serve", "gpu-worker", "cpu-worker")
    assert {f"gpu-check-{kind}.log" for kind in kinds} <= set(files)
    gpu = (out / "gpu-check-gpu-worker.log").read_text()
    assert gpu.endswith("the very end of the gpu worker's log\n")  # its end kept, its start cut
    assert gpu.startswith("[... the first")
    probe = (out / "gpu-check-probe.log").read_text()
    assert "last line of probe-import.log" in probe and "last line of probe-serve_gpu.log" in probe
    everything = "".join((out / name).read_text() for name in files)
    for path in made:
        if path.name != "gpu-worker.log":
            assert f"last line of {path.name}" in everything, path.name


def test_fewer_files_allowed_still_leave_out_no_log(tmp_path: Path) -> None:
    made = _logs(tmp_path)
    out = tmp_path / "out"
    written = pack_out(out, sorted({path.parent for path in made}), max_files=4)
    assert len(written) <= 3  # and the report
    everything = "".join((out / name).read_text() for name in written)
    assert all(path.name in everything or path.name == "engine-build.log" for path in made)
    assert "last line of moe-96.log" in everything


def test_a_later_pack_replaces_what_an_earlier_one_wrote(tmp_path: Path) -> None:
    logs, out = tmp_path / "logs", tmp_path / "out"
    logs.mkdir()
    (logs / "moe-36.log").write_text("moe\n")
    assert pack_out(out, [logs]) == ["gpu-check-more.log"]
    (logs / "moe-36.log").unlink()
    (logs / "engine-build.log").write_text("engine\n")
    assert pack_out(out, [logs]) == ["gpu-check-engine.log"]
    assert sorted(path.name for path in out.iterdir()) == ["gpu-check-engine.log"]


# ------------------------------------------------------------------------------------------ no GPU
@pytest.mark.skipif(_has_nvidia_gpu(), reason="this machine has an NVIDIA GPU: the check would go on")
def test_without_a_gpu_the_run_stops_cleanly_with_its_budgets_and_files(tmp_path: Path) -> None:
    carry, out = tmp_path / "carry", tmp_path / "out"
    (carry / "wheels").mkdir(parents=True)
    (carry / "llama-cpp-src.tar.gz").write_bytes(b"x" * 1000)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "run", "--carry", str(carry), "--state", str(tmp_path / "state"),
         "--time-limit", "20"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OUT": str(out)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    report = json.loads((out / "gpu-check.json").read_text())
    assert report["verdict"] == "no_gpu" and list(report["phases"]) == ["host", "gpu"]
    for name in ("host", "gpu"):  # their own budgets, not a share of the 20 s
        assert report["phases"][name]["budget_seconds"] == PHASE_BUDGETS[name]
    assert report["time_limit_seconds"] == 20
    assert report["phases"]["host"]["machine"]["boot_id"]
    assert len(list(out.iterdir())) <= check_report.MAX_OUT_FILES
    assert not list(out.glob("*.partial")) and not list(out.glob(".*"))
