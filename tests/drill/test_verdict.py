"""The drill's pure parts: the verdict on a record, the accounting of one request, expectations, scenario
selection, the report files, and the command's exit status when a scenario fails."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tray_app import cli
from tray_app.bench.measure import accuracy, reported_weights
from tray_app.drill import command
from tray_app.drill.client import Answer, Event, ServiceClient
from tray_app.drill.pressure import TORCH_HINT, real_gpu_pressure, summarize_change
from tray_app.drill.records import Expectation, JobTrace, ScenarioRecord, account, verdict
from tray_app.drill.report import DrillReport, markdown, text, write
from tray_app.host.launch import free_port


def passing_record(key: str = "f") -> ScenarioRecord:
    record = ScenarioRecord(key, "GPU worker crash mid-generation (abort)", False)
    record.expected = "cpu (crash_abort|exited|killed) -> completed"
    record.actual = "cpu (exited) -> completed"
    record.decision_ok = True
    record.set_output("The sea is a vast expanse.")
    return record


def trace(
    state: str = "completed",
    outcomes: tuple[tuple[str, str], ...] = (("gpu", "failed"), ("cpu", "completed")),
) -> JobTrace:
    attempts = [
        {
            "number": n,
            "worker": worker,
            "started_at": 100.0 + n,
            "ended_at": 100.5 + n,
            "outcome": outcome,
            "error": "oom_decode: llama_decode returned -2" if outcome == "failed" else None,
        }
        for n, (worker, outcome) in enumerate(outcomes, start=1)
    ]
    events = (
        Event("route_decided", {"job_id": "job-1", "route": "gpu", "reason": "", "at": 100.0}),
        Event("route_decided", {"job_id": "job-1", "route": "cpu", "reason": "oom_decode", "at": 101.6}),
    )
    return JobTrace({"id": "job-1", "state": state, "attempt_log": attempts}, events)


def answered(streamed: bool = False) -> Answer:
    return Answer(
        job_id="job-1",
        status=200,
        streamed=streamed,
        text="hi",
        failsoft={"worker": "cpu"},
        connection_ok=True,
        done_markers=1 if streamed else 0,
        failsoft_chunks=1 if streamed else 0,
    )


def test_a_clean_record_passes() -> None:
    assert verdict(passing_record()) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"lost": 1}, "lost 1 job(s)"),
        ({"doubled": 1}, "answered 1 job(s) twice"),
        (
            {"tool_calls_intended": 1, "tool_executions": 2},
            "repeated a tool: 2 executions for 1 intended call(s)",
        ),
        (
            {"decision_ok": False},
            "unexpected decision: expected cpu (crash_abort|exited|killed) -> completed",
        ),
    ],
)
def test_each_broken_invariant_is_named(change: dict[str, Any], expected: str) -> None:
    record = passing_record()
    for name, value in change.items():
        setattr(record, name, value)
    problems = verdict(record)
    assert len(problems) == 1 and problems[0].startswith(expected)


def test_a_skipped_scenario_has_no_verdict() -> None:
    record = ScenarioRecord("a", "capacity", False, skipped="the CPU profile is not larger")
    assert verdict(record) == []


def test_one_tool_execution_per_intended_call_passes() -> None:
    record = passing_record("e")
    record.tool_calls_intended = record.tool_executions = 1
    assert verdict(record) == []


def test_account_of_a_replayed_answer() -> None:
    assert account(answered(), trace()) == (0, 0, "")


def test_a_job_that_never_ended_is_lost() -> None:
    lost, doubled, note = account(answered(), trace(state="running"))
    assert (lost, doubled) == (1, 0) and "still running" in note


def test_a_completed_job_whose_client_got_nothing_is_lost() -> None:
    nothing = Answer(job_id="job-1", status=200, streamed=True, transport_error="RemoteProtocolError()")
    lost, _, note = account(nothing, trace())
    assert lost == 1 and "no answer" in note


def test_two_completions_or_two_answers_on_the_wire_are_doubled() -> None:
    assert account(answered(), trace(outcomes=(("gpu", "completed"), ("cpu", "completed"))))[1] == 1
    twice = answered(streamed=True)
    twice.failsoft_chunks = 2
    assert account(twice, trace())[1] == 1


def test_a_client_that_closed_on_purpose_lost_nothing() -> None:
    closed = Answer(job_id="job-1", status=200, streamed=True, text="Once", connection_ok=True)
    cancelled = trace(state="cancelled", outcomes=(("gpu", "failed"), ("cpu", "cancelled")))
    assert account(closed, cancelled, client_closed=True) == (0, 0, "")


def test_a_refusal_before_any_job_is_a_controlled_error_not_a_loss() -> None:
    refused = Answer(status=400, error={"code": "context_length_exceeded", "message": "too long"})
    assert account(refused, None)[0] == 0
    assert account(Answer(transport_error="ConnectError()"), None)[0] == 1


def test_trace_reads_first_error_cpu_start_and_decision() -> None:
    job = trace()
    assert job.first_error() == (101.5, "oom_decode", "llama_decode returned -2")
    assert job.cpu_started() == 102.0
    assert job.decision() == ("cpu", "oom_decode")


def test_expectations() -> None:
    replay = Expectation("cpu", ("crash_abort", "exited"))
    assert replay.met_by("cpu", "exited", "completed")
    assert not replay.met_by("cpu", "exited", "failed")
    assert not replay.met_by("refused", "cpu_too_slow", "failed")
    assert Expectation("cpu").met_by("cpu", "anything", "completed")


def test_the_expected_attempts_are_checked_in_order() -> None:
    replayed = Expectation("cpu", ("oom_decode",), "completed", ("gpu failed", "cpu completed"))
    assert replayed.attempts_problem(trace()) == ""
    assert Expectation("cpu").attempts_problem(trace(outcomes=(("cpu", "completed"),))) == ""
    twice = trace(outcomes=(("gpu", "failed"), ("cpu", "failed"), ("cpu", "completed")))
    assert replayed.attempts_problem(twice) == (
        "attempts: gpu failed, cpu failed, cpu completed, expected gpu failed, cpu completed"
    )


def test_scenario_selection() -> None:
    assert command.selected_scenarios(None, pressure=False) == list("abcdefghijklmno")
    assert command.selected_scenarios(None, pressure=True) == []
    assert command.selected_scenarios(["g", "c,A"], pressure=False) == ["a", "c", "g"]
    with pytest.raises(ValueError, match="unknown scenario z"):
        command.selected_scenarios(["z"], pressure=False)


def failing_report() -> DrillReport:
    bad = passing_record("d")
    bad.doubled = 1
    report = DrillReport(1_800_000_000.0, {"url": "http://127.0.0.1:1", "launched": True, "caps": {}})
    report.scenarios = [passing_record("f"), bad]
    report.judge()
    return report


def test_report_files_parse_and_say_which_scenario_failed(tmp_path: Path) -> None:
    report = failing_report()
    json_path, md_path = write(report, tmp_path / "reports")
    data = json.loads(json_path.read_text())
    assert data["passed"] is False
    assert data["failures"] == {"d": ["answered 1 job(s) twice"]}
    assert [s["key"] for s in data["scenarios"]] == ["f", "d"]
    written = md_path.read_text()
    assert written == markdown(report)
    assert "| # | scenario | result |" in written and "**FAILED: d: answered 1 job(s) twice**" in written
    assert "PROBLEM: answered 1 job(s) twice" in text(report)


def test_the_command_exits_non_zero_and_names_the_failed_scenario(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(command, "_run_drill", lambda *args: failing_report())
    args = cli.build_parser().parse_args(["drill", "--scenario", "d,f"])
    assert command.run(args) == 1
    assert "scenario d FAILED: answered 1 job(s) twice" in capsys.readouterr().err


def test_bad_arguments_and_a_missing_service_are_clear_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["drill", "--scenario", "z"]) == 2
    assert "unknown scenario z" in capsys.readouterr().err
    assert cli.main(["drill", "--pressure", "lots"]) == 2
    url = f"http://127.0.0.1:{free_port()}"
    assert cli.main(["drill", "--url", url]) == 2
    assert f"no failsoft service answers at {url}" in capsys.readouterr().err


def test_pressure_summary_names_the_new_plan_and_the_probe() -> None:
    before = {
        "verdict": "gpu",
        "n_gpu_layers": 31,
        "n_layers": 31,
        "n_ctx": 512,
        "device_free_bytes": 4 << 30,
        "caps": {"n_ctx_per_seq": 512},
        "gpu_worker_pid": 10,
    }
    during = {
        **before,
        "verdict": "split",
        "n_gpu_layers": 1,
        "device_free_bytes": 512 << 20,
        "caps": {"n_ctx_per_seq": 256},
    }
    lines = summarize_change(before, during, {"worker": "cpu", "fallback_reason": "exceeds_gpu_profile"})
    assert "device free: 4.00 GiB -> 512.00 MiB while the pressure was held" in lines
    assert "plan: gpu -> split; GPU layers 31/31 -> 1/31; n_ctx 512 -> 512" in lines
    assert any("admission cap: 512 -> 256" in line for line in lines)
    assert lines[-1] == "probe request served by the cpu worker, fallback reason exceeds_gpu_profile"


def test_real_gpu_pressure_without_torch_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError

    async def attempt() -> dict[str, Any]:
        client = ServiceClient(f"http://127.0.0.1:{free_port()}")
        try:
            return await real_gpu_pressure(client, 1 << 30)
        finally:
            await client.aclose()

    result = asyncio.run(attempt())
    assert result["mode"] == "nvidia" and TORCH_HINT in result["error"]


def test_planner_accuracy_compares_device_buffers() -> None:
    plan = {"weights_bytes": 100, "kv_bytes": 50, "compute_bytes": 30}
    cuda = {
        "model_bytes": 130,
        "model_buffers": {"CUDA0": 100, "CPU_Mapped": 30},
        "kv_bytes": 50,
        "compute_bytes": 40,
    }
    assert reported_weights(cuda) == 100
    assert reported_weights({"model_bytes": 96, "model_buffers": {"CPU_Mapped": 96}}) == 96
    rows = accuracy(plan, cuda)
    assert rows["weights"]["ratio"] == 1.0 and rows["kv"]["ratio"] == 1.0 and rows["compute"]["ratio"] == 0.75
    assert accuracy(plan, {})["kv"] == {"estimated_bytes": 50, "reported_bytes": None, "ratio": None}


def test_parser_keeps_the_drill_and_bench_options() -> None:
    args = cli.build_parser().parse_args(["bench", "--rounds", "3", "--json"])
    assert isinstance(args, argparse.Namespace) and args.rounds == 3 and args.json
