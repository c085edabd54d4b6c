"""The chaos mix: concurrent requests in every dialect, background jobs and embeddings, with misbehaving
clients among them, while the GPU worker is killed and hung at intervals. The chaos test
(tests/server/test_chaos.py) and `failsoft drill --soak` both run it; `invariants` judges what it left.

Bounded in count and time: at most `requests` requests, none started after `seconds`, each given up after
`request_timeout`; every loop stops by itself. It talks to 127.0.0.1 only (the slow readers' and
non-readers' raw sockets connect to the base URL's host and port)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from tray_app.drill import chaos_misbehaving as misbehaving
from tray_app.drill import chaos_requests as requests
from tray_app.drill.bodies import PROMPT_ALLOWANCE
from tray_app.drill.chaos_faults import FaultTally, inject_faults
from tray_app.drill.chaos_records import Sent
from tray_app.drill.client import ServiceClient

LOOPBACK = ("127.0.0.1", "localhost")
SPEED_WAIT = 90.0
# Kind -> share of the mix: well-behaved clients of every dialect, and misbehaving ones among them.
WEIGHTS: Mapping[str, int] = {
    "openai_stream": 4,
    "openai_tool_stream": 2,
    "openai_tool": 1,
    "ollama_stream": 2,
    "anthropic_stream": 2,
    "job": 2,
    "embedding": 1,
    "leaver": 2,
    "slow_reader": 1,
    "slow_leaver": 1,
    "non_reader": 2,
    "engine_field": 2,
}


@dataclass(frozen=True)
class MixPlan:
    requests: int = 60
    clients: int = 6  # more than the GPU worker's slots: they are full most of the time
    seconds: float = 300.0  # no request starts after this
    request_timeout: float = 240.0
    fault_every: tuple[float, float] = (3.0, 6.0)  # seconds between faults (a random pause in this range)
    slow_hold: float = 20.0  # a slow reader reads nothing this long: past the router's 15 s stall limit
    slow_tokens: int = 0  # a slow reader's max_tokens; 0: as many as the GPU worker's slot takes
    seed: int = 1
    weights: Mapping[str, int] = field(default_factory=lambda: dict(WEIGHTS))


@dataclass
class MixResult:
    plan: MixPlan
    sents: list[Sent]
    faults: FaultTally
    seconds: float
    gpu_restarts: int  # during the mix, as /failsoft/status counts them
    started: Counter[str] = field(default_factory=Counter)  # requests started, by planned kind


Kind = Callable[[ServiceClient, MixPlan], Awaitable[list[Sent]]]


def _own_headers(client: ServiceClient) -> dict[str, str]:
    """What a client sends on its own socket: the API key (if any) and the deadline, not the admin token."""
    return {
        name: value
        for name, value in client.http.headers.items()
        if name.lower() in ("authorization", "x-failsoft-deadline")
    }


def _slow(client: ServiceClient, hold: float, plan: MixPlan) -> Awaitable[list[Sent]]:
    return misbehaving.slow_reader(
        client.base_url, _own_headers(client), hold, plan.request_timeout, plan.slow_tokens
    )


def _non_reader(client: ServiceClient, plan: MixPlan) -> Awaitable[list[Sent]]:
    return misbehaving.non_reader(
        client.http, client.base_url, _own_headers(client), plan.request_timeout, plan.slow_tokens
    )


KINDS: Mapping[str, Kind] = {
    "openai_stream": lambda client, plan: requests.openai_stream(client.http),
    "openai_tool_stream": lambda client, plan: requests.openai_stream(client.http, tool=True),
    "openai_tool": lambda client, plan: requests.openai_tool(client.http),
    "ollama_stream": lambda client, plan: requests.ollama_stream(client.http),
    "anthropic_stream": lambda client, plan: requests.anthropic_stream(client.http),
    "job": lambda client, plan: requests.background_job(client.http, plan.request_timeout),
    "embedding": lambda client, plan: requests.embedding(client.http),
    "leaver": lambda client, plan: misbehaving.leaver(client.http),
    "slow_reader": lambda client, plan: _slow(client, plan.slow_hold, plan),
    "slow_leaver": lambda client, plan: _slow(client, misbehaving.BRIEF_PAUSE, plan),
    "non_reader": _non_reader,
    "engine_field": lambda client, plan: misbehaving.engine_field(client.http),
}


def planned_kinds(plan: MixPlan) -> list[str]:
    """`plan.requests` kinds in a shuffled order: each kind of the weights at least once (when there is
    room), the rest drawn by weight; the same plan gives the same list."""
    chooser = random.Random(plan.seed)
    unknown = set(plan.weights) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown request kinds {sorted(unknown)}; kinds are {', '.join(KINDS)}")
    names = [name for name, weight in plan.weights.items() if weight > 0]
    kinds = names[: plan.requests]
    weights = [plan.weights[name] for name in names]
    kinds += chooser.choices(names, weights, k=max(plan.requests - len(kinds), 0))
    chooser.shuffle(kinds)
    return kinds


def check_loopback(base_url: str) -> None:
    host = urlsplit(base_url).hostname or ""
    if host not in LOOPBACK:
        raise ValueError(f"the chaos mix runs against this machine only (127.0.0.1), not {host!r}")


async def _one(client: ServiceClient, plan: MixPlan, kind: str) -> list[Sent]:
    try:
        return await asyncio.wait_for(KINDS[kind](client, plan), plan.request_timeout)
    except TimeoutError:
        return [Sent(kind, outcome="lost", detail=f"no end within {plan.request_timeout:.0f}s")]


async def _client_loop(
    client: ServiceClient, plan: MixPlan, work: Iterator[str], deadline: float, result: MixResult
) -> None:
    while time.monotonic() < deadline and (kind := next(work, None)) is not None:
        result.started[kind] += 1
        result.sents.extend(await _one(client, plan, kind))


async def _gpu_restarts(client: ServiceClient) -> int:
    status = await client.status()
    return int((status.get("workers") or {}).get("gpu", {}).get("restarts") or 0)


def _cpu_measured(client: ServiceClient) -> Callable[[], Awaitable[bool]]:
    """Whether the service knows the CPU worker's speed: until it does, every failover waits for approval."""

    async def measured() -> bool:
        status = await client.status()
        return float((status.get("policy") or {}).get("cpu_tokens_per_second") or 0) > 0

    return measured


