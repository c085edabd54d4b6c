"""Router overhead: the same requests sent straight to a worker and through the router, interleaved, so
both see the same machine. Returns figures (milliseconds) and the router-minus-direct differences."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

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


def measure_service_overhead(
    rounds: int = 40, simulate_vram: str = "4GiB", timeout: float = 120.0
) -> dict[str, Any]:
    """Start `failsoft serve` as its own process (simulated GPU, a free port; so the measuring client never
    shares an interpreter with the router), measure against its GPU worker, then stop it."""
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    command = [
        sys.executable,
        "-m",
        "tray_app",
        "serve",
        "--port",
        str(port),
        "--simulate-vram",
        simulate_vram,
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}"
    try:
        worker_url = _wait_for_workers(base_url, process, timeout)
        router = psutil.Process(process.pid)
        idle_rate = _cpu_rate(router, IDLE_SAMPLE_SECONDS)  # health probes and timers, no requests
        before, started = _cpu_seconds(router), time.monotonic()
        figures = measure_overhead(base_url, worker_url, rounds=rounds)
        busy = _cpu_seconds(router) - before - idle_rate * (time.monotonic() - started)
        # CPU the router process spent per request it relayed, beyond its idle background: a figure a busy
        # machine does not blur the way it blurs wall-clock latency.
        figures["router_cpu_ms_per_request"] = max(busy, 0.0) * 1000 / (2 * rounds + 1)
        figures["router_idle_cpu_percent"] = idle_rate * 100
        return figures
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def _cpu_rate(process: psutil.Process, seconds: float) -> float:
    before = _cpu_seconds(process)
    time.sleep(seconds)  # a measurement window, not a wait for readiness
    return (_cpu_seconds(process) - before) / seconds


def _wait_for_workers(base_url: str, process: Any, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"failsoft serve exited with {process.returncode}")
        try:
            status = httpx.get(base_url + "/api/status", timeout=5, trust_env=False).json()
        except (httpx.HTTPError, ValueError):
            time.sleep(0.1)
            continue
        workers = status["workers"]
        if workers["gpu"]["state"] == "ready" and workers["cpu"]["state"] == "ready":
            return str(workers["gpu"]["base_url"])
        time.sleep(0.1)
    raise RuntimeError("the workers did not become ready in time")
