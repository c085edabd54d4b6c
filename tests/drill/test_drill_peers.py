"""`failsoft drill --scenario m,n` for real: the drill starts a pair of services, each on its own simulated
GPU, the second the first's peer. m: with this GPU worker stopped, the peer's GPU answers, once, under the
request's id. n: the peer's service killed (SIGKILL) mid-stream, this CPU finishes the answer, whole and
once, and the peer is reported down. Nothing the drill started is left running, the killed peer included."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.drill.test_drill_run import drill_env, drill_json, processes_under
from tray_app.drill.peer_pair import PEER_NAME

pytestmark = pytest.mark.integration


def test_the_peer_answers_and_this_cpu_finishes_what_a_killed_peer_began(tmp_path: Path) -> None:
    env, scratch = drill_env(tmp_path)
    report = drill_json(env, "m,n")
    records = {record["key"]: record for record in report["scenarios"]}
    assert list(records) == ["m", "n"] and report["passed"] is True
    for record in records.values():
        assert not record["skipped"] and record["decision_ok"], record
        assert (record["lost"], record["doubled"], record["final_states"]) == (0, 0, ["completed"]), record
        assert record["problems"] == [] and record["failed_checks"] == [], record
        assert record["connection_survived"] is True, record

    gpu_taken = records["m"]
    assert gpu_taken["actual"] == "peer (gpu_unavailable) -> completed"
    assert gpu_taken["answered_by"].endswith(f" on peer {PEER_NAME}")
    (ran,) = [note for note in gpu_taken["notes"] if note.startswith(f"peer {PEER_NAME} at ")]
    assert " ran 1 job(s): " in ran and ", gpu completed)" in ran, ran

    peer_killed = records["n"]
    assert peer_killed["actual"] == "cpu (exited) -> completed"
    assert peer_killed["answered_by"].endswith(" on CPU")
    assert peer_killed["first_error_at"] <= peer_killed["cpu_started_at"] <= peer_killed["total_seconds"]
    assert f"this service reports peer {PEER_NAME} down" in peer_killed["notes"]
    assert processes_under(scratch) == [] and list(scratch.iterdir()) == []
