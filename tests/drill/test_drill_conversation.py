"""`failsoft drill --scenario l` for real: a conversation of several turns, over 1,500 prompt tokens, on its
own service with longer GPU slots; the GPU worker is killed (SIGKILL) mid-stream in the last turn, which is
resumed once on the CPU, and the CPU finds the whole conversation in its cache (the mirror read it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.drill.test_drill_run import drill_env, drill_json, processes_under

pytestmark = pytest.mark.integration


def test_a_long_conversation_fails_over_onto_what_the_mirror_read(tmp_path: Path) -> None:
    env, _scratch = drill_env(tmp_path)
    report = drill_json(env, "l", timeout=400)
    (record,) = report["scenarios"]
    assert record["key"] == "l" and not record["skipped"] and record["decision_ok"], record
    assert (record["lost"], record["doubled"], record["final_states"]) == (0, 0, ["completed"])
    assert report["service"]["caps"]["n_ctx_per_seq"] >= 1900  # its own service, longer slots
    (turn,) = [note for note in record["notes"] if note.startswith("last turn")]
    found = re.search(r"last turn (\d+) prompt tokens; .* the CPU found (\d+) cached; pause", turn)
    assert found is not None, turn
    prompt, cached = int(found.group(1)), int(found.group(2))
    assert prompt > 1500 and cached >= prompt - 100, turn  # all but the follow-up question, at least
    assert not processes_under(tmp_path)
