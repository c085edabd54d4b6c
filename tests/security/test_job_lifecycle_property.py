"""Issue 14's property test: random sequences of submit / approve / reject / cancel / client disconnect /
worker kill against a real `failsoft serve` (real llama.cpp workers, real HTTP). Whatever the order, every
job ends in exactly one terminal state (so at most one completion), and no client receives a tool call
twice for one request.

The CPU is declared slow (2 tokens/s) and interactive requests carry a short deadline, so a GPU failure or
a request routed to the CPU goes through the approval queue: approvals and rejections race with
cancellations, disconnects and kills."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.helpers import CHAT, base_settings
from tests.support.service import ServiceHandle, running_service
from tests.support.tools import ADD_TOOL, FORCE_ADD
from tray_app.contract.vocabulary import UNFINISHED_JOB_STATES
from tray_app.jobs.registry import FINAL_STATES

pytestmark = pytest.mark.integration

SETTINGS = base_settings(failover={"cpu_tokens_per_second": 2.0})
DEADLINE = {"X-Failsoft-Deadline": "6"}  # a CPU run (about 13 s estimated) needs approval
UNFINISHED = UNFINISHED_JOB_STATES
SUBMIT = ("chat", "stream", "stream_leave", "background", "tool_stream")
CONTROL = ("approve", "reject", "cancel", "kill_gpu", "pause")
OPERATIONS = st.lists(
    st.tuples(st.sampled_from(SUBMIT + CONTROL), st.integers(0, 7)), min_size=6, max_size=14
)


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceHandle]:
    root = tmp_path_factory.mktemp("lifecycle")
    with running_service(Path(root), enable_faults=True, settings=SETTINGS) as handle:
        yield handle


@dataclass
class Observed:
    """What the clients and the event stream saw during one sequence."""

    final_events: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    created: set[str] = field(default_factory=set)
    tool_calls: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    tool_requests: int = 0


async def read_events(http: httpx.AsyncClient, seen: Observed, connected: asyncio.Event) -> None:
    async with http.stream("GET", "/failsoft/events", timeout=None) as response:
        async for line in response.aiter_lines():
            connected.set()
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event.get("type") != "job_state":
                continue
            seen.created.add(event["job_id"])
            if event["state"] in FINAL_STATES:
                seen.final_events[event["job_id"]].append(event["state"])


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": "default", "messages": CHAT, "max_tokens": 24, "temperature": 0, **extra}


async def submit(http: httpx.AsyncClient, kind: str, seen: Observed) -> None:
    """One client request; whatever answer it gets is fine here, the invariants are checked at the end."""
    if kind == "background":
        await http.post("/v1/jobs", json=chat_body(max_tokens=8))
        return
    if kind == "chat":
        await http.post("/v1/chat/completions", json=chat_body(), headers=DEADLINE)
        return
    body = chat_body(stream=True)
    if kind == "tool_stream":
        seen.tool_requests += 1
        body.update(tools=[ADD_TOOL], tool_choice=FORCE_ADD, max_tokens=60)
    async with http.stream("POST", "/v1/chat/completions", json=body, headers=DEADLINE) as response:
        job = response.headers.get("x-failsoft-job", "")
        chunks = 0
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunks += 1
            if kind == "stream_leave" and chunks == 2:
                return  # the client goes away mid-stream
            for choice in json.loads(line[6:]).get("choices") or []:
                for call in (choice.get("delta") or {}).get("tool_calls") or []:
                    if call.get("id"):  # a new call starts: the client would run it once complete
                        seen.tool_calls[job].add(call["id"])


async def live_jobs(http: httpx.AsyncClient, state: str | None = None) -> list[str]:
    params = {"state": state} if state else {}
    jobs = (await http.get("/failsoft/jobs", params=params)).json()["data"]
    return [job["id"] for job in jobs if job["state"] in UNFINISHED]


async def control(http: httpx.AsyncClient, action: str, pick: int) -> None:
    if action == "pause":
        await asyncio.sleep(0.3 * (pick + 1))
        return
    if action == "kill_gpu":
        await http.post("/failsoft/debug/faults", json={"kind": "kill", "after_tokens": 0})
        return
    candidates = await live_jobs(http, "awaiting_approval" if action != "cancel" else None)
    if not candidates:
        return
    job = candidates[pick % len(candidates)]
    if action == "cancel":
        await http.delete(f"/v1/jobs/{job}")
    else:
        await http.post(f"/failsoft/jobs/{job}/{action}")


async def settle(http: httpx.AsyncClient, seen: Observed, timeout: float = 120.0) -> None:
    """Approve whatever still waits for the user, then wait until every job of this sequence ended."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        await http.post("/failsoft/jobs/approve-all")
        pending = set(await live_jobs(http)) & seen.created
        if not pending and all(seen.final_events.get(job) for job in seen.created):
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"jobs still unfinished after {timeout:.0f} s: {sorted(pending)}")


async def run_sequence(svc: ServiceHandle, operations: list[tuple[str, int]]) -> Observed:
    seen = Observed()
    timeout = httpx.Timeout(180.0, connect=10.0)
    async with httpx.AsyncClient(
        base_url=svc.base_url, timeout=timeout, trust_env=False, headers=svc.headers()
    ) as http:
        await asyncio.to_thread(svc.wait_workers_ready)
        connected = asyncio.Event()
        reader = asyncio.create_task(read_events(http, seen, connected))
        await asyncio.wait_for(connected.wait(), 10)
        clients: list[asyncio.Task[None]] = []
        for action, pick in operations:
            if action in SUBMIT:
                clients.append(asyncio.create_task(submit(http, action, seen)))
                await asyncio.sleep(0.05)
            else:
                await control(http, action, pick)
        results = await asyncio.gather(*clients, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException) and not isinstance(r, httpx.HTTPError)]
        assert not errors, errors
        await settle(http, seen)
        await asyncio.sleep(0.5)  # a second final event, if there were one, would arrive now
        reader.cancel()
        states = {job: (await http.get(f"/v1/jobs/{job}")).json().get("state") for job in seen.created}
    for job in seen.created:
        finals = seen.final_events.get(job, [])
        assert len(finals) == 1, f"job {job} ended {len(finals)} times: {finals}"
        assert states[job] == finals[0], f"job {job}: event said {finals[0]}, /v1/jobs says {states[job]}"
    for job, calls in seen.tool_calls.items():
        assert len(calls) <= 1, f"job {job} delivered {len(calls)} tool calls to one request: {calls}"
    return seen


@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,  # the same sequences in every run, CI included
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(operations=OPERATIONS)
def test_every_job_ends_once_whatever_happens_around_it(
    svc: ServiceHandle, operations: list[tuple[str, int]]
) -> None:
    seen = asyncio.run(run_sequence(svc, operations))
    submitted = sum(1 for action, _ in operations if action in SUBMIT)
    assert len(seen.created) == submitted, "every request made exactly one job"
    print(
        f"\n{[action for action, _ in operations]}: {len(seen.created)} jobs: "
        + ", ".join(
            f"{state} {sum(1 for f in seen.final_events.values() if f == [state])}"
            for state in sorted(FINAL_STATES)
        )
    )
