"""`failsoft drill --scenario h,i,j` end to end on a simulated 4 GiB GPU: one real service started by the
drill, with its library models (the main model's weights as drill-big, its stand-in the main model, and
drill-other; one loaded on the GPU at a time). Each decision is the one the policy prescribes, the right
model and device answered, nothing is lost or doubled, and nothing the drill started is left running."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.drill.test_drill_run import drill_env, processes_under

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUN_TIMEOUT = 300


@pytest.fixture(scope="module")
def ladder_run(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> dict[str, Any]:
    env, scratch = drill_env(tmp_path_factory.mktemp("drill-ladder"))
    command = [sys.executable, "-m", "tray_app", "drill", "--simulate-vram", "4GiB", "--scenario", "h,i,j"]
    done = subprocess.run(
        [*command, "--json"], env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return {"report": json.loads(done.stdout), "scratch": scratch, "main": model_path.name}


def test_the_ladder_and_the_eviction_rule_hold(ladder_run: dict[str, Any]) -> None:
    report, main = ladder_run["report"], ladder_run["main"]
    records = {record["key"]: record for record in report["scenarios"]}
    assert list(records) == ["h", "i", "j"] and report["passed"] is True
    for record in records.values():
        assert not record["skipped"], record
        assert record["decision_ok"], (record["key"], record["expected"], record["actual"], record["notes"])
        assert record["lost"] == 0 and record["doubled"] == 0, record
        assert record["problems"] == [] and record["failed_checks"] == [], record
        assert record["answered_by"] == record["expected_answerer"], record
        assert record["connection_survived"] is True, record

    # h: pressure took the big model's GPU share; its stand-in (the main model) answered on the GPU.
    assert records["h"]["actual"] == "gpu (stand_in) -> completed"
    assert records["h"]["answered_by"] == f"{main} on GPU, stand-in for drill-big"
    assert any(note.startswith("released ") for note in records["h"]["notes"])
    # i: the same request refusing a stand-in: drill-big on its own CPU worker.
    assert records["i"]["actual"] == "cpu (gpu_unavailable) -> completed"
    assert records["i"]["answered_by"] == "drill-big on CPU" and records["i"]["cpu_started_at"] is not None
    # j: drill-other loaded in place of the idle drill-big; with drill-other busy, drill-big got its stand-in.
    assert records["j"]["actual"] == (
        "drill-other: gpu (-) -> completed, drill-big unloaded; drill-other kept, "
        "drill-big: gpu (stand_in) -> completed"
    )
    assert records["j"]["answered_by"] == f"drill-other on GPU; {main} on GPU, stand-in for drill-big"
    assert len(records["j"]["job_ids"]) == 4 and set(records["j"]["final_states"]) == {"completed"}


def test_nothing_the_drill_started_is_left(ladder_run: dict[str, Any]) -> None:
    assert processes_under(ladder_run["scratch"]) == []
    assert list(ladder_run["scratch"].iterdir()) == []
