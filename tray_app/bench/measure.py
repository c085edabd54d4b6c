"""The bench's measurements against a running service with faults enabled. Each returns plain figures
(milliseconds, tokens per second, bytes, ratios); nothing here judges them: a benchmark prints ratios."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from tray_app.contract.status import ServiceStatus
from tray_app.drill.client import ServiceClient
from tray_app.drill.records import JobTrace

# A new topic for every request: llama.cpp reuses the KV cache of a repeated prompt, which would make the
# time to first token look better than a new request gets.
TOPICS = (
    "autumn leaves",
    "a harbour",
    "bread",
    "thunder",
    "a violin",
    "glaciers",
    "bees",
    "a lighthouse",
    "copper",
    "owls",
    "tides",
    "a library",
    "frost",
    "kites",
    "salt",
    "a volcano",
)


def prompt(index: int, task: str = "Write a short paragraph about") -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{task} {TOPICS[index % len(TOPICS)]}."}]


BUFFER_KEYS = (("weights_bytes", "model_bytes"), ("kv_bytes", "kv_bytes"), ("compute_bytes", "compute_bytes"))


@dataclass
class StreamTiming:
    """One streamed request as its client saw it."""

    started: float  # wall clock (time.time), comparable with the service's journal times
    first_token_at: float | None = None
    last_token_at: float | None = None
    tokens: int = 0
    gaps: list[float] = field(default_factory=list)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started

    @property
    def tokens_per_second(self) -> float | None:
        """Generation speed after the first token (the first one also pays for the prompt)."""
        if self.tokens < 2 or self.first_token_at is None or self.last_token_at is None:
            return None
        span = self.last_token_at - self.first_token_at
        return (self.tokens - 1) / span if span > 0 else None


async def timed_stream(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[StreamTiming, str | None]:
    """Stream a chat completion from `url`: the timing, and the router's job id (None from a worker)."""
    timing = StreamTiming(started=time.time())
    async with http.stream("POST", url, json={**body, "stream": True}, headers=headers) as response:
        response.raise_for_status()
        job_id = response.headers.get("x-failsoft-job")
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line[len("data: ") :]).get("choices") or []
            if not choices or not (choices[0].get("delta") or {}).get("content"):
                continue
            now = time.time()
            if timing.last_token_at is not None:
                timing.gaps.append(now - timing.last_token_at)
            timing.first_token_at = timing.first_token_at or now
            timing.last_token_at = now
            timing.tokens += 1
    return timing, job_id


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 2)


# llama-server closes its side after every streamed answer; a client that reused the connection could
# send its next request into a socket the server is closing. Asking for a new connection each time is
# what the server does anyway, minus the race.
WORKER_STREAM_HEADERS = {"Connection": "close"}


# ------------------------------------------------------------------------------------------ profiles
async def profile_figures(
    http: httpx.AsyncClient, worker_url: str, rounds: int, max_tokens: int
) -> dict[str, Any]:
    """Tokens per second and time to first token of one worker, asked directly (no router in between)."""

    def body(index: int, tokens: int = max_tokens) -> dict[str, Any]:
        return {"messages": prompt(index), "max_tokens": tokens, "temperature": 0, "seed": 1}

    url = worker_url + "/v1/chat/completions"
    await timed_stream(http, url, body(len(TOPICS) - 1, 4), WORKER_STREAM_HEADERS)  # warm-up
    speeds: list[float] = []
    ttfts: list[float] = []
    for index in range(rounds):
        timing, _ = await timed_stream(http, url, body(index), WORKER_STREAM_HEADERS)
        if timing.tokens_per_second is not None:
            speeds.append(timing.tokens_per_second)
        if timing.ttft is not None:
            ttfts.append(timing.ttft)
    speed = _median(speeds)
    return {
        "rounds": rounds,
        "tokens_per_second": None if speed is None else round(speed, 2),
        "ttft_ms": _ms(_median(ttfts)),
    }


