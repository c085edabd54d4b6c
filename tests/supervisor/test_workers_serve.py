"""Real worker subprocesses on the bundled model: they start, answer, keep /health fast while generating."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import httpx
import pytest

from tests.supervisor.conftest import Recorder, SupervisorFactory
from tests.supervisor.helpers import HELLO, client_for
from tests.support.tools import WEATHER_TOOL
from tests.support.waits import wait_until_async
from tray_app.budget import calibration
from tray_app.budget.footprint import kv_cache_bytes
from tray_app.budget.model_info import inspect_model
from tray_app.budget.plan import ComputeSettings, PlanRequest
from tray_app.engine.argv import PROMPT_BATCH
from tray_app.engine.profile import WorkerProfile
from tray_app.engine.tools import CHATML_TOOLS_TEMPLATE, tool_call_opener, worker_tool_choice
from tray_app.jobs.registry import upstream_stream
from tray_app.jobs.relay import Relay

pytestmark = pytest.mark.integration


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

    # A chatml model without tools in its own template runs with the bundled tool template: "required"
    # (the form a named tool_choice takes for llama-server) answers with a tool call.
    assert gpu.profile.chat_format == str(CHATML_TOOLS_TEMPLATE)
    body = worker_tool_choice(
        {
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "function": {"name": "lookup_weather"}},
        },
        tool_call_opener(gpu.profile.chat_format),
    )
    async with client_for(gpu) as client:
        forced = await client.chat.completions.create(model="m", max_tokens=40, temperature=0, seed=1, **body)
    calls = forced.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "lookup_weather"  # type: ignore[union-attr]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]


async def test_slots_serve_requests_at_once_and_health_stays_fast(
    make_supervisor: SupervisorFactory, gpu_profile: WorkerProfile
) -> None:
    supervisor = make_supervisor(dataclasses.replace(gpu_profile, n_parallel=2, n_ctx=1024))
    assert await supervisor.start()
    latencies: list[float] = []
    first_tokens: dict[str, float] = {}
    ends: dict[str, float] = {}

    async def stream(name: str, tokens: int) -> int:
        """Streams `tokens` tokens; returns how many the worker generated (its usage count: a chunk can hold
        several tokens when the chat parser holds text back, e.g. a possible tool-call opener)."""
        generated = 0
        async with client_for(supervisor) as client:
            answer = await client.chat.completions.create(
                model="m",
                messages=HELLO,
                max_tokens=tokens,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            async for chunk in answer:
                first_tokens.setdefault(name, time.monotonic())
                if chunk.usage is not None:
                    generated = chunk.usage.completion_tokens
        ends[name] = time.monotonic()
        return generated

    async with httpx.AsyncClient(base_url=supervisor.base_url or "", trust_env=False) as http:
        long = asyncio.create_task(stream("long", 200))
        await wait_until_async(lambda: "long" in first_tokens, 30, "the long stream's first token")
        short = asyncio.create_task(stream("short", 8))
        while not long.done():
            began = time.perf_counter()
            assert (await http.get("/health", timeout=1.0)).status_code == 200
            latencies.append(time.perf_counter() - began)
            await asyncio.sleep(0.05)
        assert (await long, await short) == (200, 8)
        slots = (await http.get("/slots", headers=supervisor.request_headers)).json()
    # Two slots: the short request was answered while the long one was still generating.
    assert ends["short"] < ends["long"]
    assert [slot["n_ctx"] for slot in slots] == [512, 512]
    # Every probe answered 200 within its 1 s timeout while both slots generated (the supervisor's own
    # health timeout is longer): a busy worker is never taken for a hung one. How fast: printed, not judged.
    print(f"\n/health during generation: max {max(latencies) * 1000:.1f} ms over {len(latencies)} probes")
    assert len(latencies) >= 3


@pytest.mark.parametrize("n_parallel", [1, 4])
async def test_the_planned_kv_cache_is_what_llama_server_allocates(
    make_supervisor: SupervisorFactory, cpu_profile: WorkerProfile, n_parallel: int
) -> None:
    profile = dataclasses.replace(cpu_profile, n_parallel=n_parallel, n_ctx=2048)
    supervisor = make_supervisor(profile)
    assert await supervisor.start()
    printed = supervisor.status()["health"]["buffers"]["kv_bytes"]
    planned = kv_cache_bytes(inspect_model(profile.model_path), 2048, PlanRequest(n_parallel=n_parallel))
    assert printed == planned == 45 * 1024 * 1024  # SmolLM2-135M at 2048 cells: llama.cpp's 45.00 MiB


async def test_requests_need_the_workers_key(
    make_supervisor: SupervisorFactory, cpu_profile: WorkerProfile
) -> None:
    supervisor = make_supervisor(cpu_profile)
    assert await supervisor.start()
    async with httpx.AsyncClient(base_url=supervisor.base_url or "", trust_env=False) as http:
        body = {"messages": HELLO, "max_tokens": 2}
        refused = await http.post("/v1/chat/completions", json=body)
        allowed = await http.post("/v1/chat/completions", json=body, headers=supervisor.request_headers)
    assert refused.status_code == 401 and allowed.status_code == 200


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
    supervisor = make_supervisor(dataclasses.replace(gpu_profile, n_parallel=1))
    assert await supervisor.start()
    async with (
        client_for(supervisor) as client,
        httpx.AsyncClient(base_url=supervisor.base_url or "", trust_env=False) as http,
    ):
        stream = await client.chat.completions.create(
            model="m", messages=HELLO, max_tokens=400, stream=True, extra_body={"ignore_eos": True}
        )
        received = 0
        async for _chunk in stream:
            received += 1
            if received == 3:
                break
        await stream.close()

        def idle() -> bool:
            slots = httpx.get(f"{supervisor.base_url}/slots", headers=supervisor.request_headers).json()
            return not any(slot["is_processing"] for slot in slots)

        # The one slot lets go of the abandoned generation long before its 400 tokens (about 5 s here).
        seconds = await wait_until_async(idle, 3, "the slot released")
        print(f"\nslot released {seconds * 1000:.0f} ms after the client left")
        answer = await client.chat.completions.create(model="m", messages=HELLO, max_tokens=4)
        assert answer.choices[0].message.content
        assert (await http.get("/health")).status_code == 200


async def test_a_worker_reports_prompt_progress_that_the_relay_takes_as_liveness(
    make_supervisor: SupervisorFactory, cpu_profile: WorkerProfile
) -> None:
    """A long prompt's attempt asks llama-server for prompt-progress events; the real worker sends them
    while it reads the prompt, and the relay keeps them from the client (issue 14: a slow prompt was taken
    for a hung worker)."""
    supervisor = make_supervisor(dataclasses.replace(cpu_profile, n_parallel=1))
    assert await supervisor.start()
    prompt = " ".join(f"word{index}" for index in range(100))  # about 300 of the profile's 512 tokens
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 3, "cache_prompt": False}
    upstream = {**body, **upstream_stream(PROMPT_BATCH + 1)}  # as a long prompt's attempt asks
    url = f"{supervisor.base_url}/v1/chat/completions"
    async with httpx.AsyncClient(trust_env=False, timeout=60) as http:
        progress = 0
        async with http.stream("POST", url, json=upstream, headers=supervisor.request_headers) as response:
            assert response.status_code == 200, await response.aread()
            async for line in response.aiter_lines():
                if line.startswith("data: {") and "prompt_progress" in json.loads(line[6:]):
                    progress += 1
    assert progress >= 1, "llama-server sent no prompt-progress events"
    relay = Relay()
    try:
        chunks = [
            chunk.obj
            async for chunk in relay.stream(
                url, json.dumps(upstream).encode(), supervisor.request_headers, 60, 60
            )
        ]
    finally:
        await relay.aclose()
    deltas = [(chunk["choices"] or [{}])[0].get("delta") or {} for chunk in chunks]
    assert not any("prompt_progress" in chunk for chunk in chunks)
    assert [delta.get("role") for delta in deltas].count("assistant") == 1  # announced once, as without
    assert any(delta.get("content") for delta in deltas)
