"""Scenarios m and n without a service: the pair's two configs, what m and n expect of a job's attempts, how
the report names a peer that answered, the skip against a service the drill did not start, and that the drill
starts the pair only when m or n is asked for."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from tray_app.config import from_dict
from tray_app.contract.status import ServiceStatus
from tray_app.drill import command, peers
from tray_app.drill.client import EventLog, ServiceClient
from tray_app.drill.context import DrillContext
from tray_app.drill.expected import EXPECTED, TITLES
from tray_app.drill.launcher import drill_config
from tray_app.drill.peer_pair import PEER_NAME, PeerSide, peer_config, with_peer
from tray_app.drill.records import JobTrace, ScenarioRecord, answerer, explain
from tray_app.drill.registry import PEER_SCENARIOS, SCENARIOS
from tray_app.drill.report import DrillReport
from tray_app.host.launch import free_port

PEER_ROLE = f"peer:{PEER_NAME}"


def settings(model_path: Path) -> dict[str, Any]:
    return drill_config(from_dict({"model": {"path": str(model_path)}}, source="test"), "4GiB")


def test_the_peer_has_a_key_and_no_peers_and_this_service_names_it(model_path: Path) -> None:
    drill = settings(model_path)
    peer = peer_config(drill, "box-b-key")
    service = with_peer(drill, "http://127.0.0.1:9", "box-b-key")
    assert (peer["server"]["api_key"], peer["peers"]) == ("box-b-key", [])
    assert service["server"]["api_key"] == ""
    assert service["peers"] == [{"name": PEER_NAME, "url": "http://127.0.0.1:9", "api_key": "box-b-key"}]
    assert "peers" not in drill or drill["peers"] == []  # the drill's own config is left as it was
    (configured,) = from_dict(service, source="test").peers
    assert (configured.name, configured.url, configured.api_key) == (
        PEER_NAME,
        "http://127.0.0.1:9",
        "box-b-key",
    )


def job(*attempts: tuple[str, str]) -> JobTrace:
    log = [{"worker": worker, "outcome": outcome} for worker, outcome in attempts]
    return JobTrace({"id": "job-1", "state": "completed", "attempt_log": log}, ())


def test_m_expects_one_attempt_on_the_peer_and_n_the_peer_then_this_cpu() -> None:
    m, n = EXPECTED["m"], EXPECTED["n"]
    assert m.met_by("peer", "gpu_unavailable", "completed") and not m.met_by(
        "cpu", "gpu_unavailable", "completed"
    )
    assert m.attempts_problem(job((PEER_ROLE, "completed"))) == ""
    assert m.attempts_problem(job(("cpu", "completed"))) == (
        f"attempts: cpu completed, expected {PEER_ROLE} completed"
    )
    assert n.met_by("cpu", "exited", "completed")
    assert n.attempts_problem(job((PEER_ROLE, "failed"), ("cpu", "completed"))) == ""
    # A second run of the answer (the peer's again, or the CPU's twice) is not what n expects.
    twice = job((PEER_ROLE, "failed"), ("cpu", "failed"), ("cpu", "completed"))
    assert n.attempts_problem(twice).startswith("attempts: ")


def test_the_report_names_the_peer_that_answered() -> None:
    on_peer = {"worker": PEER_ROLE, "route": "peer", "peer": PEER_NAME, "model": "main", "device": None}
    assert answerer(on_peer) == f"main on peer {PEER_NAME}"
    why = explain("peer", "gpu_unavailable", streamed=False, resumed=False, detail="", caps={})
    assert "gpu_unavailable" in why and "peer" in why


def test_every_peer_scenario_is_registered_with_a_title() -> None:
    assert all(key in SCENARIOS and key in TITLES and key in EXPECTED for key in PEER_SCENARIOS)
    assert PEER_SCENARIOS == ("m", "n")


@pytest.mark.parametrize("key", ["m", "n"])
def test_without_a_pair_the_peer_scenarios_are_skipped_saying_why(key: str) -> None:
    status = cast(ServiceStatus, {"policy": {"stream_after_content": "resume"}, "caps": {}})

    async def play() -> ScenarioRecord:
        client = ServiceClient(f"http://127.0.0.1:{free_port()}")  # nothing listens: nothing is asked
        try:
            return await SCENARIOS[key](DrillContext(client, EventLog(client), status))
        finally:
            await client.aclose()

    record = asyncio.run(play())
    assert record.key == key and record.skipped == peers.NO_PAIR


def record_for(key: str) -> ScenarioRecord:
    return ScenarioRecord(key, TITLES[key], False)


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str], PeerSide | None]]:
    """What `_run_drill` starts and plays, with no process started: (what, keys, peer) per service."""
    played: list[tuple[str, list[str], PeerSide | None]] = []
    side = PeerSide(PEER_NAME, "http://127.0.0.1:9", 1, "key", "admin")

    @contextlib.contextmanager
    def service(settings: dict[str, Any]) -> Iterator[str]:
        yield "service"

    @contextlib.contextmanager
    def pair(settings: dict[str, Any]) -> Iterator[tuple[str, PeerSide]]:
        yield "pair", side

    def drill_on(
        started: str,
        settings: dict[str, Any],
        keys: list[str],
        pressure: int | None,
        progress: Any,
        peer: PeerSide | None = None,
    ) -> DrillReport:
        played.append((started, keys, peer))
        report = DrillReport(1_800_000_000.0, {"url": started, "launched": True})
        report.scenarios = [record_for(key) for key in keys]
        return report

    monkeypatch.setattr(command, "load_config", lambda args: None)
    monkeypatch.setattr(command, "drill_config", lambda cfg, vram: {"library": {}})
    monkeypatch.setattr(command, "long_slot_config", lambda settings: settings)
    monkeypatch.setattr(command, "launched_service", service)
    monkeypatch.setattr(command, "launched_pair", pair)
    monkeypatch.setattr(command, "_drill_on", drill_on)
    return played


def run_drill(keys: list[str]) -> DrillReport:
    args = argparse.Namespace(url=None, simulate_vram="4GiB")
    return command._run_drill(args, keys, None, lambda message: None)


def test_the_pair_is_started_only_when_m_or_n_is_asked_for(
    launches: list[tuple[str, list[str], PeerSide | None]],
) -> None:
    report = run_drill(["a", "m", "n"])
    assert [(started, keys) for started, keys, _ in launches] == [("service", ["a"]), ("pair", ["m", "n"])]
    assert launches[0][2] is None and launches[1][2] is not None and launches[1][2].name == PEER_NAME
    assert [record.key for record in report.scenarios] == ["a", "m", "n"]
    launches.clear()
    run_drill(["a", "l"])
    assert [started for started, _, _ in launches] == ["service", "service"]  # no pair
    launches.clear()
    run_drill(["n"])
    assert [(started, keys) for started, keys, _ in launches] == [("pair", ["n"])]  # nothing else started
