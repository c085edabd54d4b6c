"""Fixtures for worker and supervisor tests: fast supervisor settings, profiles on the bundled model, an event
recorder, and supervisors that are always closed (and their processes checked gone) after each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tray_app.config import SupervisorConfig
from tray_app.contract.events import Event, EventBus
from tray_app.engine.profile import WorkerProfile
from tray_app.engine.tools import CHATML_TOOLS_TEMPLATE
from tray_app.supervisor import WorkerSupervisor

SIMULATED_VRAM = 4 * 1024**3
# Small contexts and one thread per worker: two workers share two cores during these tests.
TEST_CTX = 512


@dataclass
class Recorder:
    bus: EventBus = field(default_factory=EventBus)
    events: list[Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.bus.add_listener(self.events.append)

    def of_type(self, type_name: str, role: str | None = None) -> list[Event]:
        return [
            e
            for e in self.events
            if e.type == type_name and (role is None or getattr(e, "role", None) == role)
        ]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def fast_settings() -> SupervisorConfig:
    return SupervisorConfig(
        start_timeout=30.0,
        health_interval=0.2,
        health_timeout=2.0,  # generous: other test processes share the two cores
        stop_grace=3.0,
        backoff_initial=0.5,
        backoff_max=2.0,
        stable_after=30.0,
    )


@pytest.fixture
def gpu_profile(model_path: Path) -> WorkerProfile:
    return WorkerProfile(
        role="gpu",
        model_path=model_path,
        n_ctx=TEST_CTX,
        n_gpu_layers=-1,
        n_threads=1,
        simulated_vram_bytes=SIMULATED_VRAM,
        enable_faults=True,
        chat_format=str(CHATML_TOOLS_TEMPLATE),  # what the service picks for the bundled model
    )


@pytest.fixture
def cpu_profile(model_path: Path) -> WorkerProfile:
    return WorkerProfile(
        role="cpu",
        model_path=model_path,
        n_ctx=TEST_CTX,
        n_gpu_layers=0,
        n_threads=1,
        chat_format=str(CHATML_TOOLS_TEMPLATE),
    )


SupervisorFactory = Callable[[WorkerProfile], WorkerSupervisor]


def _descendants() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
async def make_supervisor(
    recorder: Recorder, fast_settings: SupervisorConfig, tmp_path: Path
) -> AsyncIterator[SupervisorFactory]:
    """Build supervisors; at teardown close them all and check that no worker they spawned is alive."""
    created: list[WorkerSupervisor] = []
    spawned: set[int] = set()
    # Children this test process had before (multiprocessing's resource tracker, kept for the session by
    # an earlier test) are not this test's workers.
    earlier = _descendants()

    def track(event: Event) -> None:
        pid = getattr(event, "pid", None)
        if pid is not None:
            spawned.add(pid)

    recorder.bus.add_listener(track)

    def make(profile: WorkerProfile) -> WorkerSupervisor:
        supervisor = WorkerSupervisor(profile, recorder.bus, fast_settings, log_dir=tmp_path / "logs")
        created.append(supervisor)
        return supervisor

    yield make
    for supervisor in created:
        await supervisor.aclose()
    survivors = [pid for pid in spawned | (_descendants() - earlier) if _alive(pid)]
    assert survivors == [], f"worker processes left behind: {survivors}"
