"""Each failure a GPU worker can have, caused for real, seen and classified by the supervisor."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import signal
import time
from pathlib import Path

import openai
import pytest

from tests.supervisor.conftest import Recorder, SupervisorFactory
from tests.supervisor.helpers import HELLO, client_for, process_alive
from tests.support.waits import wait_until_async
from tray_app.engine.profile import WorkerProfile
from tray_app.supervisor import launch_plan

pytestmark = pytest.mark.integration

MIB = 1024 * 1024


async def test_sigkill_is_detected_and_the_worker_is_back(
    make_supervisor: SupervisorFactory, gpu_profile: WorkerProfile, recorder: Recorder
) -> None:
    supervisor = make_supervisor(gpu_profile)
    assert await supervisor.start()
    old_pid = supervisor.pid
    assert old_pid is not None
    killed_at = time.monotonic()
    os.kill(old_pid, signal.SIGKILL)
    await wait_until_async(lambda: supervisor.status()["restarts"] == 1, 10, "a restart after SIGKILL")
    assert await supervisor.ensure_ready(30)
    print(f"\nback ready {time.monotonic() - killed_at:.2f} s after SIGKILL")
    assert supervisor.pid != old_pid and not process_alive(old_pid)
    assert supervisor.status()["last_failure"]["kind"] == "killed"
    restarted = recorder.of_type("worker_restarted")
    assert len(restarted) == 1 and restarted[0].pid == supervisor.pid  # type: ignore[attr-defined]
    async with client_for(supervisor) as client:
        answer = await client.chat.completions.create(model="m", messages=HELLO, max_tokens=8)
    assert answer.choices[0].message.content


async def test_injected_abort_is_a_crash(
    make_supervisor: SupervisorFactory, gpu_profile: WorkerProfile, recorder: Recorder
) -> None:
    supervisor = make_supervisor(gpu_profile)
    assert await supervisor.start()
    old_pid = supervisor.pid
    await supervisor.arm_fault("abort", after_tokens=3)
    received = 0
    async with client_for(supervisor) as client:
        with pytest.raises(openai.APIError):
            stream = await client.chat.completions.create(
                model="m", messages=HELLO, max_tokens=60, stream=True, extra_body={"ignore_eos": True}
            )
            async for _chunk in stream:
                received += 1
                supervisor.note_tokens(1)  # what the router does with every token it relays
    assert 3 <= received < 60
    # The router reports what it saw; the supervisor still classifies from how the process really ended.
    supervisor.mark_unhealthy("connection lost during a stream", "exited")
    await wait_until_async(
        lambda: supervisor.status()["last_failure"] is not None, 10, "the failure recorded"
    )
    failure = supervisor.status()["last_failure"]
    assert failure["kind"] == "crash_abort"
    assert "SIGABRT" in failure["message"]
    assert "fault injected: abort after 3 tokens" in Path(supervisor.status()["log_file"]).read_text()
    assert [e.kind for e in recorder.of_type("worker_unhealthy")] == ["crash_abort"]  # type: ignore[attr-defined]
    assert await supervisor.ensure_ready(30) and supervisor.pid != old_pid


async def test_hung_worker_is_detected_and_replaced(
    make_supervisor: SupervisorFactory, gpu_profile: WorkerProfile
) -> None:
    supervisor = make_supervisor(gpu_profile)
    assert await supervisor.start()
    old_pid = supervisor.pid
    assert old_pid is not None
    await supervisor.arm_fault("hang", after_tokens=0)
    async with client_for(supervisor, timeout=20) as client:
        supervisor.note_tokens(0)  # the router is about to send a request: the process stops (SIGSTOP)
        request = asyncio.create_task(
            client.chat.completions.create(model="m", messages=HELLO, max_tokens=30)
        )
        hung_at = time.monotonic()
        await wait_until_async(lambda: supervisor.state != "ready", 10, "the hang detected")
        print(f"\nhang detected {time.monotonic() - hung_at:.2f} s after the request")
        with pytest.raises(openai.APIConnectionError):
            await request  # the stopped worker was killed under it
    failure = supervisor.status()["last_failure"]
    assert failure["kind"] == "hung" and "health" in failure["message"]
    assert await supervisor.ensure_ready(30)
    assert supervisor.pid != old_pid and not process_alive(old_pid)


async def test_load_oom_fault_is_classified_and_backed_off(
    make_supervisor: SupervisorFactory, gpu_profile: WorkerProfile, recorder: Recorder
) -> None:
    supervisor = make_supervisor(dataclasses.replace(gpu_profile, fault_load_oom=True))
    started = time.monotonic()
    assert await supervisor.start() is False
    print(f"\nload OOM seen {time.monotonic() - started:.2f} s after start")
    status = supervisor.status()
    assert status["last_failure"]["kind"] == "oom_load"
    # A real allocation failed inside llama.cpp under the worker's memory limit: its own words, exit 1.
    assert status["last_failure"]["message"].startswith("ggml_aligned_malloc: insufficient memory")
    assert status["state"] == "restarting" and status["next_retry_at"] > time.time()
    # Let it retry for a while: each try waits longer (0.5 s, 1 s, 2 s...), it never hot-loops.
    await wait_until_async(lambda: len(recorder.of_type("worker_restarted")) >= 2, 15, "two retries")
    # Time from each failure to the next start: the backoff, doubling from backoff_initial (0.5 s).
    transitions = [(e.new, e.at) for e in recorder.of_type("worker_state")]  # type: ignore[attr-defined]
    waits = [
        later_at - at
        for (state, at), (later, later_at) in itertools.pairwise(transitions)
        if state == "restarting" and later == "starting"
    ]
    assert len(waits) >= 2 and waits[0] >= 0.45 and waits[1] >= 0.95, waits
    assert [e.kind for e in recorder.of_type("worker_unhealthy")][:2] == ["oom_load", "oom_load"]  # type: ignore[attr-defined]
    log_text = Path(supervisor.status()["log_file"]).read_text()
    assert "insufficient memory" in log_text and "exiting due to model loading error" in log_text


@pytest.mark.parametrize(
    ("vram_mib", "message"),
    [(48, "unable to allocate CUDA0 buffer"), (100, "failed to allocate buffer for kv cache")],
)
async def test_simulated_gpu_too_small_fails_at_load_like_a_real_one(
    make_supervisor: SupervisorFactory, gpu_profile: WorkerProfile, vram_mib: int, message: str
) -> None:
    supervisor = make_supervisor(dataclasses.replace(gpu_profile, simulated_vram_bytes=vram_mib * MIB))
    assert await supervisor.start() is False
    status = supervisor.status()
    assert status["last_failure"]["kind"] == "oom_load"
    assert message in status["last_failure"]["message"]
    assert status["state"] == "restarting" and status["next_retry_at"] is not None
    assert "(simulated)" in Path(status["log_file"]).read_text()


async def test_a_fault_while_preparing_a_start_ends_that_start_and_says_so(
    make_supervisor: SupervisorFactory, gpu_profile: WorkerProfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected error before the process starts must not end the owner: start() would wait forever."""

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in preparing the launch")

    monkeypatch.setattr(launch_plan, "prepare", broken)
    supervisor = make_supervisor(gpu_profile)
    assert await asyncio.wait_for(supervisor.start(), 10) is False
    status = supervisor.status()
    assert status["state"] == "failed"
    assert "a bug in preparing the launch" in status["last_failure"]["message"]


async def test_missing_model_is_bad_config_and_not_retried(
    make_supervisor: SupervisorFactory, gpu_profile: WorkerProfile, tmp_path: Path, recorder: Recorder
) -> None:
    supervisor = make_supervisor(dataclasses.replace(gpu_profile, model_path=tmp_path / "missing.gguf"))
    assert await supervisor.start() is False
    status = supervisor.status()
    assert status["state"] == "failed" and status["next_retry_at"] is None
    assert (
        status["last_failure"]["kind"] == "bad_config"
        and "failed to open GGUF file" in status["last_failure"]["message"]
    )
    assert not await supervisor.ensure_ready(1)  # a failed worker is started again only on request
    assert recorder.of_type("worker_restarted") == []
