"""Router overhead: the same requests sent straight to a worker and through the router, interleaved, so
both see the same machine. Returns figures (milliseconds) and the router-minus-direct differences."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

IDLE_SAMPLE_SECONDS = 3.0
PROMPT = [{"role": "user", "content": "Name three colours."}]


@dataclass
class Samples:
    latency: list[float] = field(default_factory=list)  # non-streamed, whole request
    first_token: list[float] = field(default_factory=list)  # streamed, time to the first content chunk
    gaps: list[float] = field(default_factory=list)  # streamed, time between content chunks


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(round(fraction * (len(ordered) - 1)), len(ordered) - 1)
    return ordered[index]


def _plain(client: httpx.Client, url: str, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    response = client.post(url, json=body)
    response.raise_for_status()
    return time.perf_counter() - started


def _streamed(client: httpx.Client, url: str, body: dict[str, Any], samples: Samples) -> None:
    started = time.perf_counter()
    last: float | None = None
    with client.stream("POST", url, json={**body, "stream": True}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or []
            if not choices or not (choices[0].get("delta") or {}).get("content"):
                continue
            now = time.perf_counter()
            if last is None:
                samples.first_token.append(now - started)
            else:
                samples.gaps.append(now - last)
            last = now


def _summary(samples: Samples) -> dict[str, float]:
    ms = 1000.0
    return {
        "p50_ms": statistics.median(samples.latency) * ms,
        "p99_ms": _percentile(samples.latency, 0.99) * ms,
        "ttft_p50_ms": statistics.median(samples.first_token) * ms,
        "gap_mean_ms": statistics.fmean(samples.gaps) * ms if samples.gaps else 0.0,
    }


def measure_overhead(
    router_url: str,
    worker_url: str,
    rounds: int = 40,
    max_tokens: int = 16,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Send `rounds` identical requests to the worker (`worker_url`) and to the router (`router_url`),
    alternating, non-streamed and streamed; return both sets of figures and the router's additions."""
    body = {"messages": PROMPT, "max_tokens": max_tokens, "temperature": 0, "seed": 1}
    direct, routed = Samples(), Samples()
    path = "/v1/chat/completions"
    with httpx.Client(timeout=120, trust_env=False, headers=headers or {}) as client:
        for url in (worker_url, router_url):  # warm both paths (connections, caches) before measuring
            _plain(client, url + path, body)
        for _ in range(rounds):
            direct.latency.append(_plain(client, worker_url + path, body))
            routed.latency.append(_plain(client, router_url + path, body))
            _streamed(client, worker_url + path, body, direct)
            _streamed(client, router_url + path, body, routed)
    a, b = _summary(direct), _summary(routed)
    return {
        "rounds": rounds,
        "max_tokens": max_tokens,
        "direct": a,
        "router": b,
        "added_ms": {key: b[key] - a[key] for key in a},
        "ratio": {key: (b[key] / a[key] if a[key] else 0.0) for key in a},
    }