async def _sized(client: ServiceClient, plan: MixPlan) -> MixPlan:
    """`plan` with its slow readers' answer as long as the GPU worker's slot allows (up to SLOW_TOKENS)."""
    if plan.slow_tokens:
        return plan
    per_seq = int(((await client.status()).get("caps") or {}).get("n_ctx_per_seq") or 0)
    return replace(plan, slow_tokens=max(min(misbehaving.SLOW_TOKENS, per_seq - PROMPT_ALLOWANCE), 32))


async def run_mix(client: ServiceClient, plan: MixPlan) -> MixResult:
    """Run the mix once against the service `client` talks to (both workers ready first: DrillError if
    they are not within two minutes). Whether they are ready again after it is `observe`'s to find."""
    check_loopback(client.base_url)
    await client.wait_ready()
    await client.wait_for(_cpu_measured(client), "the CPU worker's measured speed", SPEED_WAIT, 0.2)
    plan = await _sized(client, plan)
    restarts = await _gpu_restarts(client)
    started = time.monotonic()
    work = iter(planned_kinds(plan))
    result = MixResult(plan, [], FaultTally(), 0.0, 0)
    stop = asyncio.Event()
    faults = asyncio.create_task(inject_faults(client.http, stop, plan.fault_every, random.Random(plan.seed)))
    try:
        loops = [
            _client_loop(client, plan, work, started + plan.seconds, result) for _ in range(plan.clients)
        ]
        await asyncio.gather(*loops)
    finally:
        stop.set()
        result.faults = await faults
    result.seconds = time.monotonic() - started
    result.gpu_restarts = await _gpu_restarts(client) - restarts
    return result
