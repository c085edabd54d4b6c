"""The CPU mirror's figures (jobs.mirror), from one service with faults enabled, the mirror switched between
rounds through the control API (`cpu.mirror` is a live setting):

- the failover pause by prompt length: the GPU worker is killed (SIGKILL) after the 5th streamed token of a
  chat; the pause is from that token to the next one the client receives (the CPU's first). Prompts of about
  100, 1,000 and 2,000 tokens, and the follow-up turn of a conversation of 2,000: its first turn runs on the
  GPU, then (the user reading the answer) the follow-up asks one more question. With the mirror on and off,
  each as a ratio to the 100-token pause of its own rounds; and how long the GPU had been running;
- the GPU worker's throughput (through the router) at 1 and 4 clients whose prompts are worth mirroring,
  with the mirror on (its work running beside) and off, per round as a ratio.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from tray_app.bench.throughput import Run, _one
from tray_app.contract.status import ServiceStatus
from tray_app.drill.client import Answer, DrillError, ServiceClient
from tray_app.drill.conversation import conversation, next_turn

SIZES = (100, 1000, 2000)
CASES = ("about 100", "about 1,000", "about 2,000")
FOLLOW_UP = 2000  # the conversation whose next turn fails over
FOLLOW_UP_CASE = "follow-up turn"
KILL_AFTER = 5  # streamed tokens before the GPU worker is killed
ANSWER_TOKENS = 40
CATCH_UP_WAIT = 120.0  # seconds the follow-up waits for the mirror to read the first turn (a user reading)
THROUGHPUT_PROMPT = 400  # tokens: worth mirroring at the CPU speeds this runs on
THROUGHPUT_LEVELS = (1, 4)
Progress = Callable[[str], None]


def sizes_that_fit(n_ctx_per_seq: int) -> tuple[list[int], int]:
    """The prompt sizes, and the conversation of the follow-up, cut to what one GPU slot holds with the
    answer (and, for the conversation, its next turn): a longer prompt would go to the CPU from the start."""
    room = n_ctx_per_seq - ANSWER_TOKENS - 100  # the filler's count is a few per cent off
    turn = n_ctx_per_seq - 3 * ANSWER_TOKENS - 200
    return [min(size, room) for size in SIZES], min(FOLLOW_UP, turn)


@dataclass
class Pause:
    case: str
    mirror: bool
    prompt_tokens: int
    gpu_seconds: float  # from the request to the 5th token: how long the GPU had been running
    pause_seconds: float  # from the 5th token to the next
    cached_tokens: int | None  # llama-server's cache_n at the CPU attempt (the answer's failsoft object)


async def _set_mirror(client: ServiceClient, on: bool) -> None:
    """`cpu.mirror` through the control API: taken over live, no worker restarts."""
    body = {"changes": {"cpu": {"mirror": on}}}
    response = await client.http.patch("/failsoft/config", json=body, timeout=30)
    if response.status_code != 200:
        raise DrillError(f"PATCH /failsoft/config answered {response.status_code}: {response.text[:200]}")


async def _speed_known(client: ServiceClient) -> ServiceStatus:
    """Once the service has measured its CPU worker: until then a failover waits for that measurement."""
    deadline = time.monotonic() + CATCH_UP_WAIT
    while True:
        status = await client.wait_ready()
        if status["policy"].get("cpu_tokens_per_second") or time.monotonic() > deadline:
            return status
        await asyncio.sleep(0.5)


async def _mirror_caught_up(client: ServiceClient) -> None:
    deadline = time.monotonic() + CATCH_UP_WAIT
    while time.monotonic() < deadline:
        mirror = (await client.status()).get("mirror") or {}
        if not mirror.get("tokens_behind") and not mirror.get("reading"):
            return
        await asyncio.sleep(0.2)


def failover_body(messages: list[dict[str, str]]) -> dict[str, Any]:
    """A failover bench's request: every answer its whole length (no end of text), so the kill always lands
    mid-stream."""
    return {
        "model": "default",
        "messages": messages,
        "max_tokens": ANSWER_TOKENS,
        "temperature": 0,
        "seed": 1,
        "ignore_eos": True,
    }


async def _killed_stream(client: ServiceClient, messages: list[dict[str, str]]) -> tuple[Answer, list[float]]:
    """A streamed chat whose GPU worker is killed after its 5th token: the answer and each token's time."""
    await client.wait_ready()
    await client.arm("kill", KILL_AFTER)
    times: list[float] = []
    seen = [0]

    async def stamp(answer: Answer) -> bool:
        if len(answer.text) > seen[0]:
            seen[0] = len(answer.text)
            times.append(time.monotonic())
        return False

    answer = await client.stream_chat(failover_body(messages), stop_after=stamp)
    return answer, times