# ------------------------------------------------------------------------------------------ failover
async def failover_figures(client: ServiceClient, rounds: int) -> dict[str, Any]:
    """Failure-to-first-CPU-token through the router, minus the CPU worker's own time to first token.

    Each round: the CPU worker's own TTFT (asked directly), then a streamed request through the router with
    an abort armed before the GPU's first token; the failure time is the failed attempt's end in
    the journal, the first CPU token is when this client received it."""

    def body(index: int) -> dict[str, Any]:
        messages = prompt(index, "Name three things about")
        return {"model": "default", "messages": messages, "max_tokens": 16, "temperature": 0, "seed": 1}

    to_first_cpu_token: list[float] = []
    cpu_ttft: list[float] = []
    for index in range(rounds):
        status = await client.wait_ready()
        cpu_url = status["workers"]["cpu"].get("base_url")
        if not cpu_url:
            continue  # the CPU worker went away meanwhile: this round measures nothing
        # Two different prompts of the same shape, so that neither finds the other's prompt in the cache.
        direct, _ = await timed_stream(
            client.http, cpu_url + "/v1/chat/completions", body(2 * index), WORKER_STREAM_HEADERS
        )
        await client.arm("abort", 0)  # the GPU worker dies before its first token
        routed, job_id = await timed_stream(client.http, "/v1/chat/completions", body(2 * index + 1))
        if job_id is None or routed.first_token_at is None or direct.ttft is None:
            continue
        trace = JobTrace(await client.wait_job_final(job_id), ())
        error = trace.first_error()
        if error is None or trace.cpu_started() is None:
            continue  # the fault did not fire on this request (e.g. the GPU was still restarting)
        after_failure = routed.first_token_at - error[0]
        to_first_cpu_token.append(after_failure)
        cpu_ttft.append(direct.ttft)
    failure_to_token, own = _median(to_first_cpu_token), _median(cpu_ttft)
    return {
        "rounds": rounds,
        "measured": len(to_first_cpu_token),
        "failure_to_first_cpu_token_ms": _ms(failure_to_token),
        "cpu_ttft_ms": _ms(own),
        "overhead_ms": _ms(failure_to_token - own)
        if failure_to_token is not None and own is not None
        else None,
        "ratio": round(failure_to_token / own, 2) if failure_to_token and own else None,
    }


# ------------------------------------------------------------------------------------------ planner
def reported_weights(buffers: dict[str, Any]) -> int | None:
    """The weights llama.cpp put on the device: its non-CPU model buffers when there are any (a real GPU),
    else all of them (a CPU worker, or a simulated GPU whose worker runs on the CPU)."""
    parts = buffers.get("model_buffers") or {}
    device = sum(int(size) for name, size in parts.items() if not str(name).upper().startswith("CPU"))
    total = buffers.get("model_bytes")
    return device or (int(total) if total else None)


def accuracy(plan: dict[str, Any], buffers: dict[str, Any]) -> dict[str, Any]:
    """The planner's estimate against what llama.cpp reported at load (weights, KV cache, compute)."""
    rows: dict[str, Any] = {}
    for planned_key, reported_key in BUFFER_KEYS:
        estimated = int(plan.get(planned_key) or 0)
        reported = reported_weights(buffers) if planned_key == "weights_bytes" else buffers.get(reported_key)
        name = planned_key.removesuffix("_bytes")
        if not reported:
            rows[name] = {"estimated_bytes": estimated, "reported_bytes": None, "ratio": None}
            continue
        rows[name] = {
            "estimated_bytes": estimated,
            "reported_bytes": int(reported),
            "ratio": round(estimated / int(reported), 4),
        }
    return rows


def planner_figures(status: ServiceStatus) -> dict[str, Any]:
    """Both workers' plans against the buffer sizes each worker read from llama.cpp's own log at load."""
    figures: dict[str, Any] = {}
    for role, plan in (("gpu", status["plan"]), ("cpu", status["cpu_plan"])):
        health = status["workers"].get(role, {}).get("health") or {}
        buffers = health.get("buffers") or {}
        figures[role] = {
            "n_ctx": plan.get("n_ctx"),
            "compute_source": plan.get("compute_source"),
            **accuracy(plan, buffers),
        }
    return figures
