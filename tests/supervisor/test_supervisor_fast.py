"""The supervisor against the fake llama-server (fast tier: no model, a small process that misbehaves on
request). The same behaviours are tested with real workers in test_worker_failures.py."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from pathlib import Path

import pytest

from tests.supervisor.conftest import Recorder
from tests.support.fake_worker import fake_llama_server
from tests.support.waits import wait_until_async
from tray_app.config import SupervisorConfig
from tray_app.engine import binary
from tray_app.engine.profile import WorkerProfile
from tray_app.supervisor import WorkerSupervisor


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def supervisor_for(
    tmp_path: Path,
    recorder: Recorder,
    settings: SupervisorConfig,
    profile: WorkerProfile,
    **fake: float | str,
) -> WorkerSupervisor:
    engine = binary.find(str(fake_llama_server(tmp_path, **fake)))
    return WorkerSupervisor(profile, recorder.bus, settings, engine=engine, log_dir=tmp_path / "logs")


async def test_a_worker_starts_serves_health_and_stops(
    tmp_path: Path, recorder: Recorder, fast_settings: SupervisorConfig, cpu_profile: WorkerProfile
) -> None:
    supervisor = supervisor_for(tmp_path, recorder, fast_settings, cpu_profile, load_seconds=0.3)
    try:
        assert await supervisor.start()
        pid = supervisor.pid
        assert supervisor.state == "ready" and pid is not None and supervisor.base_url
        states = [(e.old, e.new) for e in recorder.of_type("worker_state", "cpu")]  # type: ignore[attr-defined]
        assert states[:2] == [("stopped", "starting"), ("starting", "ready")]
        await supervisor.stop()
        assert supervisor.state == "stopped" and not alive(pid)
    finally:
        await supervisor.aclose()


async def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace(
    tmp_path: Path, recorder: Recorder, fast_settings: SupervisorConfig, cpu_profile: WorkerProfile
) -> None:
    settings = dataclasses.replace(fast_settings, stop_grace=0.5)
    supervisor = supervisor_for(tmp_path, recorder, settings, cpu_profile, ignore_sigterm=1)
    try:
        assert await supervisor.start()
        pid = supervisor.pid
        assert pid is not None
        began = time.monotonic()
        await supervisor.stop()
        assert time.monotonic() - began >= 0.5  # it waited the grace, then killed
        assert supervisor.state == "stopped" and not alive(pid)
    finally:
        await supervisor.aclose()


async def test_a_crash_after_ready_is_classified_and_the_worker_restarted(
    tmp_path: Path, recorder: Recorder, fast_settings: SupervisorConfig, cpu_profile: WorkerProfile
) -> None:
    supervisor = supervisor_for(tmp_path, recorder, fast_settings, cpu_profile, die_after=0.4)
    try:
        assert await supervisor.start()
        first = supervisor.pid
        await wait_until_async(lambda: bool(recorder.of_type("worker_restarted", "cpu")), 20, "a restart")
        failure = supervisor.last_failure
        assert failure is not None and (failure["kind"], failure["pid"]) == ("crash_abort", first)
        unhealthy = recorder.of_type("worker_unhealthy", "cpu")
        assert unhealthy and unhealthy[0].kind == "crash_abort"  # type: ignore[attr-defined]
    finally:
        await supervisor.aclose()


async def test_a_stale_failure_report_leaves_the_restarted_worker_up(
    tmp_path: Path, recorder: Recorder, fast_settings: SupervisorConfig, cpu_profile: WorkerProfile
) -> None:
    """Review N5: several jobs see one incident. The first report restarts the worker; a later one, about
    the process that is gone, must not fail the process that replaced it."""
    supervisor = supervisor_for(tmp_path, recorder, fast_settings, cpu_profile)
    try:
        assert await supervisor.start()
        first = supervisor.pid
        supervisor.mark_unhealthy("Compute error.", "oom_decode", pid=first)
        await wait_until_async(lambda: supervisor.pid not in (None, first), 20, "a new process")
        assert await supervisor.ensure_ready(20)
        second = supervisor.pid
        supervisor.mark_unhealthy("Compute error.", "oom_decode", pid=first)  # another job's, late
        await asyncio.sleep(0)  # posted thread-safe: now in the owner's queue
        assert await supervisor.start()  # answered after the owner handled the report queued before it
        assert (supervisor.pid, supervisor.state) == (second, "ready")
        assert supervisor.status()["restarts"] == 1
        assert [e.kind for e in recorder.of_type("worker_unhealthy", "cpu")] == ["oom_decode"]  # type: ignore[attr-defined]
    finally:
        await supervisor.aclose()


async def test_a_profile_update_applies_to_a_restart_sent_right_after(
    tmp_path: Path, recorder: Recorder, fast_settings: SupervisorConfig, cpu_profile: WorkerProfile
) -> None:
    """The owner applies the profile; a restart queued behind it starts the new one."""
    supervisor = supervisor_for(tmp_path, recorder, fast_settings, cpu_profile)
    try:
        assert await supervisor.start()
        wider = dataclasses.replace(cpu_profile, n_ctx=2 * cpu_profile.n_ctx)
        supervisor.update_profile(wider)
        assert await supervisor.restart("new plan")
        assert supervisor.profile == wider and supervisor.status()["health"]["n_ctx"] == wider.n_ctx
        with pytest.raises(ValueError):
            supervisor.update_profile(dataclasses.replace(wider, role="gpu"))
    finally:
        await supervisor.aclose()
