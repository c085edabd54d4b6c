"""The shared vocabulary is defined once and every user of a word agrees with it."""

from __future__ import annotations

import pytest

from tray_app.contract.vocabulary import (
    FAILURE_KINDS,
    FINAL_JOB_STATES,
    JOB_KINDS,
    JOB_STATES,
    UNFINISHED_JOB_STATES,
    WORKER_STATES,
    JobState,
    Reason,
    job_kind,
)
from tray_app.jobs import journal, policy, registry
from tray_app.supervisor import STATES, classify


def test_job_states_split_into_unfinished_and_final() -> None:
    assert set(UNFINISHED_JOB_STATES) | FINAL_JOB_STATES == set(JOB_STATES)
    assert not set(UNFINISHED_JOB_STATES) & FINAL_JOB_STATES
    assert set(registry.TRANSITIONS) == set(JOB_STATES)  # the state machine covers every state
    assert all(not registry.TRANSITIONS[state] for state in FINAL_JOB_STATES)
    assert journal.UNFINISHED == UNFINISHED_JOB_STATES


def test_codes_are_the_strings_on_the_wire() -> None:
    assert JobState.AWAITING_APPROVAL == "awaiting_approval" and f"{JobState.QUEUED}" == "queued"
    assert policy.CPU_TOO_SLOW == Reason.CPU_TOO_SLOW == "cpu_too_slow"
    assert classify.FAILURE_KINDS is FAILURE_KINDS and STATES is WORKER_STATES


def test_every_reason_a_job_ends_with_in_the_source_is_a_code_of_the_contract() -> None:
    """A job's end reason travels to clients, the journal and the tray: a bare string passed to the registry
    must be a `Reason` (or a failure kind, the supervisor's words for how a worker failed)."""
    import re
    from pathlib import Path

    import tray_app
    from tray_app.contract.vocabulary import FAILURE_KINDS, Reason

    known = {reason.value for reason in Reason} | set(FAILURE_KINDS)
    # registry.fail(job, "state", {error} or error.record(), "reason"), on one line or several
    bare = re.compile(r'\.fail\(\s*\w+,\s*"\w+",\s*(?:\{[^{}]*\}|[\w.]+\(\)),\s*"(\w*)",?\s*\)')
    package = Path(tray_app.__file__).parent
    strangers = [
        f"{path.relative_to(package)}: {code!r}"
        for path in package.rglob("*.py")
        for code in bare.findall(path.read_text())
        if code and code not in known
    ]
    assert strangers == []


def test_a_stored_job_kind_reads_back_as_one_of_the_kinds() -> None:
    assert JOB_KINDS == ("chat", "completion", "embedding")
    assert [job_kind(kind) for kind in ("chat", "completion", "embedding")] == list(JOB_KINDS)
    with pytest.raises(ValueError, match="unknown job kind 'chats'"):
        job_kind("chats")
