"""A job kept off the GPU while the GPU path is squeezed, yielded or lost says so in its route decision,
naming who holds the GPU (jobs.gpu_policy.why_not_gpu); on a normal path a down GPU worker adds nothing."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.jobs.test_resume import Models, RecordingExecutor
from tray_app import config
from tray_app.contract.events import Event, EventBus, RouteDecided
from tray_app.jobs.admission import SlotPool
from tray_app.jobs.context import HostHooks, JobsContext
from tray_app.jobs.gpu_policy import GpuPath
from tray_app.jobs.intake import Jobs
from tray_app.jobs.journal import Journal
from tray_app.jobs.registry import Job, JobRegistry
from tray_app.jobs.relay import Relay

YIELDED_TO = "comfyui (python3, pid 4242) holds 6.10 GiB"


def job() -> Job:
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 20}
    return Job(
        id="job-1",
        request_id="req-1",
        kind="chat",
        body=body,
        stream=False,
        background=False,
        body_hash="",
        idempotency_key=None,
        prompt_tokens=10,
        max_tokens=20,
        deadline=time.monotonic() + 60,
    )


async def decided(tmp_path: Path, path: GpuPath, why: str) -> RouteDecided:
    bus = EventBus()
    seen: list[Event] = []
    bus.add_listener(seen.append)
    journal = Journal(tmp_path / "journal.sqlite3")
    workers = {"gpu": SimpleNamespace(state="stopped"), "cpu": SimpleNamespace(state="ready")}
    slots = SlotPool({"gpu": 1, "cpu": 1}, 8)
    context = JobsContext(
        JobRegistry(journal, bus), journal, slots, Relay(), bus, workers.get, lambda: config.Config()
    )
    jobs = Jobs(
        context,
        Models(),  # type: ignore[arg-type]
        RecordingExecutor(),  # type: ignore[arg-type]
        HostHooks(gpu_path=lambda: (path, why)),
    )
    decision = await jobs.route(job(), time.monotonic() + 60)
    journal.close()
    assert decision.action == "cpu"
    (event,) = [e for e in seen if isinstance(e, RouteDecided)]
    return event


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("yielded", "the GPU is yielded to another program"),
        ("squeezed", "the GPU is squeezed by another program"),
        ("lost", "the GPU is lost"),
    ],
)
async def test_a_job_off_the_gpu_names_the_path_and_who(tmp_path: Path, path: GpuPath, words: str) -> None:
    event = await decided(tmp_path, path, YIELDED_TO)
    assert (event.route, event.reason) == ("cpu", "gpu_unavailable")
    assert event.detail.startswith(words) and YIELDED_TO in event.detail


async def test_a_normal_path_adds_nothing(tmp_path: Path) -> None:
    event = await decided(tmp_path, "normal", "")
    assert (event.route, event.reason, event.detail) == ("cpu", "gpu_unavailable", "")
