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


@dataclass(frozen=True)
class Target:
    """A server to measure: its OpenAI base URL (without /v1), the headers it wants, and the model to ask."""

    base_url: str
    headers: dict[str, str]
    model: str = "default"
    # llama-server's prompt cache off, so that of two paths to one llama-server neither finds the other's
    # prompts; a comparison between two servers leaves each its own default.
    cache_prompt: bool | None = False


async def _level(
    http: httpx.AsyncClient,
    target: Target,
    clients: int,
    requests_per_client: int,
    max_tokens: int,
    offset: int,
) -> Run:
    run = Run()

    async def client(number: int) -> None:
        for index in range(requests_per_client):
            body: dict[str, Any] = {
                "model": target.model,
                "messages": prompt(offset + number * requests_per_client + index),
                "max_tokens": max_tokens,
                "temperature": 0.7,
                "seed": number,
                "stream": True,
                "ignore_eos": True,
            }
            if target.cache_prompt is not None:
                body["cache_prompt"] = target.cache_prompt
            await _one(http, target.base_url + PATH, body, target.headers, run)

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


def round_differences(direct: list[Run], routed: list[Run]) -> list[float]:
    """Per round, the router's TTFT p50 minus the worker's TTFT p50 in that round, in ms."""
    return [
        (statistics.median(r.first_token) - statistics.median(d.first_token)) * 1000.0
        for d, r in zip(direct, routed, strict=True)
        if d.first_token and r.first_token
    ]


async def paired_levels(
    base: Target,
    measured: Target,
    *,
    levels: tuple[int, ...],
    rounds: int,
    requests_per_client: int,
    max_tokens: int,
) -> list[tuple[int, list[Run], list[Run]]]:
    """At each number of concurrent clients, `rounds` runs on each target, interleaved (the same prompts on
    both in a round, so their lengths do not differ; each round switches which goes first)."""
    # llama-server closes a connection idle for 5 s; drop ours first rather than reuse a closed one.
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=600, trust_env=False, limits=limits) as http:
        for target in (base, measured):
            warm = {"model": target.model, "messages": prompt(0), "max_tokens": 4, "stream": True}
            await _one(http, target.base_url + PATH, warm, target.headers, Run())
        results = []
        offset = 1
        for clients in levels:
            base_runs: list[Run] = []
            measured_runs: list[Run] = []
            sides = ((base, base_runs), (measured, measured_runs))
            for number in range(rounds):
                for target, runs in sides if number % 2 == 0 else sides[::-1]:
                    runs.append(await _level(http, target, clients, requests_per_client, max_tokens, offset))
                offset += clients * requests_per_client
            results.append((clients, base_runs, measured_runs))
    return results


def level_figures(
    clients: int, base_runs: list[Run], measured_runs: list[Run], names: tuple[str, str]
) -> dict[str, Any]:
    """One level's figures: each side's tokens per second and TTFT, keyed by its name, and the measured side
    over the base as the median of the rounds' ratios with its 95 % interval."""
    base, measured = names
    ratios = round_ratios(base_runs, measured_runs)
    interval = median_interval(ratios)
    added = round_differences(base_runs, measured_runs)
    added_interval = median_interval(added)
    return {
        "clients": clients,
        f"{base}_tokens_per_second": round(statistics.median(r.tokens_per_second for r in base_runs), 2),
        f"{measured}_tokens_per_second": round(
            statistics.median(r.tokens_per_second for r in measured_runs), 2
        ),
        # Paired by round: a slow round on one side does not move the other side's figure.
        "ratio": round(statistics.median(ratios), 3) if ratios else None,
        "ratio_interval": [round(end, 3) for end in interval] if interval else None,
        f"{base}_ttft_p50_ms": _median_ms([t for r in base_runs for t in r.first_token]),
        f"{measured}_ttft_p50_ms": _median_ms([t for r in measured_runs for t in r.first_token]),
        "ttft_added_p50_ms": round(statistics.median(added), 2) if added else None,
        "ttft_added_interval_ms": [round(end, 2) for end in added_interval] if added_interval else None,
    }


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
    direct = Target(worker_url, {**worker_headers, **WORKER_STREAM_HEADERS})
    router = Target(router_url, worker_headers)
    measured = await paired_levels(
        direct,
        router,
        levels=levels,
        rounds=rounds,
        requests_per_client=requests_per_client,
        max_tokens=max_tokens,
    )
    return {
        "rounds": rounds,
        "requests_per_client": requests_per_client,
        "max_tokens": max_tokens,
        "levels": [level_figures(c, d, r, ("direct", "router")) for c, d, r in measured],
    }
