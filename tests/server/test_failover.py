"""GPU-to-CPU failover with injected faults, through the real openai client against a real service."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from tests.support.helpers import (
    COUNTING,
    arm,
    base_settings,
    client_for,
    failsoft_of,
    job_state,
    reload_settings,
    seeded_chat,
    wait_replaced,
    wait_until,
)
from tests.support.service import ServiceHandle, module_service
from tests.support.tools import ADD_TOOL, FORCE_ADD

pytestmark = pytest.mark.integration

# Replays here always go to the CPU, however slow a busy test machine makes it (the approval queue for slow
# CPU runs has its own tests).
SETTINGS = base_settings(failover={"auto_approve_seconds": 3600})
REQUEST = seeded_chat(max_tokens=24, seed=11)


svc = module_service(enable_faults=True, settings=SETTINGS)


@pytest.fixture(scope="module")
def gpu_text(client: openai.OpenAI) -> str:
    """The GPU worker's answer to REQUEST (temperature 0, pinned seed): the text every replay must match."""
    completion = client.chat.completions.create(**REQUEST)
    assert failsoft_of(completion)["worker"] == "gpu"
    text = completion.choices[0].message.content
    assert text
    return text


def _gpu_pid(svc: ServiceHandle) -> int:
    pid = svc.wait_workers_ready()["workers"]["gpu"]["pid"]
    assert isinstance(pid, int)
    return pid


@pytest.mark.parametrize("kind", ["abort", "kill"])
def test_non_streamed_failure_replays_on_the_cpu_with_the_same_text(
    svc: ServiceHandle, client: openai.OpenAI, gpu_text: str, kind: str
) -> None:
    armed = arm(svc, kind, after_tokens=4)
    raw = client.chat.completions.with_raw_response.create(**REQUEST)
    completion = raw.parse()
    info = failsoft_of(completion)
    assert info["worker"] == "cpu" and info["attempts"] == 2
    # The connection drops; the reason still names how the process ended, as its supervisor saw.
    reason = "crash_abort" if kind == "abort" else "killed"
    assert info["fallback_reason"] == reason
    assert (raw.headers["x-failsoft-worker"], raw.headers["x-failsoft-attempts"]) == ("cpu", "2")
    assert completion.choices[0].message.content == gpu_text
    stored = job_state(svc, info["job_id"])
    assert [(a["worker"], a["outcome"]) for a in stored["attempt_log"]] == [
        ("gpu", "failed"),
        ("cpu", "completed"),
    ]
    assert stored["attempt_log"][0]["error"].startswith(reason) and stored["fallback_reason"] == reason
    # The GPU worker is restarted in the background and comes back.
    assert wait_replaced(svc, armed["pid"])["workers"]["gpu"]["restarts"] >= 1


def test_sigkill_mid_request_replays_on_the_cpu(svc: ServiceHandle, client: openai.OpenAI) -> None:
    pid = _gpu_pid(svc)
    results: dict[str, Any] = {}

    def ask() -> None:
        results["answer"] = client.completions.create(**COUNTING, max_tokens=300)  # type: ignore[call-overload]

    thread = threading.Thread(target=ask)
    thread.start()
    wait_until(lambda: svc.status()["workers"]["gpu"]["in_flight"] == 1, what="the request to reach the GPU")
    os.kill(pid, signal.SIGKILL)
    thread.join(180)
    info = failsoft_of(results["answer"])
    assert info["worker"] == "cpu" and info["attempts"] == 2 and info["fallback_reason"] == "killed"
    wait_replaced(svc, pid)


def test_a_hung_gpu_worker_is_detected_and_the_job_replayed(
    svc: ServiceHandle, client: openai.OpenAI, gpu_text: str
) -> None:
    armed = arm(svc, "hang", after_tokens=3)
    completion = client.chat.completions.create(**REQUEST)
    info = failsoft_of(completion)
    assert info["worker"] == "cpu" and info["fallback_reason"] == "hung"
    assert completion.choices[0].message.content == gpu_text
    assert wait_replaced(svc, armed["pid"])["workers"]["gpu"]["last_failure"]["kind"] == "hung"