async def one_pause(
    client: ServiceClient, case: str, messages: list[dict[str, str]], mirror: bool, progress: Progress
) -> Pause | None:
    started = time.monotonic()
    answer, times = await _killed_stream(client, messages)
    if answer.error is not None or len(times) < 2 or answer.failsoft is None:
        progress(f"  {case}: not measured ({answer.error or 'no answer'})")
        return None
    job = await client.wait_job_final(answer.job_id)
    attempts = job.get("attempt_log") or []
    first_error = str(attempts[0].get("error") or "") if attempts else ""
    if job.get("worker") != "cpu" or not first_error.startswith("killed"):
        progress(f"  {case}: not measured (the GPU attempt ended otherwise: {first_error or 'completed'})")
        return None
    usage = (job.get("result") or {}).get("usage") or {}
    # The longest wait between two tokens: the failover's (the router counts the role announcement among
    # the tokens it relays, so the kill lands after the 4th or 5th text token; either side streams fast).
    gaps = [later - earlier for earlier, later in pairwise(times)]
    before = gaps.index(max(gaps))
    return Pause(
        case=case,
        mirror=mirror,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        gpu_seconds=times[before] - started,
        pause_seconds=gaps[before],
        cached_tokens=answer.failsoft.get("cpu_cached_tokens"),
    )


async def _follow_up(
    client: ServiceClient, tokens: int, seed: int, mirror: bool, progress: Progress
) -> Pause | None:
    first = conversation(tokens, seed)
    await client.wait_ready()
    answer = await client.stream_chat(failover_body(first))
    device = (answer.failsoft or {}).get("device")
    if answer.error is not None or device != "gpu":
        progress(f"  {FOLLOW_UP_CASE}: not measured (the first turn: {answer.error or device})")
        return None
    if mirror:
        await _mirror_caught_up(client)
    else:
        await asyncio.sleep(1.0)
    return await one_pause(client, FOLLOW_UP_CASE, next_turn(first, answer.text), mirror, progress)


async def pause_figures(client: ServiceClient, rounds: int, progress: Progress) -> dict[str, Any]:
    """Each round: every case with the mirror on and off (the order switching each round)."""
    status = await _speed_known(client)
    sizes, follow_up = sizes_that_fit(int(status["caps"]["n_ctx_per_seq"]))
    pauses: list[Pause] = []
    seed = int(time.time()) % 10_000 * 100  # new text each run: nothing cached from an earlier one
    for number in range(rounds):
        for mirror in (True, False) if number % 2 == 0 else (False, True):
            await _set_mirror(client, mirror)
            progress(f"failover pause, round {number + 1} of {rounds}, mirror {'on' if mirror else 'off'}")
            for case, size in zip(CASES, sizes, strict=False):
                seed += 1
                found = await one_pause(client, case, conversation(size, seed), mirror, progress)
                pauses.extend([found] if found else [])
            seed += 1
            found = await _follow_up(client, follow_up, seed, mirror, progress)
            pauses.extend([found] if found else [])
    await _set_mirror(client, True)
    return {
        "rounds": rounds,
        "kill_after_tokens": KILL_AFTER,
        "n_ctx_per_seq": status["caps"]["n_ctx_per_seq"],
        "cases": _pause_rows(pauses),
    }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _pause_rows(pauses: list[Pause]) -> list[dict[str, Any]]:
    rows = []
    cases = [*CASES, FOLLOW_UP_CASE]
    for mirror in (True, False):
        base = _median([p.pause_seconds for p in pauses if p.mirror == mirror and p.case == cases[0]])
        for case in cases:
            found = [p for p in pauses if p.mirror == mirror and p.case == case]
            pause = _median([p.pause_seconds for p in found])
            cached = [p.cached_tokens for p in found if p.cached_tokens is not None]
            tokens = [p.prompt_tokens for p in found]
            rows.append(
                {
                    "case": case,
                    "mirror": mirror,
                    "measured": len(found),
                    "prompt_tokens": int(statistics.median(tokens)) if tokens else None,
                    "gpu_running_ms": _ms(_median([p.gpu_seconds for p in found])),
                    "pause_ms": _ms(pause),
                    "cached_tokens": int(statistics.median(cached)) if cached else None,
                    "ratio_to_100": round(pause / base, 2) if pause is not None and base else None,
                }
            )
    return rows


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)


