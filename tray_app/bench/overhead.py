"""Router overhead: the same requests sent straight to a worker and through the router, interleaved, so
both see the same machine. Returns figures (milliseconds) and what the router adds.

`added_ms` is the median of the per-round differences (router minus direct, one pair per round), which
cancels most of the drift a generation's own time has from one round to the next; p99 and the chunk gap
are compared as whole distributions. `added_interval_ms` gives each paired median its 95 % interval (see
intervals.median_interval): how much of a figure is the machine's noise.

The router always streams from the worker (it needs every token to detect a stalled worker and to cancel
at once), so a non-streamed request through it costs the worker its streaming; `router_own_ms` separates
that: the router's non-streamed answer against the worker's own streamed total, the same work upstream.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

from tray_app.bench.intervals import median_interval
from tray_app.contract.status import PathTiming
from tray_app.jobs.path_timing import summary

PROMPT = [{"role": "user", "content": "Name three colours."}]
CHAT_PATH = "/v1/chat/completions"


@dataclass
class Samples:
    latency: list[float] = field(default_factory=list)  # non-streamed, whole request
    first_token: list[float] = field(default_factory=list)  # streamed, time to the first content chunk
    stream_total: list[float] = field(default_factory=list)  # streamed, until the end of the response
    gaps: list[float] = field(default_factory=list)  # streamed, time between content chunks


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(round(fraction * (len(ordered) - 1)), len(ordered) - 1)
    return ordered[index]


def _plain(client: httpx.Client, url: str, body: dict[str, Any], samples: Samples) -> None:
    started = time.perf_counter()
    response = client.post(url, json=body)
    response.raise_for_status()
    samples.latency.append(time.perf_counter() - started)


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
    samples.stream_total.append(time.perf_counter() - started)


def _summary(samples: Samples) -> dict[str, float]:
    ms = 1000.0
    return {
        "p50_ms": statistics.median(samples.latency) * ms,
        "p99_ms": _percentile(samples.latency, 0.99) * ms,
        "ttft_p50_ms": statistics.median(samples.first_token) * ms,
        "stream_total_p50_ms": statistics.median(samples.stream_total) * ms,
        "gap_mean_ms": statistics.fmean(samples.gaps) * ms if samples.gaps else 0.0,
    }


def _differences_ms(router: list[float], direct: list[float]) -> list[float]:
    return [(r - d) * 1000.0 for r, d in zip(router, direct, strict=True)]


def _paired(router: list[float], direct: list[float]) -> float:
    return statistics.median(_differences_ms(router, direct))


def _paired_interval(router: list[float], direct: list[float]) -> list[float] | None:
    interval = median_interval(_differences_ms(router, direct))
    return list(interval) if interval is not None else None


def _cpu_seconds(process: psutil.Process | None) -> float:
    if process is None:
        return 0.0
    times = process.cpu_times()
    return float(times.user + times.system)


def measure_overhead(
    router_url: str,
    worker_url: str,
    rounds: int = 40,
    max_tokens: int = 8,
    headers: dict[str, str] | None = None,
    router_pid: int | None = None,
    own_time: bool = False,
) -> dict[str, Any]:
    """Send `rounds` identical requests to the worker (`worker_url`) and to the router (`router_url`),
    alternating, non-streamed and streamed; return both sets of figures and the router's additions. With
    `router_pid`, also the router process's CPU time per routed request (its background work included);
    with `own_time`, the router's own record of its time on the streams' way to their first token."""
    body = {"messages": PROMPT, "max_tokens": max_tokens, "temperature": 0, "seed": 1}
    direct, routed = Samples(), Samples()
    router_process = psutil.Process(router_pid) if router_pid else None
    router_cpu = 0.0
    # keepalive_expiry: shorter than llama-server's 5 s, so a connection it closed is never reused.
    limits = httpx.Limits(keepalive_expiry=2.0)
    with httpx.Client(timeout=120, trust_env=False, headers=headers or {}, limits=limits) as client:
        for url in (worker_url, router_url):  # warm both paths (connections, caches) before measuring
            _both_kinds(client, url, body, Samples())
        recorded = router_timing(router_url) if own_time else None
        for _ in range(rounds):
            _both_kinds(client, worker_url, body, direct)
            before = _cpu_seconds(router_process)
            _both_kinds(client, router_url, body, routed)
            router_cpu += _cpu_seconds(router_process) - before
    own = own_time_since(router_url, recorded) if recorded is not None else None
    return {
        "rounds": rounds,
        "max_tokens": max_tokens,
        **_compared(direct, routed),
        "router_cpu_ms_per_request": (router_cpu / (2 * rounds) * 1000.0) if router_process else None,
        "own_ms": own,
    }


def _both_kinds(client: httpx.Client, base_url: str, body: dict[str, Any], samples: Samples) -> None:
    """One chat request to `base_url` non-streamed, then the same streamed."""
    _plain(client, base_url + CHAT_PATH, body, samples)
    _streamed(client, base_url + CHAT_PATH, body, samples)


def _compared(direct: Samples, routed: Samples) -> dict[str, Any]:
    """Both sides' figures and what the router adds: paired medians (with their intervals) where the rounds
    pair up, whole distributions for p99 and the chunk gap."""
    a, b = _summary(direct), _summary(routed)
    return {
        "direct": a,
        "router": b,
        "added_ms": {
            "p50_ms": _paired(routed.latency, direct.latency),
            "p99_ms": b["p99_ms"] - a["p99_ms"],
            "ttft_p50_ms": _paired(routed.first_token, direct.first_token),
            "stream_total_p50_ms": _paired(routed.stream_total, direct.stream_total),
            "gap_mean_ms": b["gap_mean_ms"] - a["gap_mean_ms"],
        },
        "added_interval_ms": {
            "p50_ms": _paired_interval(routed.latency, direct.latency),
            "ttft_p50_ms": _paired_interval(routed.first_token, direct.first_token),
            "stream_total_p50_ms": _paired_interval(routed.stream_total, direct.stream_total),
        },
        "ratio": {key: (b[key] / a[key] if a[key] else 0.0) for key in a},
        "router_own_ms": _paired(routed.latency, direct.stream_total),
    }


def router_timing(router_url: str) -> PathTiming:
    """The router's own record of its recent streams' way to their first token (`GET /failsoft/timing`)."""
    with httpx.Client(timeout=30, trust_env=False) as client:
        response = client.get(router_url + "/failsoft/timing")
        response.raise_for_status()
        timing: PathTiming = response.json()
        return timing


def own_time_since(router_url: str, before: PathTiming) -> dict[str, Any]:
    """The medians of the router's own time for the streams it recorded since `before` (None where it
    recorded none): what its code took of the time to first token measured from outside."""
    after = router_timing(router_url)
    count = min(after["recorded"] - before["recorded"], len(after["recent_ms"]))
    figures = dict(summary(after["recorded"], after["recent_ms"][-count:] if count > 0 else []))
    figures.pop("recent_ms")
    figures.pop("recorded")
    return figures