def _stream_text(client: openai.OpenAI, request: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    chunks = list(client.chat.completions.create(**request, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, failsoft_of(chunks[-1])


def test_stream_failure_before_content_is_transparent(
    svc: ServiceHandle, client: openai.OpenAI, gpu_text: str
) -> None:
    armed = arm(svc, "abort", after_tokens=0)
    text, info = _stream_text(client, REQUEST)
    assert text == gpu_text
    assert info["worker"] == "cpu" and info["attempts"] == 2 and info["fallback_reason"] == "crash_abort"
    wait_replaced(svc, armed["pid"])


def test_a_replayed_streams_first_token_is_not_timed_as_the_routers_own(
    svc: ServiceHandle, client: openai.OpenAI, gpu_text: str
) -> None:
    """/failsoft/timing is the router's own time on a first attempt's way: a replay's way holds the
    failover (the crash, its detection, a second worker), which the bench measures apart."""
    recorded = httpx.get(svc.base_url + "/failsoft/timing", timeout=10).json()["recorded"]
    armed = arm(svc, "abort", after_tokens=0)
    text, info = _stream_text(client, REQUEST)
    assert text == gpu_text and info["attempts"] == 2
    assert httpx.get(svc.base_url + "/failsoft/timing", timeout=10).json()["recorded"] == recorded
    wait_replaced(svc, armed["pid"])
    _stream_text(client, REQUEST)  # the next stream, on the new GPU worker's first attempt, is timed
    assert httpx.get(svc.base_url + "/failsoft/timing", timeout=10).json()["recorded"] == recorded + 1


def test_stream_failure_after_content_resumes_on_the_cpu(
    svc: ServiceHandle, client: openai.OpenAI, gpu_text: str
) -> None:
    armed = arm(svc, "abort", after_tokens=6)
    text, info = _stream_text(client, REQUEST)
    assert info["worker"] == "cpu" and info["fallback_reason"] == "crash_abort" and info["attempts"] == 2
    # One uninterrupted stream: what the GPU sent, and the CPU's continuation of it, prompted with the
    # template the workers render (here the bundled tool template, not the model's own): at temperature 0
    # the CPU goes on with the GPU's own words.
    assert text == gpu_text
    wait_replaced(svc, armed["pid"])


def test_stream_failure_after_content_with_error_policy_ends_the_stream(
    svc: ServiceHandle, client: openai.OpenAI
) -> None:
    reload_settings(
        svc,
        base_settings(failover={**SETTINGS["failover"], "stream_after_content": "error"}),
    )
    try:
        armed = arm(svc, "abort", after_tokens=6)
        received: list[str] = []
        with pytest.raises(openai.APIError) as error:
            for chunk in client.chat.completions.create(**REQUEST, stream=True):
                if chunk.choices and chunk.choices[0].delta.content:
                    received.append(chunk.choices[0].delta.content)
        assert received, "content reached the client before the failure"
        assert "stream_started" in str(error.value.body) or "stream_started" in str(error.value)
        wait_replaced(svc, armed["pid"])
    finally:
        reload_settings(svc, SETTINGS)


class CountingTool:
    """A simulated tool with a side effect we can count."""

    def __init__(self) -> None:
        self.executions = 0
        self.lock = threading.Lock()

    def __call__(self, arguments: str) -> str:
        with self.lock:
            self.executions += 1
        return "42"


def agent_turn(client: openai.OpenAI, tool: CountingTool, question: str) -> int:
    """One intended tool call: ask with the tool forced, run each delivered call once, then answer."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    first = client.chat.completions.create(
        model="default",
        messages=messages,
        tools=[ADD_TOOL],
        tool_choice=FORCE_ADD,
        max_tokens=60,
        temperature=0,
    )
    calls = first.choices[0].message.tool_calls or []
    for call in calls:
        result = tool(call.function.arguments)
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": result},
        ]
    final = client.chat.completions.create(model="default", messages=messages, max_tokens=12, temperature=0)
    assert final.choices[0].message.content is not None
    return len(calls)


def test_tool_calls_run_exactly_once_under_faults(svc: ServiceHandle, client: openai.OpenAI) -> None:
    tool = CountingTool()
    intended = 0
    for fault in ("abort", "kill", None, "abort"):
        armed = arm(svc, fault, after_tokens=2) if fault else None
        intended += agent_turn(client, tool, "What is 2 plus 3? Use the add tool.")
        if armed:
            wait_replaced(svc, armed["pid"])
    assert intended == 4
    assert tool.executions == intended


def test_a_streamed_tool_call_is_never_replayed(svc: ServiceHandle, client: openai.OpenAI) -> None:
    """Not by the router, and not by a client retrying under the same Idempotency-Key (issue 14)."""
    armed = arm(svc, "abort", after_tokens=8)
    request = {**REQUEST, "tools": [ADD_TOOL], "tool_choice": FORCE_ADD, "max_tokens": 60}
    key = {"Idempotency-Key": f"tool-{time.monotonic_ns()}"}
    deltas = 0
    with pytest.raises(openai.APIError) as error:
        for chunk in client.chat.completions.create(**request, stream=True, extra_headers=key):
            if chunk.choices and chunk.choices[0].delta.tool_calls:
                deltas += 1
    assert deltas > 0
    assert "effects_delivered" in str(error.value.body) or "effects_delivered" in str(error.value)
    wait_replaced(svc, armed["pid"])
    with pytest.raises(openai.ConflictError) as retried:
        client.chat.completions.create(**request, stream=True, extra_headers=key)
    assert retried.value.code == "idempotency_key_effects_delivered"


def test_a_stream_bound_to_a_json_format_is_not_resumed_without_it(
    svc: ServiceHandle, client: openai.OpenAI
) -> None:
    """A continuation on the CPU is a plain completion: it could not keep the format (issue 14)."""
    armed = arm(svc, "abort", after_tokens=6)
    request = {**REQUEST, "response_format": {"type": "json_object"}, "max_tokens": 40}
    received: list[str] = []
    with pytest.raises(openai.APIError) as error:
        for chunk in client.chat.completions.create(**request, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                received.append(chunk.choices[0].delta.content)
    assert "".join(received).lstrip().startswith("{")
    assert "constrained_stream_started" in str(error.value.body) or "constrained_stream_started" in str(
        error.value
    )
    wait_replaced(svc, armed["pid"])


def test_client_disconnect_cancels_the_generation(svc: ServiceHandle, client: openai.OpenAI) -> None:
    svc.wait_workers_ready()
    stream = client.chat.completions.with_streaming_response.create(
        **{**REQUEST, "max_tokens": 500, "stream": True}
    )
    with stream as response:
        job_id = response.headers["x-failsoft-job"]
        for index, _ in enumerate(response.iter_lines()):
            if index > 6:
                break
    closed = time.monotonic()
    wait_until(lambda: job_state(svc, job_id)["state"] == "cancelled", timeout=10, what="job cancelled")
    wait_until(lambda: svc.status()["workers"]["gpu"]["in_flight"] == 0, timeout=10, what="GPU slot free")
    print(f"cancelled and the GPU slot freed {time.monotonic() - closed:.3f}s after the client closed")
    stored = job_state(svc, job_id)
    assert stored["attempts"] == 1  # cancelled jobs are never replayed
    # The worker stopped generating: a new request is served right away.
    assert client.chat.completions.create(**{**REQUEST, "max_tokens": 2}).choices


def test_non_streamed_client_timeout_cancels_the_job(svc: ServiceHandle) -> None:
    svc.wait_workers_ready()
    impatient = client_for(svc, timeout=1.0)
    with pytest.raises(openai.APITimeoutError):
        impatient.completions.create(**COUNTING, max_tokens=800)  # type: ignore[call-overload]
    cancelled = wait_until(
        lambda: [
            j
            for j in httpx.get(svc.base_url + "/failsoft/jobs?state=cancelled", headers=svc.headers()).json()[
                "data"
            ]
            if j["attempts"] == 1
        ],
        timeout=10,
        what="a cancelled job",
    )
    assert cancelled
    wait_until(lambda: svc.status()["workers"]["gpu"]["in_flight"] == 0, timeout=10, what="GPU slot free")


def test_failover_events_reach_the_tray(svc: ServiceHandle, client: openai.OpenAI) -> None:
    armed = arm(svc, "abort", after_tokens=2)
    job_id = failsoft_of(client.chat.completions.create(**REQUEST))["job_id"]
    seen: dict[str, dict[str, Any]] = {}
    with httpx.stream("GET", svc.base_url + "/failsoft/events?history=1", timeout=10) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event.get("job_id") == job_id or event["type"] in ("worker_unhealthy", "worker_restarted"):
                    seen[event["type"]] = event
            if {"fallback_started", "fallback_completed", "worker_unhealthy", "worker_restarted"} <= set(
                seen
            ):
                break
    assert seen["fallback_started"]["reason"] == "crash_abort"
    assert seen["fallback_completed"]["seconds"] > 0
    assert seen["worker_unhealthy"]["role"] == "gpu"
    wait_replaced(svc, armed["pid"])


@pytest.mark.parametrize("kind", ["abort", "kill"])
def test_a_crash_with_four_streams_in_flight_decides_each_job_once(
    svc: ServiceHandle, client: openai.OpenAI, kind: str
) -> None:
    """Four streams share the GPU worker's slots when it dies: each job fails over on its own, exactly once,
    and every stream ends with a whole answer from the CPU."""
    assert svc.wait_workers_ready()["workers"]["gpu"]["slots"] >= 4
    topics = ("the sea", "a mountain", "a forest", "the moon")
    started = threading.Barrier(len(topics) + 1)
    results: dict[int, dict[str, Any]] = {}

    def stream(index: int) -> None:
        request = {
            "model": "default",
            "messages": [{"role": "user", "content": f"Write a long story about {topics[index]}."}],
            "max_tokens": 48,
            "temperature": 0,
        }
        text, info, waited = "", {}, False
        for chunk in client.chat.completions.create(**request, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
                if not waited:
                    waited = True
                    started.wait(timeout=60)  # every stream has text before the fault is armed
            info = (chunk.model_extra or {}).get("failsoft") or info
        results[index] = {"text": text, "info": info}

    threads = [threading.Thread(target=stream, args=(index,)) for index in range(len(topics))]
    for thread in threads:
        thread.start()
    started.wait(timeout=60)
    in_flight = svc.status()["workers"]["gpu"]["in_flight"]
    armed = arm(svc, kind, after_tokens=1)  # the next token the router relays from the GPU
    for thread in threads:
        thread.join(timeout=120)
    assert in_flight == len(topics)  # all four were on the GPU worker when it died
    assert sorted(results) == list(range(len(topics)))
    job_ids = [result["info"]["job_id"] for result in results.values()]
    assert len(set(job_ids)) == len(topics)
    reason = "crash_abort" if kind == "abort" else "killed"
    for result in results.values():
        info = result["info"]
        assert (info["worker"], info["attempts"], info["fallback_reason"]) == ("cpu", 2, reason), info
        stored = job_state(svc, info["job_id"])
        assert stored["state"] == "completed"
        assert [(a["worker"], a["outcome"]) for a in stored["attempt_log"]] == [
            ("gpu", "failed"),
            ("cpu", "completed"),
        ]
        assert result["text"]
    wait_replaced(svc, armed["pid"])
