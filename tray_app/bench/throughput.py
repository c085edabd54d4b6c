"""Throughput under concurrent clients: through Failsoft's router against the same llama-server process
asked directly, interleaved in one run so both see the same machine.

Each client sends its requests one after another (distinct prompts, the same ones on both paths of a round,
with the prompt cache off), every answer exactly `max_tokens` long (`ignore_eos`); a level's figure is all
tokens received over the wall time from the first request to the last answer. Rounds alternate which path
goes first. The ratio is paired the same way: the median over rounds of the router's tokens per second
over the worker's in that round, with its 95 % interval (intervals.median_interval).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from tray_app.bench.intervals import median_interval
from tray_app.bench.measure import WORKER_STREAM_HEADERS, prompt

LEVELS = (1, 4, 8)
PATH = "/v1/chat/completions"


@dataclass
class Run:
    tokens: int = 0
    seconds: float = 0.0
    first_token: list[float] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


async def _one(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str], run: Run
) -> None:
    started = time.perf_counter()
    first = True
    async with http.stream("POST", url, json=body, headers=headers) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                run.tokens += 1
                if first:
                    first = False
                    run.first_token.append(time.perf_counter() - started)


async def _level(
    http: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    clients: int,
    requests_per_client: int,
    max_tokens: int,
    offset: int,
) -> Run:
    run = Run()

    async def client(number: int) -> None:
        for index in range(requests_per_client):
            body: dict[str, Any] = {
                "model": "default",
                "messages": prompt(offset + number * requests_per_client + index),
                "max_tokens": max_tokens,
                "temperature": 0.7,
                "seed": number,
                "stream": True,
                "ignore_eos": True,
                "cache_prompt": False,  # both paths read their prompts whole: neither finds the other's
            }
            await _one(http, url, body, headers, run)

    started = time.perf_counter()
    await asyncio.gather(*(client(number) for number in range(clients)))
    run.seconds = time.perf_counter() - started
    return run


def _median_ms(values: list[float]) -> float | None:
    return round(statistics.median(values) * 1000, 2) if values else None


def round_ratios(direct: list[Run], routed: list[Run]) -> list[float]:
    """Per round, the router's tokens per second over the worker's on the same prompts."""
    return [
        r.tokens_per_second / d.tokens_per_second
        for d, r in zip(direct, routed, strict=True)
        if d.tokens_per_second > 0
    ]


def _round_differences(direct: list[Run], routed: list[Run]) -> float | None:
    """The median over rounds of (the router's TTFT p50 - the worker's TTFT p50) in that round, in ms."""
    pairs = [
        (statistics.median(d.first_token), statistics.median(r.first_token))
        for d, r in zip(direct, routed, strict=True)
        if d.first_token and r.first_token
    ]
    if not pairs:
        return None
    return round(statistics.median(routed - direct for direct, routed in pairs) * 1000.0, 2)


async def throughput_figures(
    router_url: str,
    worker_url: str,
    worker_headers: dict[str, str],
    *,
    levels: tuple[int, ...] = LEVELS,
    rounds: int = 2,
    requests_per_client: int = 2,
    max_tokens: int = 64,
) -> dict[str, Any]:
    """Aggregate tokens per second at each number of concurrent clients, router vs direct, as ratios."""
    # llama-server closes a connection idle for 5 s; drop ours first rather than reuse a closed one.
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=600, trust_env=False, limits=limits) as http:
        warm = {"messages": prompt(0), "max_tokens": 4, "stream": True}
        direct_headers = {**worker_headers, **WORKER_STREAM_HEADERS}
        await _one(http, worker_url + PATH, dict(warm), direct_headers, Run())
        await _one(http, router_url + PATH, dict(warm), worker_headers, Run())
        results = []
        offset = 1
        for clients in levels:
            direct_runs: list[Run] = []
            routed_runs: list[Run] = []
            for number in range(rounds):
                order = ("direct", "router") if number % 2 == 0 else ("router", "direct")
                for path in order:  # the same prompts on both paths, so their lengths do not differ
                    url = (worker_url if path == "direct" else router_url) + PATH
                    headers = direct_headers if path == "direct" else worker_headers
                    run = await _level(http, url, headers, clients, requests_per_client, max_tokens, offset)
                    (direct_runs if path == "direct" else routed_runs).append(run)
                offset += clients * requests_per_client
            direct_tps = statistics.median(r.tokens_per_second for r in direct_runs)
            routed_tps = statistics.median(r.tokens_per_second for r in routed_runs)
            ratios = round_ratios(direct_runs, routed_runs)
            interval = median_interval(ratios)
            results.append(
                {
                    "clients": clients,
                    "direct_tokens_per_second": round(direct_tps, 2),
                    "router_tokens_per_second": round(routed_tps, 2),
                    # Paired by round, as the time to first token below: a slow round on one side
                    # does not move the other side's figure.
                    "ratio": round(statistics.median(ratios), 3) if ratios else None,
                    "ratio_interval": [round(end, 3) for end in interval] if interval else None,
                    "direct_ttft_p50_ms": _median_ms([t for r in direct_runs for t in r.first_token]),
                    "router_ttft_p50_ms": _median_ms([t for r in routed_runs for t in r.first_token]),
                    # Paired by round (the same prompts, one right after the other): a slow round on one
                    # side does not count twice.
                    "ttft_added_p50_ms": _round_differences(direct_runs, routed_runs),
                }
            )
    return {
        "rounds": rounds,
        "requests_per_client": requests_per_client,
        "max_tokens": max_tokens,
        "levels": results,
    }
