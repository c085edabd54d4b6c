"""`failsoft drill --soak MINUTES` without a service: the option, the mix's plan, the invariant checker on
scripted clients and service states, the memory figures and the per-round summary."""

from __future__ import annotations

import argparse
import json
from collections import Counter

import pytest

from tray_app.cli import build_parser
from tray_app.drill.chaos import KINDS, MixPlan, check_loopback, planned_kinds
from tray_app.drill.chaos_records import Sent, error_of, read_anthropic, read_ollama, read_openai
from tray_app.drill.chaos_summary import Figures
from tray_app.drill.invariants import Observed, check
from tray_app.drill.soak import RoundRecord, SoakResult, soak_minutes
from tray_app.drill.soak_memory import growth_per_hour


def drill_args(*extra: str) -> argparse.Namespace:
    return build_parser().parse_args(["drill", *extra])


def test_the_soak_option_takes_minutes() -> None:
    assert soak_minutes(drill_args("--soak", "30")) == 30.0
    assert soak_minutes(drill_args("--soak", "0.5", "--url", "http://127.0.0.1:8750")) == 0.5
    assert soak_minutes(drill_args()) is None


@pytest.mark.parametrize(
    "extra",
    [
        ["--soak", "0"],
        ["--soak", "-5"],
        ["--soak", "30", "--scenario", "a"],
        ["--soak", "3", "--pressure", "1GiB"],
    ],
)
def test_bad_soak_options_are_refused(extra: list[str]) -> None:
    with pytest.raises(ValueError):
        soak_minutes(drill_args(*extra))


def test_not_a_number_of_minutes_is_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        drill_args("--soak", "half an hour")


def test_the_plan_has_every_kind_and_is_the_same_for_the_same_seed() -> None:
    plan = MixPlan(requests=40, seed=3)
    kinds = planned_kinds(plan)
    assert len(kinds) == 40 and set(kinds) == set(KINDS)
    assert planned_kinds(plan) == kinds and planned_kinds(MixPlan(requests=40, seed=4)) != kinds
    assert len(planned_kinds(MixPlan(requests=3))) == 3
    with pytest.raises(ValueError):
        planned_kinds(MixPlan(weights={"telnet": 1}))


def test_the_mix_runs_against_this_machine_only() -> None:
    check_loopback("http://127.0.0.1:8750")
    with pytest.raises(ValueError):
        check_loopback("http://192.168.1.20:8750")


# ----------------------------------------------------------------------------------------------- streams
def test_each_dialects_stream_is_read_to_its_end() -> None:
    openai = Sent("openai_stream")
    head = {"index": 0, "id": "c", "function": {"name": "add"}}
    rest = {"index": 0, "function": {"arguments": "{}"}}
    for line in [
        'data: {"choices": [{"delta": {"content": "The"}}]}',
        *("data: " + json.dumps({"choices": [{"delta": {"tool_calls": [call]}}]}) for call in (head, rest)),
        "data: [DONE]",
    ]:
        read_openai(openai, line)
    openai.ended_stream()
    assert (openai.outcome, openai.ends, dict(openai.tool_heads)) == ("completed", 1, {0: 1})

    anthropic = Sent("anthropic_stream")
    for line in [
        "event: message_start",
        'data: {"type": "content_block_delta"}',
        'data: {"type": "message_stop"}',
    ]:
        read_anthropic(anthropic, line)
    anthropic.ended_stream()
    assert anthropic.outcome == "completed"

    ollama = Sent("ollama_stream")
    read_ollama(ollama, '{"message": {"content": "Waves"}, "done": false}')
    ollama.ended_stream()  # cut off before `done: true`
    assert ollama.outcome == "incomplete"

    failed = Sent("openai_stream")
    read_openai(failed, 'data: {"error": {"message": "the GPU failed", "code": "effects_delivered"}}')
    assert (failed.outcome, failed.code) == ("error", "effects_delivered")


def test_an_error_without_a_reason_is_lost() -> None:
    sent = Sent("openai_tool")
    error_of(sent, 500, b"Internal Server Error")
    assert sent.outcome == "lost"
    error_of(sent, 503, b'{"error": {"message": "busy", "code": "queue_full"}}')
    assert (sent.outcome, sent.code) == ("error", "queue_full")


# ----------------------------------------------------------------------------------------------- invariants
def completed(kind: str, job_id: str, **fields: object) -> Sent:
    sent = Sent(kind, outcome="completed", job_id=job_id, ends=1, content=True)
    for name, value in fields.items():
        setattr(sent, name, value)
    return sent


def record(state: str, created_at: float = 1.0, attempts: list[float] | None = None) -> dict[str, object]:
    log = [{"number": n + 1, "started_at": at} for n, at in enumerate(attempts or [created_at])]
    return {"state": state, "created_at": created_at, "attempts": len(log), "attempt_log": log}


def good_round() -> tuple[list[Sent], Observed]:
    tool = completed("openai_tool_stream", "job-t", key="k-t", tool_at=5.0, tool_heads=Counter({0: 1}))
    job = completed("job", "job-j", key="k-j")
    replay = completed("job_retry", "job-j", key="k-j", replay=True, ends=0)
    sents = [
        completed("openai_stream", "job-a"),
        tool,
        job,
        replay,
        Sent("engine_field", outcome="refused", code="unsupported_field"),
        Sent("slow_reader", outcome="dropped", job_id="job-s"),
        Sent("openai_leaver", outcome="left", job_id="job-l"),
        Sent("openai_stream", outcome="error", code="effects_delivered", job_id="job-e"),
    ]
    jobs = {
        "job-a": record("completed"),
        "job-t": record("completed", attempts=[1.0, 2.0]),  # a failover before the tool call: fine
        "job-j": record("completed"),
        "job-s": record("cancelled"),
        "job-l": record("cancelled"),
        "job-e": record("failed"),
    }
    return sents, Observed(jobs=jobs)


