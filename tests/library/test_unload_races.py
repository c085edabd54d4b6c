"""Review N8: unloading decided and acted across awaits with no look again, so a request arriving during the
first worker's stop was sent to the second worker as it was being stopped, and a load during an unload raced
it. The library with stand-in workers whose stop takes a while, the real job registry."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tray_app.contract.events import EventBus
from tray_app.host.library import Library
from tray_app.jobs.journal import Journal
from tray_app.jobs.registry import Job, JobRegistry
from tray_app.library.catalog import Catalog, ModelEntry

MAIN = ModelEntry("main.gguf", Path("main.gguf"), (), main=True)
NOTES = ModelEntry("notes", Path("notes.gguf"), (), main=False)


class SlowStopWorker:
    """A running worker whose stop waits until the test lets it go."""

    def __init__(self) -> None:
        self.state = "ready"
        self.stopping = asyncio.Event()
        self.release = asyncio.Event()
        self.stops = 0
        self.starts = 0

    async def stop(self) -> None:
        self.stops += 1
        self.stopping.set()
        await self.release.wait()
        self.state = "stopped"

    async def ensure_ready(self, timeout: float) -> bool:
        self.starts += self.state != "ready"
        self.state = "ready"
        return True


@pytest.fixture
def registry(tmp_path: Path) -> Any:
    journal = Journal(tmp_path / "journal.sqlite3")
    yield JobRegistry(journal, EventBus())
    journal.close()


def library_with(workers: dict[str, SlowStopWorker], registry: JobRegistry) -> Library:
    library = Library(
        Catalog([MAIN, NOTES]),
        workers.get,
        registry,
        EventBus(),
        lambda: None,  # type: ignore[arg-type, return-value]
        lambda path, chat_format: None,  # type: ignore[arg-type, return-value]
    )
    library.plans = {"notes": object()}  # type: ignore[dict-item]
    return library


def job_for(model: str) -> Job:
    return Job(
        id="job-1",
        request_id="r",
        kind="chat",
        body={},
        stream=False,
        background=False,
        body_hash="",
        idempotency_key=None,
        prompt_tokens=1,
        max_tokens=1,
        deadline=time.monotonic() + 60,
        asked_model=model,
    )


async def test_an_unload_stops_short_when_a_request_arrives_during_it(registry: JobRegistry) -> None:
    gpu, cpu = SlowStopWorker(), SlowStopWorker()
    library = library_with({"gpu@notes": gpu, "cpu@notes": cpu}, registry)
    unloading = asyncio.create_task(library.unload("notes", if_idle=True))
    await gpu.stopping.wait()
    registry.add(job_for("notes"))  # a request for the model, while its GPU worker stops
    gpu.release.set()
    assert await unloading is False
    assert (gpu.stops, cpu.stops, cpu.state) == (1, 0, "ready")  # the CPU worker keeps serving it


async def test_a_load_during_an_unload_waits_for_it_then_starts_the_worker_again(
    registry: JobRegistry,
) -> None:
    cpu = SlowStopWorker()
    library = library_with({"cpu@notes": cpu}, registry)
    library.plans = {}  # no plans: roles() would name no worker, so ask the worker directly as load does
    library.roles = lambda entry: {"cpu": "cpu@notes"}  # type: ignore[method-assign]
    unloading = asyncio.create_task(library.unload("notes", devices=("cpu",)))
    await cpu.stopping.wait()
    loading = asyncio.create_task(library.load(NOTES, "cpu", 5.0))
    await asyncio.sleep(0.05)
    assert not loading.done()  # it waits for the stop instead of finding a worker about to go
    cpu.release.set()
    assert await unloading is True
    assert await loading is True and cpu.starts == 1 and cpu.state == "ready"


class SlowStartWorker(SlowStopWorker):
    """A stopped worker whose start takes `seconds`."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.state, self.seconds = "stopped", seconds

    async def ensure_ready(self, timeout: float) -> bool:
        await asyncio.sleep(self.seconds)
        return await super().ensure_ready(timeout)


async def test_a_load_slower_than_its_keep_alive_is_kept_from_its_ready(registry: JobRegistry) -> None:
    # The keep-alive counts from the moment the model is ready, not from the request that asked for it.
    cpu = SlowStartWorker(0.3)
    library = library_with({"cpu@notes": cpu}, registry)
    library.roles = lambda entry: {"cpu": "cpu@notes"}  # type: ignore[method-assign]
    library.touch("notes", keep_alive=0.2)
    assert await library.load(NOTES, "cpu", 5.0) is True
    left = library.unload_in(NOTES)
    assert left is not None and left > 0.1
