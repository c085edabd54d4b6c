"""`failsoft drill --scenario k` for real: a hog process takes the drill's simulated GPU in the middle of a
stream; the report says it was seen and named within two polls, what the service did with the GPU worker
killed under it, and that the GPU came back after the hog exited, with every job answered once."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.drill.test_drill_run import drill_env, processes_under

pytestmark = pytest.mark.integration


def test_another_program_takes_the_gpu_and_gives_it_back(tmp_path: Path) -> None:
    env, _scratch = drill_env(tmp_path)
    command = [
        sys.executable,
        "-m",
        "tray_app",
        "drill",
        "--simulate-vram",
        "4GiB",
        "--scenario",
        "k",
        "--json",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (record,) = json.loads(done.stdout)["scenarios"]
    assert record["key"] == "k" and not record["skipped"] and record["decision_ok"], record
    assert (record["lost"], record["doubled"], record["final_states"]) == (0, 0, ["completed"] * 3)
    seen, killed, back = record["notes"]
    delay = re.search(r"seen and named after [\d.]+ s \(([\d.]+) poll intervals", seen)
    assert delay is not None and float(delay.group(1)) <= 2.0, seen
    assert "drill-hog (" in seen and "GPU path squeezed" in seen
    assert "stays off the GPU" in killed or "back with n_ctx" in killed
    assert re.search(r"hog exited: GPU path normal and the GPU worker ready [\d.]+ s later", back)
    assert record["answered_by"].split("; ")[-1].endswith("on GPU")  # the GPU answers again afterwards
    assert not processes_under(tmp_path)