def broken(sents: list[Sent], observed: Observed) -> dict[str, str]:
    return {item.name: item.detail for item in check(sents, observed).broken}


def test_a_clean_round_holds_every_invariant() -> None:
    report = check(*good_round())
    assert report.held, report.lines()
    assert len(report.checks) == 10 and all(line.startswith("ok") for line in report.lines())


def test_what_the_service_left_breaks_its_invariants() -> None:
    sents, observed = good_round()
    observed.unfinished = {"running": ["job-x"], "queued": ["job-y"]}
    observed.busy = {"gpu": 1, "cpu": 1}
    observed.mirror_reading = 1  # a background read still holding its slot is a leak all the same
    observed.queue_depth = 2
    observed.not_ready = {"gpu": "restarting: killed: next start in 0.4 s"}
    found = broken(sents, observed)
    assert set(found) == {
        "no job left running or queued",
        "every worker's router slots free",
        "queue empty",
        "every worker ready again",
    }
    assert found["every worker ready again"] == "1: gpu restarting: killed: next start in 0.4 s"
    assert "job-x running" in found["no job left running or queued"]
    slots = found["every worker's router slots free"]
    assert slots == "2: cpu holds 1; gpu holds 1 (the CPU mirror's reads among them: 1)"


def test_a_cut_answer_a_lost_request_and_an_accepted_engine_field_are_found() -> None:
    sents, observed = good_round()
    sents += [
        Sent("ollama_stream", outcome="incomplete", job_id="job-c", detail="no end event"),
        Sent("job", outcome="lost", detail="HTTP 500 without a reason"),
        Sent("engine_field", outcome="accepted", detail="/v1/chat/completions with 'id_slot' answered 200"),
    ]
    assert set(broken(sents, observed)) == {
        "every completed answer whole",
        "every request ended with an answer or a reason",
        "engine fields refused with 400",
    }


def test_answered_twice_is_found_in_a_stream_and_across_requests() -> None:
    sents, observed = good_round()
    assert "0 answered twice" in broken([*sents, completed("anthropic_stream", "job-2", ends=2)], observed)
    assert "0 answered twice" in broken([*sents, completed("openai_stream", "job-a")], observed)


def test_one_job_per_idempotency_key() -> None:
    sents, observed = good_round()
    sents.append(completed("job_retry", "job-j2", key="k-j", replay=True))
    observed.jobs["job-j2"] = record("completed", created_at=2.0)
    assert "2 jobs completed" in broken(sents, observed)["one job per Idempotency-Key"]
    # A job that failed may be tried again under its key: the second one is a new job, rightly.
    sents, observed = good_round()
    observed.jobs["job-j"] = record("failed")
    sents.append(completed("job", "job-j2", key="k-j"))
    observed.jobs["job-j2"] = record("completed", created_at=2.0)
    assert "one job per Idempotency-Key" not in broken(sents, observed)


def test_a_tool_call_delivered_again_is_found_three_ways() -> None:
    sents, observed = good_round()
    twice = completed("openai_tool_stream", "job-2", tool_at=1.0, tool_heads=Counter({0: 2}))
    assert "1 again" in broken([*sents, twice], observed)["0 repeated tool calls"]
    # An attempt that started after the client had the call: a failover ran the turn again.
    observed.jobs["job-t"] = record("completed", attempts=[1.0, 6.0])
    assert "after its tool call" in broken(sents, observed)["0 repeated tool calls"]
    # A retry under the key got a new job, which delivered the call again.
    sents, observed = good_round()
    retry = completed("openai_tool_retry", "job-t2", key="k-t", tool_at=9.0, tool_heads=Counter({0: 1}))
    assert "tool calls from 2 jobs" in broken([*sents, retry], observed)["0 repeated tool calls"]


# ----------------------------------------------------------------------------------------------- summary
def test_memory_growth_is_the_least_squares_slope_per_hour() -> None:
    assert growth_per_hour([]) == 0.0 and growth_per_hour([(5.0, 100)]) == 0.0
    assert growth_per_hour([(0.0, 100), (1800.0, 150), (3600.0, 200)]) == pytest.approx(100.0)
    assert growth_per_hour([(0.0, 300), (60.0, 100), (120.0, 300)]) == pytest.approx(0.0)


def test_the_soak_holds_only_if_every_round_held() -> None:
    sents, observed = good_round()
    good = RoundRecord(1, 1.0, check(sents, observed), Figures(), None)
    result = SoakResult(1.0, rounds=[good])
    assert result.held and "soak PASSED: every invariant held" in result.lines()
    observed.queue_depth = 1
    result.rounds.append(RoundRecord(2, 2.0, check(sents, observed), Figures(), None))
    assert not result.held
    assert "FAIL queue empty: rounds 2: depth 1" in "\n".join(result.invariant_lines())
    assert result.to_dict()["passed"] is False
    assert not SoakResult(1.0).held  # no round finished: nothing was shown to hold
    ended = SoakResult(1.0, rounds=[good], error="before round 2: timed out waiting for both workers")
    assert (
        not ended.held and "ended early: before round 2: timed out waiting for both workers" in ended.lines()
    )
