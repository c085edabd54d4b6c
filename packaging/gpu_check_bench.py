"""The GPU check's bench phase, on the service the check started (its GPU worker on the real card):

- throughput, routed against the same `llama-server` process asked directly (the GPU worker: the very
  arguments Failsoft gave it), at 1, 4 and 16 concurrent clients, streamed and not: tokens per second each
  way, the router's over the direct one as the median of paired rounds, and the time to the first token
  (streamed; not streamed, the time to the whole answer);
- the failover pause: a streamed chat whose GPU worker is SIGKILLed after its 5th token, at prompts of about
  100, 1,000 and 4,000 tokens, with the CPU mirror on and off: from that token to the next one the client
  gets (the CPU worker's first).

It is `failsoft bench`'s own code (tray_app/bench: `throughput.paired_levels` and `level_figures` for the
streamed rounds, `mirror.one_pause` for a pause) driven on the running service: `failsoft bench` itself
starts a service of its own, streams only, and stops its pauses at 2,000 tokens, so it is not run as a
command here. What is added here is the not-streamed request (one POST, the usage's token count).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from check_report import Report, say

from tray_app.bench.measure import WORKER_STREAM_HEADERS, prompt
from tray_app.bench.mirror import ANSWER_TOKENS, _set_mirror, one_pause
from tray_app.bench.throughput import PATH, Run, Target, level_figures, paired_levels
from tray_app.drill.client import ServiceClient
from tray_app.drill.conversation import conversation
from tray_app.host.launch import ServeProcess

LEVELS = (1, 4, 16)
ROUNDS = 2
REQUESTS_PER_CLIENT = 2
MAX_TOKENS = 32
PAUSE_SIZES = (100, 1000, 4000)


def pause_sizes(n_ctx_per_seq: int, sizes: tuple[int, ...] = PAUSE_SIZES) -> list[int]:
    """The prompt sizes cut to what one GPU slot holds with the answer (a longer prompt would be sent to the
    CPU from the start, and there would be nothing to fail over)."""
    room = max(64, n_ctx_per_seq - ANSWER_TOKENS - 100)  # the filler's count is a few per cent off
    return [min(size, room) for size in sizes]


# ------------------------------------------------------------------------------------------ not streamed
async def _one_plain(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str], run: Run
) -> None:
    started = time.perf_counter()
    response = await http.post(url, json={**body, "stream": False}, headers=headers)
    response.raise_for_status()
    usage = response.json().get("usage") or {}
    run.tokens += int(usage.get("completion_tokens") or 0)
    run.first_token.append(time.perf_counter() - started)  # not streamed: the whole answer's time


async def _plain_level(
    http: httpx.AsyncClient, target: Target, clients: int, requests: int, max_tokens: int, offset: int
) -> Run:
    run = Run()

    async def client(number: int) -> None:
        for index in range(requests):
            body: dict[str, Any] = {
                "model": target.model,
                "messages": prompt(offset + number * requests + index),
                "max_tokens": max_tokens,
                "temperature": 0.7,
                "seed": number,
                "ignore_eos": True,
                "cache_prompt": False,
            }
            await _one_plain(http, target.base_url + PATH, body, target.headers, run)

    started = time.perf_counter()
    await asyncio.gather(*(client(number) for number in range(clients)))
    run.seconds = time.perf_counter() - started
    return run


async def plain_levels(
    direct: Target, routed: Target, levels: tuple[int, ...], rounds: int, requests: int, max_tokens: int
) -> list[dict[str, Any]]:
    """As `throughput.paired_levels`, one POST per request: direct and routed interleaved per round."""
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64, keepalive_expiry=2.0)
    figures = []
    offset = 10_000
    async with httpx.AsyncClient(timeout=600, trust_env=False, limits=limits) as http:
        for clients in levels:
            runs: dict[str, list[Run]] = {"direct": [], "router": []}
            sides = (("direct", direct), ("router", routed))
            for number in range(rounds):
                for name, target in sides if number % 2 == 0 else sides[::-1]:
                    runs[name].append(await _plain_level(http, target, clients, requests, max_tokens, offset))
                offset += clients * requests
            level = level_figures(clients, runs["direct"], runs["router"], ("direct", "router"))
            # Not streamed, the "first token" is the whole answer: named so.
            figures.append({key.replace("ttft", "answer"): value for key, value in level.items()})
    return figures


# ------------------------------------------------------------------------------------------ the phase
async def _throughput(figures: dict[str, Any], router: str, worker: str, key: str) -> None:
    """Into `figures` as each half ends (a bench cut short keeps what it measured)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    direct = Target(worker, {**headers, **WORKER_STREAM_HEADERS})
    routed = Target(router, headers)
    figures.update(rounds=ROUNDS, requests_per_client=REQUESTS_PER_CLIENT, max_tokens=MAX_TOKENS)
    streamed = await paired_levels(
        direct,
        routed,
        levels=LEVELS,
        rounds=ROUNDS,
        requests_per_client=REQUESTS_PER_CLIENT,
        max_tokens=MAX_TOKENS,
    )
    figures["streamed"] = [level_figures(c, d, r, ("direct", "router")) for c, d, r in streamed]
    figures["not_streamed"] = await plain_levels(
        Target(worker, headers), routed, LEVELS, ROUNDS, REQUESTS_PER_CLIENT, MAX_TOKENS
    )