# ------------------------------------------------------------------------------------------ throughput
async def _level(client: ServiceClient, clients: int, requests: int, seed: int, tokens: int) -> Run:
    run = Run()

    async def one_client(number: int) -> None:
        for index in range(requests):
            messages = conversation(THROUGHPUT_PROMPT, seed + number * requests + index)
            body = {**failover_body(messages), "max_tokens": tokens, "temperature": 0.7, "stream": True}
            await _one(client.http, client.base_url + "/v1/chat/completions", body, {}, run)

    started = time.perf_counter()
    await asyncio.gather(*(one_client(number) for number in range(clients)))
    run.seconds = time.perf_counter() - started
    return run


async def throughput_figures(
    client: ServiceClient, rounds: int, tokens: int, progress: Progress, requests: int = 2
) -> dict[str, Any]:
    """Tokens per second through the router at each level, the mirror off and on, interleaved by round;
    the ratio is the median over rounds of on over off."""
    levels = []
    seed = int(time.time()) % 10_000 * 100 + 50_000
    for clients in THROUGHPUT_LEVELS:
        runs: dict[bool, list[Run]] = {True: [], False: []}
        read_before = (await client.status())["mirror"]["read_tokens"]
        for number in range(rounds):
            progress(f"throughput beside the mirror, {clients} client(s), round {number + 1} of {rounds}")
            for mirror in (False, True) if number % 2 == 0 else (True, False):
                await _set_mirror(client, mirror)
                await _mirror_caught_up(client)  # each side starts with no mirror work left over
                runs[mirror].append(await _level(client, clients, requests, seed, tokens))
                seed += clients * requests
        read = (await client.status())["mirror"]["read_tokens"] - read_before
        pairs = zip(runs[True], runs[False], strict=True)
        ratios = [on.tokens_per_second / off.tokens_per_second for on, off in pairs if off.tokens_per_second]
        off, on = (
            round(statistics.median(r.tokens_per_second for r in runs[side]), 2) for side in (False, True)
        )
        levels.append(
            {
                "clients": clients,
                "off_tokens_per_second": off,
                "on_tokens_per_second": on,
                "ratio": round(statistics.median(ratios), 3) if ratios else None,
                "mirror_read_tokens": read,
            }
        )
    await _set_mirror(client, True)
    return {
        "rounds": rounds,
        "requests_per_client": requests,
        "max_tokens": tokens,
        "prompt_tokens": THROUGHPUT_PROMPT,
        "levels": levels,
    }


async def mirror_figures(
    url: str, rounds: int, tokens: int, progress: Progress, key: str = "", admin: str = ""
) -> dict[str, Any]:
    client = ServiceClient(url, api_key=key, admin=admin)
    try:
        status = await client.wait_ready()
        if "mirror" not in status:
            raise DrillError("this service does not report a CPU mirror")
        return {
            "simulated": bool(status.get("simulated")),
            "cores": os.cpu_count(),
            "pause": await pause_figures(client, rounds, progress),
            "throughput": await throughput_figures(client, rounds, tokens, progress),
        }
    finally:
        await client.aclose()
