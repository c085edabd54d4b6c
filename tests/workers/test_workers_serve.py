"""Real worker subprocesses on the bundled model: they start, answer, keep /health fast while generating."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import httpx
import openai
import pytest

from tests.workers.conftest import Recorder, SupervisorFactory
from tests.workers.helpers import HELLO, client_for, wait_until
from tray_app import calibration
from tray_app.planner import ComputeSettings
from tray_app.supervisor import WorkerProfile, WorkerSupervisor

pytestmark = pytest.mark.integration

LOOKUP_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "lookup_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


async def test_both_workers_start_and_answer(
    make_supervisor: SupervisorFactory,
    gpu_profile: WorkerProfile,
    cpu_profile: WorkerProfile,
    recorder: Recorder,
) -> None:
    gpu, cpu = make_supervisor(gpu_profile), make_supervisor(cpu_profile)
    started = time.monotonic()
    assert await asyncio.gather(gpu.start(), cpu.start()) == [True, True]
    print(f"\nboth workers ready in {time.monotonic() - started:.2f} s")

    for supervisor in (gpu, cpu):
        async with client_for(supervisor) as client:
            answer = await client.chat.completions.create(model="m", messages=HELLO, max_tokens=12)
        assert answer.choices[0].message.content
        status = supervisor.status()
        assert status["state"] == "ready" and status["pid"] == supervisor.pid
        assert status["rss_bytes"] > 50 * 1024 * 1024
        assert status["cpu_percent"] is not None
        health = status["health"]
        assert health["state"] == "ready" and health["role"] == supervisor.role
        assert (
            health["n_ctx"] == 512
            and health["buffers"]["kv_bytes"] > 0
            and health["buffers"]["model_bytes"] > 0
        )
        print(f"{supervisor.role} worker loaded the model in {health['load_seconds']:.2f} s")

    # The GPU worker measured its buffers for the planner's calibration.
    settings = ComputeSettings(
        n_ctx=512, n_parallel=1, cache_type_k="f16", cache_type_v="f16", flash_attn=False, n_ubatch=512
    )
    measured = calibration.lookup_measurement(gpu_profile.model_path, settings)
    assert measured is not None and measured.kv_bytes == gpu.status()["health"]["buffers"]["kv_bytes"]

    assert gpu.status()["health"]["simulated"] is True and gpu.status()["health"]["memory_limit"] is not None
    assert cpu.status()["health"]["simulated"] is False and cpu.status()["health"]["n_gpu_layers"] == 0
    transitions = [(e.old, e.new) for e in recorder.of_type("worker_state", "gpu")]  # type: ignore[attr-defined]
    assert transitions == [("stopped", "starting"), ("starting", "ready")]

    # The default chat format of a chatml model takes forced tool calls too.
    async with client_for(gpu) as client:
        forced = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[LOOKUP_TOOL],
            tool_choice={"type": "function", "function": {"name": "lookup_weather"}},
            max_tokens=40,
        )
    calls = forced.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "lookup_weather"  # type: ignore[union-attr]


async def test_health_stays_fast_while_a_long_generation_runs(
    make_supervisor: SupervisorFactory, gpu_profile: WorkerProfile
) -> None:
    supervisor = make_supervisor(gpu_profile)
    assert await supervisor.start()
    chunks = 0
    finish_reason = None
    latencies: list[float] = []
    models_answer: asyncio.Task[httpx.Response] | None = None
    async with (
        client_for(supervisor) as client,
        httpx.AsyncClient(base_url=supervisor.base_url or "", trust_env=False) as http,
    ):
        stream = await client.chat.completions.create(
            model="m", messages=HELLO, max_tokens=160, stream=True, extra_body={"min_tokens": 160}
        )
        async for chunk in stream:
            chunks += 1
            finish_reason = chunk.choices[0].finish_reason if chunk.choices else finish_reason
            if chunks == 5:
                # A second request while streaming: with interrupt_requests on, this would cut the stream.
                models_answer = asyncio.create_task(http.get("/v1/models", timeout=30))
            if chunks % 10 == 0 and len(latencies) < 12:
                began = time.perf_counter()
                health = await http.get("/health", timeout=1.0)
                latencies.append(time.perf_counter() - began)
                assert health.json()["state"] == "ready"
        assert models_answer is not None and (await models_answer).status_code == 200
    print(f"\n/health during generation: max {max(latencies) * 1000:.1f} ms over {len(latencies)} probes")
    assert len(latencies) >= 10
    assert max(latencies) < 0.1  # the contract: /health answers within 100 ms during a generation
    assert finish_reason == "length" and chunks > 100  # the stream ran to its end: nothing cut it


async def test_injected_decode_oom_reaches_the_client_and_the_worker_stays_up(
    make_supervisor: SupervisorFactory, gpu_profile: WorkerProfile, recorder: Recorder
) -> None:
    supervisor = make_supervisor(gpu_profile)
    assert await supervisor.start()
    pid = supervisor.pid
    async with client_for(supervisor) as client:
        await _decode_oom_twice(supervisor, client)
        # Same process, still serving: a decode OOM is an answer, not a crash.
        answer = await client.chat.completions.create(model="m", messages=HELLO, max_tokens=8)
    assert answer.choices[0].message.content
    assert supervisor.pid == pid and supervisor.state == "ready" and supervisor.status()["restarts"] == 0

    # The router reports it: the supervisor restarts the worker in the background.
    supervisor.mark_unhealthy("decode failed with -2 during a request", "oom_decode")
    await wait_until(lambda: supervisor.status()["restarts"] == 1, 10, "restart after mark_unhealthy")
    assert await supervisor.ensure_ready(30)
    assert supervisor.pid != pid
    assert supervisor.status()["last_failure"]["kind"] == "oom_decode"
    assert [e.kind for e in recorder.of_type("worker_unhealthy")] == ["oom_decode"]  # type: ignore[attr-defined]


async def _decode_oom_twice(supervisor: WorkerSupervisor, client: openai.AsyncOpenAI) -> None:
    await supervisor.arm_fault("oom_decode", after_tokens=3)
    with pytest.raises(openai.InternalServerError, match="llama_decode returned -2"):
        await client.chat.completions.create(model="m", messages=HELLO, max_tokens=20)

    await supervisor.arm_fault("oom_decode", after_tokens=3)
    stream = await client.chat.completions.create(
        model="m", messages=HELLO, max_tokens=20, stream=True, extra_body={"min_tokens": 20}
    )
    received = 0
    with pytest.raises(openai.APIError, match="llama_decode returned -2"):
        async for chunk in stream:
            received += bool(chunk.choices and chunk.choices[0].delta.content)
    assert 1 <= received <= 4  # the tokens before the failure arrived, then the error


async def test_an_on_demand_worker_starts_when_first_needed(
    make_supervisor: SupervisorFactory, cpu_profile: WorkerProfile, recorder: Recorder
) -> None:
    supervisor = make_supervisor(
        dataclasses.replace(cpu_profile, warm=False, warm_reason="not enough RAM to keep warm")
    )
    assert supervisor.state == "stopped" and supervisor.base_url is None
    assert supervisor.status()["warm_reason"] == "not enough RAM to keep warm"
    assert await supervisor.ensure_ready(30)
    first = recorder.of_type("worker_state", "cpu")[0]
    assert (first.old, first.new, first.reason) == ("stopped", "starting", "started on demand")  # type: ignore[attr-defined]


async def test_a_stream_the_client_leaves_stops_generating(
    make_supervisor: SupervisorFactory, gpu_profile: WorkerProfile
) -> None:
    supervisor = make_supervisor(gpu_profile)
    assert await supervisor.start()
    # An armed fault counts the tokens generated since it was armed: still armed at the end means the
    # abandoned generation stopped long before its 400 tokens.
    await supervisor.arm_fault("oom_decode", after_tokens=200)
    async with (
        client_for(supervisor) as client,
        httpx.AsyncClient(base_url=supervisor.base_url or "", trust_env=False) as http,
    ):
        stream = await client.chat.completions.create(
            model="m", messages=HELLO, max_tokens=400, stream=True, extra_body={"min_tokens": 400}
        )
        received = 0
        async for _chunk in stream:
            received += 1
            if received == 3:
                break
        await stream.close()
        # The model's lock is taken in turn: this answer comes only once the abandoned generation let go.
        answer = await client.chat.completions.create(model="m", messages=HELLO, max_tokens=4)
        assert answer.choices[0].message.content
        health = (await http.get("/health")).json()
        assert health["armed_fault"] == {"kind": "oom_decode", "after_tokens": 200}

        # A streamed request its schema rejects still gets llama-cpp-python's own answer.
        rejected = await http.post(
            "/v1/chat/completions", json={"messages": HELLO, "max_tokens": "many", "stream": True}
        )
        assert rejected.status_code == 500 and "validation error" in rejected.json()["error"]["message"]
