"""The failover policy as a table: every rule, each reason code, and the order the rules apply in."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tray_app.jobs import policy
from tray_app.jobs.policy import CpuState, Decision, FailureContext, RouteRequest, Settings

FAST_CPU = CpuState(enabled=True, ready=True, ram_ok=True, tokens_per_second=50.0, n_ctx_per_seq=4096)
NOTHING_SENT = FailureContext(
    streaming=False,
    content_delivered=False,
    tool_call_delivered=False,
    prompt_tokens=80,
    remaining_tokens=100,
    time_left=60.0,
)
AUTO = Settings()

REPLAY_CASES = [
    # (name, failure, cpu, settings, expected action, expected reason, resume)
    ("nothing sent, fast CPU: replay", NOTHING_SENT, FAST_CPU, AUTO, "cpu", "", False),
    (
        "a stand-in's streamed text is not continued by the asked model (review N6)",
        replace(NOTHING_SENT, streaming=True, content_delivered=True, stand_in_answering=True),
        FAST_CPU,
        AUTO,
        "refuse",
        policy.STREAM_STARTED,
        False,
    ),
    (
        "a stand-in's answer nobody saw yet is replayed whole by the asked model",
        replace(NOTHING_SENT, stand_in_answering=True),
        FAST_CPU,
        AUTO,
        "cpu",
        "",
        False,
    ),
    (
        "tool call delivered: never again",
        replace(NOTHING_SENT, tool_call_delivered=True, streaming=True, content_delivered=True),
        FAST_CPU,
        AUTO,
        "refuse",
        policy.EFFECTS_DELIVERED,
        False,
    ),
    (
        "tool call delivered beats every other rule",
        replace(NOTHING_SENT, tool_call_delivered=True),
        replace(FAST_CPU, ready=False),
        AUTO,
        "refuse",
        policy.EFFECTS_DELIVERED,
        False,
    ),
    (
        "stream started, policy error",
        replace(NOTHING_SENT, streaming=True, content_delivered=True),
        FAST_CPU,
        replace(AUTO, stream_after_content="error"),
        "refuse",
        policy.STREAM_STARTED,
        False,
    ),
    (
        "stream bound to a schema started: a continuation could not keep it",
        replace(NOTHING_SENT, streaming=True, content_delivered=True, constrained=True),
        FAST_CPU,
        AUTO,
        "refuse",
        policy.CONSTRAINED_STREAM_STARTED,
        False,
    ),
    (
        "bound to a schema, nothing sent yet: a whole replay keeps it",
        replace(NOTHING_SENT, streaming=True, constrained=True),
        FAST_CPU,
        AUTO,
        "cpu",
        "",
        False,
    ),
    (
        "stream started, policy resume",
        replace(NOTHING_SENT, streaming=True, content_delivered=True),
        FAST_CPU,
        AUTO,
        "cpu",
        "",
        True,
    ),
    (
        "stream not yet started: plain replay even with policy error",
        replace(NOTHING_SENT, streaming=True),
        FAST_CPU,
        replace(AUTO, stream_after_content="error"),
        "cpu",
        "",
        False,
    ),
    (
        "CPU worker not ready",
        NOTHING_SENT,
        replace(FAST_CPU, ready=False),
        AUTO,
        "refuse",
        policy.NO_CPU_WORKER,
        False,
    ),
    (
        "CPU worker disabled",
        NOTHING_SENT,
        replace(FAST_CPU, enabled=False),
        AUTO,
        "refuse",
        policy.NO_CPU_WORKER,
        False,
    ),
    (
        "not enough RAM",
        NOTHING_SENT,
        replace(FAST_CPU, ram_ok=False),
        AUTO,
        "refuse",
        policy.CPU_RAM_INSUFFICIENT,
        False,
    ),
    (
        "too slow for the deadline: approval",
        replace(NOTHING_SENT, time_left=1.0),
        FAST_CPU,
        AUTO,
        "approval",
        policy.CPU_TOO_SLOW,
        False,
    ),
    (
        "too slow while streaming after content: refuse",
        replace(NOTHING_SENT, time_left=1.0, streaming=True, content_delivered=True),
        FAST_CPU,
        AUTO,
        "refuse",
        policy.CPU_TOO_SLOW,
        True,
    ),
    (
        "unknown CPU speed counts as too slow",
        NOTHING_SENT,
        replace(FAST_CPU, tokens_per_second=0.0),
        AUTO,
        "approval",
        policy.CPU_TOO_SLOW,
        False,
    ),
    (
        "too slow but under the auto-approve limit",
        replace(NOTHING_SENT, time_left=1.0),
        FAST_CPU,
        replace(AUTO, auto_approve_seconds=10.0),
        "cpu",
        "",
        False,
    ),
    (
        "approval policy asks even when fast",
        NOTHING_SENT,
        FAST_CPU,
        replace(AUTO, fallback="approval"),
        "approval",
        "approval_required",
        False,
    ),
    (
        "approval policy, auto-approve covers it",
        NOTHING_SENT,
        FAST_CPU,
        replace(AUTO, fallback="approval", auto_approve_seconds=30.0),
        "cpu",
        "",
        False,
    ),
    (
        "never: refuse",
        NOTHING_SENT,
        FAST_CPU,
        replace(AUTO, fallback="never"),
        "refuse",
        policy.FALLBACK_DISABLED,
        False,
    ),
    (
        "the job does not fit the CPU context",
        replace(NOTHING_SENT, prompt_tokens=4000, remaining_tokens=200),
        FAST_CPU,
        AUTO,
        "refuse",
        policy.CONTEXT_EXCEEDED,
        False,
    ),
]


@pytest.mark.parametrize(
    ("failure", "cpu", "settings", "action", "reason", "resume"),
    [case[1:] for case in REPLAY_CASES],
    ids=[case[0] for case in REPLAY_CASES],
)
def test_replay_decision(
    failure: FailureContext, cpu: CpuState, settings: Settings, action: str, reason: str, resume: bool
) -> None:
    decision = policy.decide_replay(failure, cpu, settings)
    assert (decision.action, decision.reason) == (action, reason)
    if action == "cpu":
        assert decision.resume is resume


def test_estimate_counts_prompt_and_generation() -> None:
    # 100 tokens to generate at 50/s = 2 s, plus 80 prompt tokens processed 8x faster = 0.2 s.
    assert policy.estimate_cpu_seconds(80, 100, 50.0) == pytest.approx(2.2)
    assert policy.estimate_cpu_seconds(80, 100, 0.0) == float("inf")


def test_refusal_carries_the_estimate_when_too_slow() -> None:
    decision = policy.decide_replay(replace(NOTHING_SENT, time_left=1.0), FAST_CPU, AUTO)
    assert decision.estimated_seconds == pytest.approx(2.2)
    assert "1.0s left" in decision.detail


SMALL = RouteRequest(
    prompt_tokens=50, max_tokens=50, gpu_n_ctx_per_seq=1024, gpu_available=True, time_left=60.0
)
BIG = replace(SMALL, prompt_tokens=1500, max_tokens=100)

ROUTE_CASES = [
    ("fits the GPU", SMALL, FAST_CPU, AUTO, Decision("gpu", "")),
    ("too big for the GPU, auto: CPU", BIG, FAST_CPU, AUTO, Decision("cpu", "exceeds_gpu_profile")),
    (
        "too big, approval policy",
        BIG,
        FAST_CPU,
        replace(AUTO, fallback="approval"),
        Decision("approval", "approval_required"),
    ),
    (
        "too big, never: context error",
        BIG,
        FAST_CPU,
        replace(AUTO, fallback="never"),
        Decision("refuse", policy.CONTEXT_EXCEEDED),
    ),
    (
        "too big for both",
        replace(BIG, prompt_tokens=5000),
        FAST_CPU,
        AUTO,
        Decision("refuse", policy.CONTEXT_EXCEEDED),
    ),
    (
        "GPU down: CPU",
        replace(SMALL, gpu_available=False),
        FAST_CPU,
        AUTO,
        Decision("cpu", "gpu_unavailable"),
    ),
    (
        "GPU down, no CPU",
        replace(SMALL, gpu_available=False),
        replace(FAST_CPU, ready=False),
        AUTO,
        Decision("refuse", policy.NO_CPU_WORKER),
    ),
    (
        "too big for the GPU, CPU not ready: says what would fit",
        BIG,
        replace(FAST_CPU, ready=False),
        AUTO,
        Decision("refuse", policy.CONTEXT_EXCEEDED),
    ),
]


@pytest.mark.parametrize(
    ("request_", "cpu", "settings", "expected"),
    [case[1:] for case in ROUTE_CASES],
    ids=[c[0] for c in ROUTE_CASES],
)
def test_route_decision(
    request_: RouteRequest, cpu: CpuState, settings: Settings, expected: Decision
) -> None:
    decision = policy.decide_route(request_, cpu, settings)
    assert (decision.action, decision.reason) == (expected.action, expected.reason)


def test_context_refusal_names_the_limit() -> None:
    decision = policy.decide_route(replace(BIG, prompt_tokens=5000), FAST_CPU, AUTO)
    assert "5100 tokens" in decision.detail and "1024" in decision.detail


def test_a_request_that_fits_the_gpu_is_routed_there_without_asking_about_the_cpu() -> None:
    fits = RouteRequest(100, 100, 2048, True, 60.0)
    assert policy.route_on_gpu(fits) == Decision("gpu", "")
    assert policy.route_on_gpu(replace(fits, max_tokens=4000)) is None  # too big: the CPU is considered
    assert policy.route_on_gpu(replace(fits, gpu_available=False)) is None


@pytest.mark.parametrize(
    ("kind", "delivered", "action", "expected"),
    [
        ("unavailable", False, "refuse", True),  # the GPU was restarting: wait for it, try it again
        ("queue_timeout", False, "approval", True),
        ("unavailable", True, "refuse", False),  # part of the answer is out: no second GPU run
        ("crash_abort", False, "refuse", False),  # a real fault: the GPU is not retried here
        ("unavailable", False, "cpu", False),  # the CPU takes it
    ],
)
def test_the_gpu_is_tried_again_only_after_a_failure_that_was_not_its_fault(
    kind: str, delivered: bool, action: str, expected: bool
) -> None:
    decision = Decision(action, "x")  # type: ignore[arg-type]
    assert policy.try_gpu_again(kind, delivered, decision) is expected
