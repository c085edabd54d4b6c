"""The ladder's peer rung in the executor: a failed GPU attempt goes to a peer's GPU before the CPU (once,
the same job, the peer told the request's id and an Idempotency-Key), and a failed peer attempt goes on to
the CPU with the peer marked down; never a peer when a replay is not safe."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.jobs.test_executor_effects import (
    CPU_FAST,
    ScriptedRelay,
    StandInWorker,
    chat_chunk,
    new_job,
)
from tests.support.engine_parts import engine_context
from tests.support.prompts import ScriptedPrompts
from tray_app.contract.events import Event, EventBus, FallbackStarted
from tray_app.jobs import policy
from tray_app.jobs.admission import SlotPool
from tray_app.jobs.context import EngineHooks
from tray_app.jobs.engine import Executor
from tray_app.jobs.journal import Journal
from tray_app.jobs.outcomes import Ended, Finished, Outcome
from tray_app.jobs.registry import JobRegistry
from tray_app.jobs.relay import UpstreamError
from tray_app.jobs.worker_port import ExecutorSettings

PEER = "peer:box-b"
PEER_KEY = {"Authorization": "Bearer k"}


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    opened = Journal(tmp_path / "journal.sqlite3")
    yield opened
    opened.close()


def text_chunk(text: str, finish: str | None = None) -> dict[str, Any]:
    """A resumed attempt's chunk: the continuation is a completion of the text so far."""
    return {
        "id": "t1",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "text": text, "finish_reason": finish}],
    }


class HeaderRelay(ScriptedRelay):
    """A scripted relay that keeps each attempt's URL and headers."""

    def __init__(self, *scripts: list[Any]) -> None:
        super().__init__(*scripts)
        self.calls: list[tuple[str, dict[str, str]]] = []

    def stream(self, url: str, body: bytes, headers: dict[str, str], *rest: Any, **kw: Any) -> Any:
        self.calls.append((url, headers))
        return super().stream(url, body, headers, *rest, **kw)


def rig(
    journal: Journal, relay: HeaderRelay, *, peer_ready: bool = True
) -> tuple[Executor, JobRegistry, Any]:
    bus = EventBus()
    registry = JobRegistry(journal, bus)
    workers = {
        "gpu": StandInWorker("gpu", base_url="http://gpu"),
        "cpu": StandInWorker("cpu", base_url="http://cpu", pid=4343),
        PEER: StandInWorker(
            PEER, base_url="http://box-b", pid=None, request_headers={"Authorization": "Bearer k"}
        ),
    }

    async def cpu_state(time_left: float, role: str | None = "cpu") -> policy.CpuState:
        return CPU_FAST

    slots = SlotPool({"gpu": 2, "cpu": 2, PEER: 2}, queue_limit=8)
    context = replace(
        engine_context(registry, slots, relay, workers.get),
        peer_for=lambda model: PEER if peer_ready and workers[PEER].state == "ready" else None,
    )
    settings = ExecutorSettings(
        policy.Settings(), stall_seconds=5.0, queue_timeout=5.0, cpu_tokens_per_second=0.0
    )
    executor = Executor(context, settings, EngineHooks(cpu_state, lambda model: ScriptedPrompts()))
    return executor, registry, workers


async def outcomes(executor: Executor, job: Any) -> list[Outcome]:
    return [outcome async for outcome in executor.run(job, deliver=True)]


def fallbacks(registry: JobRegistry) -> list[FallbackStarted]:
    seen: list[Event] = []
    registry.bus.add_listener(seen.append)
    return seen  # type: ignore[return-value]


async def test_a_gpu_failure_before_any_token_goes_to_the_peer(journal: Journal) -> None:
    relay = HeaderRelay(
        [UpstreamError("exited", "connection dropped")],
        [chat_chunk("Hello"), chat_chunk(" there", finish="stop")],
    )
    executor, registry, workers = rig(journal, relay)
    events = fallbacks(registry)
    job = new_job(registry)
    out = await outcomes(executor, job)
    assert isinstance(out[-1], Finished)
    assert out[-1].result["choices"][0]["message"]["content"] == "Hello there"
    failsoft = out[-1].result["failsoft"]
    assert (failsoft["route"], failsoft["peer"], failsoft["device"]) == ("peer", "box-b", None)
    assert job.worker == PEER and job.attempts == 2
    (url, headers), (peer_url, peer_headers) = relay.calls
    assert url.startswith("http://gpu") and peer_url.startswith("http://box-b")
    assert peer_headers["Authorization"] == "Bearer k"  # its own key, nothing of this service's
    assert peer_headers["X-Request-Id"] == job.request_id
    assert peer_headers["Idempotency-Key"].startswith(job.id + "-")
    assert "Idempotency-Key" not in headers  # the local worker is not asked for it
    assert [e.to for e in events if isinstance(e, FallbackStarted)] == [PEER]
    assert workers["gpu"].unhealthy == ["exited"]


async def test_a_peer_that_fails_mid_stream_is_marked_down_and_the_cpu_continues(journal: Journal) -> None:
    relay = HeaderRelay(
        [UpstreamError("exited", "connection dropped")],
        [chat_chunk("Hello"), UpstreamError("exited", "the peer went away")],
        [text_chunk(" there", finish="stop")],
    )
    executor, registry, workers = rig(journal, relay)
    events = fallbacks(registry)
    job = new_job(registry)
    out = await outcomes(executor, job)
    assert isinstance(out[-1], Finished)
    assert out[-1].result["choices"][0]["message"]["content"] == "Hello there"  # whole, "Hello" once
    assert out[-1].result["failsoft"]["route"] == "cpu" and job.worker == "cpu"
    assert workers[PEER].unhealthy == ["exited"]
    assert workers["gpu"].unhealthy == ["exited"]  # only the GPU's own failure: the peer's is the peer's
    assert [e.to for e in events if isinstance(e, FallbackStarted)] == [PEER, "cpu"]
    assert [url.split("/v1/")[0] for url, _ in relay.calls] == ["http://gpu", "http://box-b", "http://cpu"]


async def test_what_a_peer_refuses_is_its_own_trouble_not_the_clients(journal: Journal) -> None:
    relay = HeaderRelay(
        [UpstreamError("exited", "connection dropped")],
        [UpstreamError("client_error", "Invalid API key", status=401)],
        [chat_chunk("Hi", finish="stop")],
    )
    executor, registry, workers = rig(journal, relay)
    job = new_job(registry)
    out = await outcomes(executor, job)
    assert isinstance(out[-1], Finished) and job.worker == "cpu"
    assert workers[PEER].unhealthy == ["peer_failed"]


async def test_no_peer_once_a_tool_call_reached_the_client(journal: Journal) -> None:
    relay = HeaderRelay([chat_chunk(tool=True), UpstreamError("exited", "connection dropped")])
    executor, registry, _ = rig(journal, relay)
    job = new_job(registry)
    out = await outcomes(executor, job)
    assert isinstance(out[-1], Ended) and out[-1].error.code == policy.EFFECTS_DELIVERED
    assert len(relay.calls) == 1  # neither the peer nor the CPU ran it again


async def test_without_a_ready_peer_the_cpu_takes_over_as_before(journal: Journal) -> None:
    relay = HeaderRelay([UpstreamError("exited", "connection dropped")], [chat_chunk("Hi", finish="stop")])
    executor, registry, _ = rig(journal, relay, peer_ready=False)
    job = new_job(registry)
    out = await outcomes(executor, job)
    assert isinstance(out[-1], Finished) and out[-1].result["failsoft"]["route"] == "cpu"
    assert "peer" not in out[-1].result["failsoft"]
