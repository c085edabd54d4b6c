"""The CPU mirror's rules (jobs.policy): what is worth mirroring, which reads go first, piece sizes, when a
stream's answer is read, and the failover estimate with the mirrored share of a prompt."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tray_app.jobs import policy
from tray_app.jobs.policy import CpuState, FailureContext, MirrorCase, MirrorWork, Settings

# A CPU that reads 100 prompt tokens a second; the mirror's default threshold, one second.
CASE = MirrorCase(
    prompt_tokens=50, max_tokens=20, streaming=False, tools=False, prompt_tokens_per_second=100.0, min_ms=1000
)


@pytest.mark.parametrize(
    ("name", "case", "reason"),
    [
        ("a short prompt, not streamed: not worth it", CASE, ""),
        ("a prompt the CPU reads for a second or more", replace(CASE, prompt_tokens=100), "long_prompt"),
        ("a stream that may grow past a second", replace(CASE, streaming=True, max_tokens=60), "stream"),
        ("a stream that stays short", replace(CASE, streaming=True, max_tokens=20), ""),
        ("an agent's request, however short", replace(CASE, tools=True), "agent"),
        (
            "a CPU speed not known yet counts as slow",
            replace(CASE, prompt_tokens_per_second=0),
            "long_prompt",
        ),
        ("a higher threshold", replace(CASE, prompt_tokens=100, min_ms=1500), ""),
    ],
)
def test_what_is_worth_mirroring(name: str, case: MirrorCase, reason: str) -> None:
    assert policy.mirror_reason(case) == reason, name


def test_reads_go_newest_first_and_the_oldest_are_given_up() -> None:
    work = [MirrorWork(f"job-{n}", 100, updated_at=float(n)) for n in range(5)]
    keep, drop = policy.mirror_order(work, limit=3, prompt_tokens_per_second=100.0)
    assert keep == ["job-4", "job-3", "job-2"]
    assert drop == ["job-1", "job-0"]


def test_work_with_nothing_behind_is_neither_read_nor_given_up() -> None:
    keep, drop = policy.mirror_order([MirrorWork("done", 0, 9.0)], limit=1, prompt_tokens_per_second=1.0)
    assert (keep, drop) == ([], [])


def test_a_read_the_cpu_cannot_catch_up_with_is_given_up() -> None:
    far = int(policy.MIRROR_CATCH_UP_SECONDS * 10) + 10  # more than five minutes at 10 tokens/s
    work = [MirrorWork("far", far, 2.0), MirrorWork("near", 100, 1.0)]
    assert policy.mirror_order(work, limit=8, prompt_tokens_per_second=10.0) == (["near"], ["far"])
    # While the speed is unknown nothing is judged too far.
    assert policy.mirror_order(work, limit=8, prompt_tokens_per_second=0.0) == (["far", "near"], [])


def test_pieces_are_about_half_a_second_of_reading() -> None:
    assert policy.mirror_piece_tokens(200.0) == 100
    assert policy.mirror_piece_tokens(10.0) == policy.MIRROR_PIECE_MIN
    assert policy.mirror_piece_tokens(1e6) == policy.MIRROR_PIECE_MAX
    assert policy.mirror_piece_tokens(0.0) == policy.MIRROR_PIECE_MIN


def test_a_streams_answer_goes_to_the_mirror_by_tokens_or_by_time() -> None:
    assert policy.extend_due(64, 0.1, every_tokens=64, every_seconds=2.0)
    assert not policy.extend_due(10, 0.1, every_tokens=64, every_seconds=2.0)
    assert policy.extend_due(10, 2.5, every_tokens=64, every_seconds=2.0)
    assert not policy.extend_due(0, 9.0, every_tokens=64, every_seconds=2.0)  # nothing new
    assert not policy.extend_due(100, 9.0, every_tokens=0, every_seconds=0)  # both off


def test_the_prompt_speed_is_measured_or_estimated_from_generation() -> None:
    assert policy.cpu_prompt_speed(120.0, 50.0) == 120.0
    assert policy.cpu_prompt_speed(0.0, 50.0) == 50.0 * policy.PROMPT_SPEEDUP


def test_the_estimate_reads_only_what_the_mirror_did_not() -> None:
    assert policy.estimate_cpu_seconds(800, 10, 10.0, cached_tokens=800) == pytest.approx(1.0)
    assert policy.estimate_cpu_seconds(800, 10, 10.0, cached_tokens=400) == pytest.approx(6.0)
    assert policy.estimate_cpu_seconds(800, 10, 10.0) == pytest.approx(11.0)


def test_a_mirrored_prompt_needs_no_approval() -> None:
    """A long prompt on a slow CPU asks the user; the same job with its prompt mirrored runs at once."""
    cpu = CpuState(enabled=True, ready=True, ram_ok=True, tokens_per_second=10.0, n_ctx_per_seq=8192)
    failure = FailureContext(
        streaming=False,
        content_delivered=False,
        tool_call_delivered=False,
        prompt_tokens=4000,
        remaining_tokens=50,
        time_left=30.0,
    )
    settings = Settings(fallback="approval", auto_approve_seconds=10.0)
    assert policy.decide_replay(failure, cpu, settings).action == "approval"  # 55 s
    mirrored = policy.decide_replay(replace(failure, cached_tokens=4000), cpu, settings)
    assert (mirrored.action, mirrored.estimated_seconds) == ("cpu", pytest.approx(5.0))
