"""`failsoft drill` end to end on a simulated 4 GiB GPU: a real service with real workers, started by the
drill itself, every scenario plus memory pressure; the invariants hold, each decision is the expected one,
the report files exist and parse, and nothing the drill started is left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from tray_app.contract.sizes import parse_size

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PRESSURE = "3.5GiB"
RUN_TIMEOUT = 420


def processes_under(root: Path) -> list[psutil.Process]:
    """Live processes whose data dir lies under `root` (the drill's service and its workers inherit it)."""
    found = []
    for process in psutil.process_iter():
        try:
            if str(process.environ().get("FAILSOFT_DATA_DIR", "")).startswith(str(root)):
                found.append(process)
        except psutil.Error:
            continue
    return found


def drill_env(root: Path) -> tuple[dict[str, str], Path]:
    """The environment of a `failsoft drill` run whose files all live under `root`, and its scratch dir
    (the drill's service runs from a temporary directory under there)."""
    scratch = root / "tmp"
    scratch.mkdir()
    env = {
        **os.environ,
        "FAILSOFT_CONFIG": str(root / "config.toml"),
        "FAILSOFT_DATA_DIR": str(root / "data"),
        "FAILSOFT_LOG_DIR": str(root / "logs"),
        "TMPDIR": str(scratch),
    }
    return env, scratch


def drill_json(env: dict[str, str], scenarios: str, timeout: float = 300) -> dict[str, Any]:
    """`failsoft drill --simulate-vram 4GiB --scenario <scenarios> --json` in `env`: its report, once it
    exited 0."""
    command = [sys.executable, "-m", "tray_app", "drill", "--simulate-vram", "4GiB", "--scenario", scenarios]
    done = subprocess.run(
        [*command, "--json"], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    return report


@pytest.fixture(scope="module")
def drill_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("drill")
    env, scratch = drill_env(root)
    command = [sys.executable, "-m", "tray_app", "drill", "--simulate-vram", "4GiB", "--pressure", PRESSURE]
    command += ["--scenario", "a,b,c,d,e,f,g", "--json"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)
    return {
        "returncode": done.returncode,
        "stdout": done.stdout,
        "stderr": done.stderr,
        "data_dir": root / "data",
        "scratch": scratch,
    }


@pytest.fixture(scope="module")
def report(drill_run: dict[str, Any]) -> dict[str, Any]:
    assert drill_run["returncode"] == 0, drill_run["stderr"][-4000:]
    data: dict[str, Any] = json.loads(drill_run["stdout"])
    return data


def scenario(report: dict[str, Any], key: str) -> dict[str, Any]:
    found: dict[str, Any] = next(s for s in report["scenarios"] if s["key"] == key)
    return found


def test_nothing_lost_nothing_doubled_no_tool_repeated(report: dict[str, Any]) -> None:
    assert [s["key"] for s in report["scenarios"]] == list("abcdefg")
    for record in report["scenarios"]:
        assert not record["skipped"], record
        assert record["lost"] == 0 and record["doubled"] == 0, record
        assert record["tool_executions"] <= record["tool_calls_intended"], record
        assert record["problems"] == [], record
    assert report["passed"] is True and report["failures"] == {}


def test_each_decision_is_the_expected_one(report: dict[str, Any]) -> None:
    for record in report["scenarios"]:
        assert record["decision_ok"], (record["key"], record["expected"], record["actual"], record["notes"])
    for key in "ab":
        assert scenario(report, key)["actual"] == "cpu (exceeds_gpu_profile) -> completed"
        assert scenario(report, key)["first_error_kind"] is None
    cancelled = scenario(report, "c")
    assert cancelled["actual"] == "cpu (crash_abort) -> cancelled"
    assert any("attempts: gpu failed, cpu cancelled" in note for note in cancelled["notes"])
    assert scenario(report, "d")["actual"].startswith("4/4 completed")
    assert scenario(report, "e")["actual"] == "cpu (crash_abort) -> completed"
    assert scenario(report, "f")["actual"] == "cpu (crash_abort) -> completed"
    assert scenario(report, "g")["actual"] == "cpu (hung) -> completed"
    # The report names the engine that ran every scenario, and its llama.cpp commit.
    assert report["service"]["engine"]["commit"] and report["service"]["engine"]["version"]


def test_failures_are_timed_and_the_cpu_took_over(report: dict[str, Any]) -> None:
    for key in "cdefg":
        record = scenario(report, key)
        assert record["first_error_kind"], record
        assert 0 <= record["first_error_at"] <= record["cpu_started_at"] <= record["total_seconds"], record
    for key in "ab":
        assert scenario(report, key)["cpu_started_at"] is not None


def test_one_tool_execution_per_intended_call(report: dict[str, Any]) -> None:
    agent = scenario(report, "e")
    assert agent["tool_calls_intended"] == 1 and agent["tool_executions"] == 1
    assert "5" in agent["output_head"]  # the model answered with the tool's result (2 + 3)


def test_outputs_connections_and_the_replay_answer(report: dict[str, Any]) -> None:
    for record in report["scenarios"]:
        assert len(record["output_sha256"]) == 64 and record["output_head"], record
        expected_connection = None if record["key"] == "c" else True
        assert record["connection_survived"] is expected_connection, record
    # At temperature 0 with the pinned seed, a non-streamed replay on the CPU says what the GPU would have.
    assert scenario(report, "f")["same_as_unfaulted"] is True


def test_pressure_went_through_the_simulated_ledger_and_was_released(report: dict[str, Any]) -> None:
    pressure = report["pressure"]
    size = parse_size(PRESSURE)
    assert pressure["mode"] == "simulated" and "error" not in pressure
    assert pressure["held_bytes"] == size and pressure["released_bytes"] == size
    assert pressure["during"]["device_free_bytes"] == pressure["before"]["device_free_bytes"] - size
    assert pressure["during"]["n_gpu_layers"] < pressure["before"]["n_gpu_layers"]
    assert pressure["after"]["n_gpu_layers"] == pressure["before"]["n_gpu_layers"]
    assert pressure["after"]["device_free_bytes"] == pressure["before"]["device_free_bytes"]
    assert pressure["probe"]["status"] == 200 and pressure["probe"]["worker"] in ("gpu", "cpu")


def test_report_files_exist_and_match(drill_run: dict[str, Any], report: dict[str, Any]) -> None:
    reports = drill_run["data_dir"] / "reports"
    (json_file,) = reports.glob("drill-*.json")
    (md_file,) = reports.glob("drill-*.md")
    assert json.loads(json_file.read_text()) == report
    written = md_file.read_text()
    assert "## Scenarios" in written and "## Memory pressure" in written and "**PASSED**" in written


def test_nothing_the_drill_started_is_left(drill_run: dict[str, Any]) -> None:
    assert processes_under(drill_run["scratch"]) == []
    assert list(drill_run["scratch"].iterdir()) == []  # its temporary service directory is gone too
