"""Scenario o: the model across an RPC box, the box killed mid-stream.

For real (integration): `failsoft drill --scenario o` starts a `failsoft rpc serve` and a service on a 120 MiB
simulated GPU that spans it; after the first chunk of a 200-token stream the box is killed; the CPU finishes
the answer whole and once, the GPU worker starts again planned without the box and answers. Nothing the drill
started is left running, the killed box included.

Without a service: the service's config, what o reads from a status, the skip against a service the drill did
not start, a box that cannot start, and that the drill starts a box only when o is asked for."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from tests.drill.test_drill_run import drill_env, drill_json, processes_under
from tests.drill.test_peer_scenarios import run_drill
from tray_app import config
from tray_app.config import from_dict
from tray_app.contract.status import ServiceStatus
from tray_app.drill import command, rpc_box
from tray_app.drill.client import EventLog, ServiceClient
from tray_app.drill.context import DrillContext
from tray_app.drill.expected import EXPECTED, TITLES
from tray_app.drill.launcher import LaunchError, drill_config
from tray_app.drill.records import JobTrace, ScenarioRecord
from tray_app.drill.registry import RPC_SCENARIOS, SCENARIOS
from tray_app.drill.report import DrillReport
from tray_app.drill.rpc_launch import BOX_NAME, RpcBox, box_config, launched_box
from tray_app.host.launch import free_port

ENDPOINT = "127.0.0.1:50052"


def settings(model_path: Path) -> dict[str, Any]:
    return drill_config(from_dict({"model": {"path": str(model_path)}}, source="test"), "4GiB")


# ------------------------------------------------------------------------------------------ for real
@pytest.mark.integration
def test_the_box_killed_mid_stream_the_cpu_finishes_once_and_the_gpu_is_planned_without_it(
    tmp_path: Path,
) -> None:
    env, scratch = drill_env(tmp_path)
    report = drill_json(env, "o")
    (record,) = report["scenarios"]
    assert record["key"] == "o" and report["passed"] is True and not record["skipped"], record
    assert record["problems"] == [] and record["failed_checks"] == [], record
    assert (record["lost"], record["doubled"], record["final_states"]) == (0, 0, ["completed"]), record
    assert record["decision_ok"] and record["actual"] == "cpu (crash_abort) -> completed", record
    assert record["connection_survived"] is True and record["answered_by"].endswith(" on CPU"), record
    assert record["first_error_at"] <= record["cpu_started_at"] <= record["total_seconds"], record
    assert report["service"]["simulated"] and report["service"]["device"]["total_bytes"] == 120 * 2**20

    notes = record["notes"]
    (planned,) = [note for note in notes if note.startswith("the plan puts ")]
    layers = int(planned.split()[3])
    assert 0 < layers < 31 and f"on {BOX_NAME}'s device RPC0 at 127.0.0.1:" in planned, planned
    endpoint = planned.split(" at ")[1].split()[0]
    assert f"the GPU worker runs with --rpc {endpoint}" in notes
    assert any(
        note.startswith(f"llama.cpp's buffers on RPC0[{endpoint}], printed/planned: ") for note in notes
    )
    (killed,) = [note for note in notes if note.startswith(f"box {endpoint} (pid ")]
    assert killed.endswith(" characters"), killed
    assert any(note.startswith("the answer is whole: 200 tokens of 200, ") for note in notes), notes
    assert "answered once: one completed attempt, on the cpu, fallback_reason crash_abort" in notes
    assert "the answer names its route: cpu after crash_abort, 2 attempts" in notes
    assert any(note.startswith("the GPU worker ready again with no --rpc ") for note in notes), notes
    (box,) = [note for note in notes if note.startswith("rpc.remote is empty; the box: ")]
    assert endpoint in box and "does not answer" in box, box
    assert notes[-1] == "a new request answered on the gpu"
    assert processes_under(scratch) == [] and list(scratch.iterdir()) == []


# ------------------------------------------------------------------------------------------ fast
def test_the_service_spans_the_box_on_a_small_simulated_gpu(model_path: Path) -> None:
    drill = settings(model_path)
    service = box_config(drill, ENDPOINT)
    assert service["device"]["simulate_vram"] == "120MiB"
    assert (service["budget"]["reserve_min"], service["budget"]["reserve_percent"]) == ("16MiB", 0)
    assert service["cpu"]["threads"] == 1
    assert service["peers"] == [{"name": BOX_NAME, "rpc": ENDPOINT, "rpc_memory": "60MiB"}]
    assert drill["device"]["simulate_vram"] == "4GiB" and not drill.get("peers")  # the drill's own: as it was
    (configured,) = from_dict(service, source="test").peers
    assert (configured.name, configured.rpc, configured.rpc_memory, configured.url) == (
        BOX_NAME,
        ENDPOINT,
        "60MiB",
        "",
    )


MIB = 1024 * 1024
NAME = f"RPC0[{ENDPOINT}]"
SHARE = {
    "peer": BOX_NAME,
    "endpoint": ENDPOINT,
    "device": "RPC0",
    "buffer_name": NAME,
    "n_layers": 5,
    "weights_bytes": 38949120,
    "kv_bytes": 6 * MIB,
    "compute_bytes": 15 * MIB,
}
# As llama.cpp printed them for that share (two decimals of MiB); its compute buffer below the estimate.
PRINTED = {
    "model_buffers": {"CPU": 80 * MIB, NAME: round(37.14 * MIB)},
    "kv_buffers": {"CPU": 39 * MIB, NAME: 6 * MIB},
    "compute_buffers": {"CPU": 14 * MIB, NAME: round(11.76 * MIB)},
}


def status(
    remote: list[dict[str, Any]],
    problem: str = "",
    rpc: list[str] | None = None,
    printed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    boxes = [{"peer": BOX_NAME, "endpoint": ENDPOINT, "problem": problem}]
    gpu = {"state": "ready", "profile": {"rpc": rpc or []}, "health": {"buffers": printed or PRINTED}}
    return {"rpc": {"boxes": boxes, "remote": remote}, "workers": {"gpu": gpu}}


BOX = RpcBox(BOX_NAME, ENDPOINT, 1)


def spans(sample: dict[str, Any]) -> tuple[bool, ScenarioRecord]:
    record = ScenarioRecord("o", TITLES["o"], True)
    return rpc_box._spans_box(record, sample, BOX), record


def test_o_plays_only_when_the_plan_puts_layers_on_the_box_and_the_gpu_worker_carries_rpc() -> None:
    played, record = spans(status([SHARE], rpc=[ENDPOINT]))
    assert played and record.failed_checks == [] and not record.skipped
    assert record.notes == [
        f"the plan puts 5 layers on {BOX_NAME}'s device RPC0 at {ENDPOINT} (37.14 MiB of weights)",
        f"the GPU worker runs with --rpc {ENDPOINT}",
        f"llama.cpp's buffers on {NAME}, printed/planned: model 37.14/37.14 MiB, kv 6.00/6.00 MiB, "
        "compute 11.76/15.00 MiB",
    ]
    # A KV cache on the box other than the plan's is a failed check, not a note.
    other = {**PRINTED, "kv_buffers": {NAME: 8 * MIB}}
    played, record = spans(status([SHARE], rpc=[ENDPOINT], printed=other))
    assert record.failed_checks == [
        f"llama.cpp's buffers on {NAME} are not the plan's (printed/planned): model 37.14/37.14 MiB, "
        "kv 8.00/6.00 MiB, compute 11.76/15.00 MiB"
    ]
    played, record = spans(status([SHARE]))  # planned with the box, started without it
    assert not played and record.failed_checks == [f"the GPU worker's profile has rpc [], not [{ENDPOINT}]"]
    played, record = spans(status([], problem="the RPC server at x does not answer"))
    assert not played and record.failed_checks == [
        f"the plan has no share on the box {ENDPOINT}: the RPC server at x does not answer"
    ]
    # The box answers but the model's layers are too large for the sizes o plays with: not this service's
    # fault, so skipped saying why.
    played, record = spans(status([]))
    assert not played and record.failed_checks == [] and "sized for the bundled model" in record.skipped


def job(*attempts: tuple[str, str]) -> JobTrace:
    log = [{"worker": worker, "outcome": outcome} for worker, outcome in attempts]
    return JobTrace({"id": "job-1", "state": "completed", "attempt_log": log}, ())


def test_o_expects_the_gpu_attempt_aborted_and_the_cpu_finishing_once() -> None:
    expected = EXPECTED["o"]
    assert expected.met_by("cpu", "crash_abort", "completed")
    assert not expected.met_by("cpu", "exited", "completed") and not expected.met_by("gpu", "", "completed")
    assert expected.attempts_problem(job(("gpu", "failed"), ("cpu", "completed"))) == ""
    assert expected.attempts_problem(job(("gpu", "failed"), ("cpu", "failed"), ("cpu", "completed")))


def test_o_is_registered_with_a_title_and_played_on_a_box_of_its_own() -> None:
    assert RPC_SCENARIOS == ("o",) and list(SCENARIOS)[-1] == "o"
    assert all(key in TITLES and key in EXPECTED for key in RPC_SCENARIOS)


def test_without_a_box_o_is_skipped_saying_why() -> None:
    sample = cast(ServiceStatus, {"policy": {"stream_after_content": "resume"}, "caps": {}})

    async def play() -> ScenarioRecord:
        client = ServiceClient(f"http://127.0.0.1:{free_port()}")  # nothing listens: nothing is asked
        try:
            return await SCENARIOS["o"](DrillContext(client, EventLog(client), sample))
        finally:
            await client.aclose()

    record = asyncio.run(play())
    assert record.key == "o" and record.skipped == rpc_box.NO_BOX


def test_a_box_that_cannot_start_says_what_it_printed(model_path: Path, tmp_path: Path) -> None:
    drill = settings(model_path)
    drill["engine"]["llama_server"] = str(tmp_path / "no-llama-server")
    with pytest.raises(LaunchError) as raised, launched_box(drill):
        pytest.fail("a box without an engine listened")
    assert "failsoft rpc serve exited with 2" in str(raised.value) and "no such file" in str(raised.value)


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str], RpcBox | None]]:
    """What `_run_drill` starts and plays, with no process started: (what, keys, box) per service."""
    played: list[tuple[str, list[str], RpcBox | None]] = []

    @contextlib.contextmanager
    def service(settings: dict[str, Any]) -> Iterator[str]:
        yield "service with a box" if settings.get("peers") else "service"

    @contextlib.contextmanager
    def box(settings: dict[str, Any]) -> Iterator[RpcBox]:
        yield BOX

    def drill_on(
        started: str,
        settings: dict[str, Any],
        keys: list[str],
        pressure: int | None,
        progress: Any,
        peer: Any = None,
        box: RpcBox | None = None,
    ) -> DrillReport:
        played.append((started, keys, box))
        report = DrillReport(1_800_000_000.0, {"url": started, "launched": True})
        report.scenarios = [ScenarioRecord(key, TITLES[key], False) for key in keys]
        return report

    drill = {"library": {}, "device": {}, "budget": {}, "cpu": {}}
    monkeypatch.setattr(command, "load_config", lambda args: None)
    monkeypatch.setattr(command, "drill_config", lambda cfg, vram: drill)
    monkeypatch.setattr(command, "launched_service", service)
    monkeypatch.setattr(command, "launched_box", box)
    monkeypatch.setattr(command, "_drill_on", drill_on)
    monkeypatch.setattr(command, "rpc_server_missing", lambda cfg: None)
    return played


def test_the_box_is_started_only_when_o_is_asked_for(
    launches: list[tuple[str, list[str], RpcBox | None]],
) -> None:
    report = run_drill(["a", "o"])
    assert launches == [("service", ["a"], None), ("service with a box", ["o"], BOX)]
    assert [record.key for record in report.scenarios] == ["a", "o"]
    launches.clear()
    run_drill(["o"])
    assert launches == [("service with a box", ["o"], BOX)]  # nothing else started
    launches.clear()
    run_drill(["a"])
    assert launches == [("service", ["a"], None)]


def test_without_rpc_server_o_is_played_without_a_box_and_says_why(
    launches: list[tuple[str, list[str], RpcBox | None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(command, "rpc_server_missing", lambda cfg: "no ggml-rpc-server beside llama-server")
    run_drill(["a", "o"])
    assert launches == [("service", ["a", "o"], None)]  # no box: scenario o skips itself, naming why


def test_an_engine_of_ones_own_without_rpc_server_is_named(tmp_path: Path) -> None:
    llama_server = tmp_path / "llama-server"
    llama_server.write_text("#!/bin/sh\n")
    llama_server.chmod(0o755)
    cfg = config.from_dict({"engine": {"llama_server": str(llama_server)}})
    missing = command.rpc_server_missing(cfg)
    assert missing is not None and "ggml-rpc-server" in missing
