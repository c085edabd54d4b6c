"""The shared vocabulary is defined once and every user of a word agrees with it."""

from __future__ import annotations

from tray_app.contract.vocabulary import (
    FAILURE_KINDS,
    FINAL_JOB_STATES,
    JOB_STATES,
    UNFINISHED_JOB_STATES,
    WORKER_STATES,
    JobState,
    Reason,
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