async def _pauses(
    client: ServiceClient, sizes: list[int], deadline: float, rows: list[dict[str, Any]]
) -> None:
    """Each size with the mirror on, then off; a row into `rows` as each pause is measured."""
    seed = int(time.time()) % 10_000 * 100  # new text each run: nothing cached from an earlier one
    try:
        for mirror in (True, False):
            await _set_mirror(client, mirror)
            for size in sizes:
                if time.monotonic() > deadline:
                    rows.append(
                        {"prompt_tokens_asked": size, "mirror": mirror, "skipped": "the phase's time"}
                    )
                    continue
                seed += 1
                pause = await one_pause(client, f"about {size}", conversation(size, seed), mirror, say)
                row: dict[str, Any] = {"prompt_tokens_asked": size, "mirror": mirror, "measured": bool(pause)}
                if pause is not None:
                    row.update(
                        prompt_tokens=pause.prompt_tokens,
                        gpu_running_ms=round(pause.gpu_seconds * 1000, 1),
                        pause_ms=round(pause.pause_seconds * 1000, 1),
                        cpu_cached_tokens=pause.cached_tokens,
                    )
                rows.append(row)
                say(f"bench: failover pause, {size} tokens, mirror {'on' if mirror else 'off'}: "
                    f"{row.get('pause_ms')} ms")  # fmt: skip
    finally:
        await _set_mirror(client, True)


def pause_ratios(rows: list[dict[str, Any]]) -> None:
    """Each measured pause over the smallest prompt's, the mirror on and off apart."""
    for mirror in (True, False):
        base = next((r["pause_ms"] for r in rows if r["mirror"] == mirror and r.get("pause_ms")), None)
        for row in rows:
            if row["mirror"] == mirror and row.get("pause_ms") and base:
                row["ratio_to_smallest"] = round(row["pause_ms"] / base, 2)


async def _cpu_speed_known(client: ServiceClient, timeout: float) -> float | None:
    """Seconds until the service has measured its CPU worker (a failover before that waits for the
    measurement, which would count in the first pause), or None when it had not within `timeout`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        status = await client.wait_ready()
        if (status.get("policy") or {}).get("cpu_tokens_per_second"):
            return round(time.monotonic() - started, 2)
        await asyncio.sleep(0.5)
    return None


async def _bench(entry: dict[str, Any], service: ServeProcess, budget: float) -> None:
    deadline = time.monotonic() + budget
    client = ServiceClient(service.base_url, api_key=service.worker_key, admin=service.admin_token)
    try:
        status = await client.wait_ready(timeout=60)
        worker = ((status.get("workers") or {}).get("gpu") or {}).get("base_url")
        if not worker:
            raise RuntimeError("the GPU worker has no address to measure")
        n_ctx = int((status.get("caps") or {}).get("n_ctx_per_seq") or 0)
        entry["n_ctx_per_seq"] = n_ctx
        entry["mirror_during_throughput"] = bool((status.get("mirror") or {}).get("enabled", True))
        say(f"bench: throughput at {LEVELS} clients, routed and direct, streamed and not")
        entry["throughput"] = {}
        await _throughput(entry["throughput"], service.base_url, worker, service.worker_key)
        sizes = pause_sizes(n_ctx, PAUSE_SIZES) if n_ctx else list(PAUSE_SIZES)
        if sizes != list(PAUSE_SIZES):
            entry["pause_sizes_cut"] = f"one GPU slot holds {n_ctx} tokens: prompts of {sizes}"
        entry["cpu_speed_known_after_seconds"] = await _cpu_speed_known(client, timeout=30.0)
        entry["failover_pause"] = []
        await _pauses(client, sizes, deadline - 20, entry["failover_pause"])
    finally:
        await client.aclose()


def summary(entry: dict[str, Any]) -> dict[str, Any]:
    throughput = entry.get("throughput") or {}
    return {
        f"router_over_direct_{kind}": {
            level["clients"]: level.get("ratio") for level in throughput.get(kind) or []
        }
        for kind in ("streamed", "not_streamed")
    } | {
        "pause_ms": {
            f"{row['prompt_tokens_asked']} mirror {'on' if row['mirror'] else 'off'}": row.get("pause_ms")
            for row in entry.get("failover_pause") or []
        }
    }


def bench_lines(entry: dict[str, Any]) -> list[str]:
    """The figures in a few lines, for the report's stderr."""
    lines = []
    for kind in ("streamed", "not_streamed"):
        for level in (entry.get("throughput") or {}).get(kind) or []:
            lines.append(
                f"{kind} {level['clients']:>2} clients: "
                f"direct {level.get('direct_tokens_per_second')} tok/s, "
                f"router {level.get('router_tokens_per_second')} tok/s, ratio {level.get('ratio')}"
            )
    for row in entry.get("failover_pause") or []:
        lines.append(
            f"pause {row['prompt_tokens_asked']} tokens mirror {'on' if row['mirror'] else 'off'}: "
            f"{row.get('pause_ms')} ms"
        )
    return lines


def phase_bench(report: Report, service: ServeProcess) -> None:
    with report.phase("bench") as entry:
        budget = entry["budget_seconds"]
        try:
            asyncio.run(asyncio.wait_for(_bench(entry, service, budget - 10), timeout=budget - 5))
        except TimeoutError:
            entry["cut_short"] = f"its budget ({budget:.0f} s) ran out: the figures measured so far are kept"
            report.problem(f"bench: {entry['cut_short']}")
        finally:
            pause_ratios(entry.get("failover_pause") or [])
            entry["summary"] = summary(entry)
            for line in bench_lines(entry):
                say(f"bench: {line}")
        if not any(row.get("measured") for row in entry.get("failover_pause") or []):
            report.problem("bench: no failover pause was measured")
