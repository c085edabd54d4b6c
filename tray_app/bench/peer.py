"""The failover pause by the next rung (`failsoft bench --peer`): a peer's GPU against this machine's CPU.

Three services, each on its own simulated GPU, with the drill's long slots (two of 2,560 tokens, scenario
l's): A with a peer B (drill.peer_pair), and A alone, the same config without `[[peers]]`. Each case is a
streamed chat whose local GPU worker is killed (SIGKILL) after its 5th token; the pause is from that token to
the next the client receives, on three sides:

- peer: A's job goes on on B's GPU, which reads the prompt and the text already sent;
- cpu: A alone's job goes on on its CPU worker, the CPU mirror off (it reads the same from scratch);
- cpu+mirror: the same with the CPU mirror on, as this machine runs by default (it may have read the prompt
  while the GPU was reading it).

A's CPU mirror is off: the peer's side is the rung itself, with nothing read ahead on this machine's cores.
The sides take turns within each prompt size, their order turning each round.
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

from tray_app.bench.mirror import ANSWER_TOKENS, failover_body
from tray_app.contract.status import ServiceStatus
from tray_app.drill.client import Answer, DrillError, ServiceClient
from tray_app.drill.conversation import conversation
from tray_app.drill.launcher import launched_service
from tray_app.drill.peer_pair import PeerSide, launched_pair
from tray_app.host.launch import ServeProcess

SIZES = (100, 1000, 2000)
SIDES = ("peer", "cpu", "cpu+mirror")
KILL_AFTER = 5  # streamed tokens before the local GPU worker is killed
SPEED_WAIT = 120.0  # until each service has measured its CPU worker (a failover waits for that)
PEER_WAIT = 60.0  # until A's probe finds B ready
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Pause:
    side: str
    size: int  # the prompt asked for, about this many tokens
    prompt_tokens: int
    pause_seconds: float
    cached_tokens: int | None  # the CPU attempt's cache_n (the answer's failsoft object); None on the peer


def sizes_that_fit(sizes: tuple[int, ...], n_ctx_per_seq: int) -> list[int]:
    """The prompt sizes cut to what one GPU slot holds with the answer: a longer prompt would go elsewhere
    from the start, with no GPU to kill."""
    room = n_ctx_per_seq - ANSWER_TOKENS - 100  # the filler's count is a few per cent off
    return [min(size, room) for size in sizes]


async def _set_mirror(client: ServiceClient, on: bool) -> None:
    """`cpu.mirror` through the control API: taken over live, no worker restarts."""
    response = await client.http.patch(
        "/failsoft/config", json={"changes": {"cpu": {"mirror": on}}}, timeout=30
    )
    if response.status_code != 200:
        raise DrillError(f"PATCH /failsoft/config answered {response.status_code}: {response.text[:200]}")


async def _measured(client: ServiceClient) -> ServiceStatus:
    """The service's status once its workers are ready and it knows its CPU worker's speed."""

    async def known() -> ServiceStatus | None:
        status = await client.wait_ready()
        return status if status["policy"].get("cpu_tokens_per_second") else None

    result: ServiceStatus = await client.wait_for(known, "the CPU worker's measured speed", SPEED_WAIT, 0.5)
    return result


async def _peer_ready(client: ServiceClient, peer: PeerSide) -> None:
    async def ready() -> bool:
        peers = (await client.status()).get("peers") or []
        return any(p.get("name") == peer.name and p.get("state") == "ready" for p in peers)

    await client.wait_for(ready, f"the probe to find peer {peer.name} ready", PEER_WAIT, 0.2)


async def _killed_stream(client: ServiceClient, messages: list[dict[str, str]]) -> tuple[Answer, list[float]]:
    """A streamed chat whose GPU worker is killed after its 5th token: the answer and each token's time."""
    await client.arm("kill", KILL_AFTER)  # waits until both workers are ready (the last kill's restart)
    times: list[float] = []

    async def stamp(answer: Answer) -> bool:
        if len(answer.content_at) > len(times):
            times.append(time.monotonic())
        return False

    answer = await client.stream_chat(failover_body(messages), stop_after=stamp)
    return answer, times


async def one_pause(
    client: ServiceClient, side: str, size: int, rung: str, seed: int, progress: Progress
) -> Pause | None:
    """One case on one side; None (said why) when the GPU attempt did not end by the kill or the next
    attempt was not `rung`'s ("peer:<name>" or "cpu")."""
    answer, times = await _killed_stream(client, conversation(size, seed))
    if answer.error is not None or len(times) < 2 or answer.failsoft is None:
        progress(
            f"  {side}, about {size}: not measured ({answer.error or answer.transport_error or 'no answer'})"
        )
        return None
    job = await client.wait_job_final(answer.job_id)
    words = [f"{attempt.get('worker')} {attempt.get('outcome')}" for attempt in job.get("attempt_log") or []]
    first_error = str(((job.get("attempt_log") or [{}])[0]).get("error") or "")
    if words != ["gpu failed", f"{rung} completed"] or not first_error.startswith("killed"):
        progress(f"  {side}, about {size}: not measured (attempts {', '.join(words)}; {first_error or '-'})")
        return None
    usage = (job.get("result") or {}).get("usage") or {}
    # The longest wait between two tokens is the failover's (either side streams a token every few tens of
    # milliseconds; the router counts the role announcement among the tokens it relays, so the kill lands
    # after the 4th or 5th text token).
    gaps = [later - earlier for earlier, later in pairwise(times)]
    return Pause(
        side=side,
        size=size,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        pause_seconds=max(gaps),
        cached_tokens=answer.failsoft.get("cpu_cached_tokens"),
    )


@dataclass
class _Services:
    """A (with its peer), A alone, and the peer as A names it."""

    with_peer: ServiceClient
    alone: ServiceClient
    peer: PeerSide

    def client(self, side: str) -> ServiceClient:
        return self.with_peer if side == "peer" else self.alone

    def rung(self, side: str) -> str:
        """The worker the job's second attempt must be on."""
        return f"peer:{self.peer.name}" if side == "peer" else "cpu"

    async def aclose(self) -> None:
        await self.with_peer.aclose()
        await self.alone.aclose()


async def _pauses(services: _Services, rounds: int, sizes: list[int], progress: Progress) -> list[Pause]:
    pauses: list[Pause] = []
    seed = int(time.time()) % 10_000 * 100
    for number in range(rounds):
        turn = number % len(SIDES)
        order = SIDES[turn:] + SIDES[:turn]
        progress(f"failover pause, round {number + 1} of {rounds}: {', '.join(order)}")
        for size in sizes:
            for side in order:
                seed += 1  # new text every case: nothing cached from an earlier one, on any service
                if side != "peer":
                    await _set_mirror(services.alone, side == "cpu+mirror")
                client, rung = services.client(side), services.rung(side)
                found = await one_pause(client, side, size, rung, seed, progress)
                pauses.extend([found] if found else [])
    return pauses


async def _measure(
    service: ServeProcess,
    alone: ServeProcess,
    peer: PeerSide,
    rounds: int,
    sizes: tuple[int, ...],
    progress: Progress,
) -> dict[str, Any]:
    services = _Services(
        ServiceClient(service.base_url, admin=service.admin_token),
        ServiceClient(alone.base_url, admin=alone.admin_token),
        peer,
    )
    try:
        status = await _measured(services.with_peer)
        await _measured(services.alone)
        await _peer_ready(services.with_peer, peer)
        await _set_mirror(services.with_peer, False)
        fitting = sizes_that_fit(sizes, int(status["caps"]["n_ctx_per_seq"]))
        pauses = await _pauses(services, rounds, fitting, progress)
    finally:
        await services.aclose()
    return {
        "simulated": bool(status.get("simulated")),
        "cores": os.cpu_count(),
        "rounds": rounds,
        "kill_after_tokens": KILL_AFTER,
        "answer_tokens": ANSWER_TOKENS,
        "n_ctx_per_seq": status["caps"]["n_ctx_per_seq"],
        "sides": list(SIDES),
        "cases": pause_rows(pauses, fitting),
    }


def peer_figures(
    settings: dict[str, Any], rounds: int, progress: Progress, sizes: tuple[int, ...] | None = None
) -> dict[str, Any]:
    """Start A with its peer B, and A alone, from `settings`; measure (`sizes`: SIZES); stop all three."""
    progress("starting a service and its peer, and the same service alone (all stopped at the end)")
    with launched_pair(settings) as (service, peer), launched_service(settings) as alone:
        return asyncio.run(_measure(service, alone, peer, rounds, sizes or SIZES, progress))


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)


def _ratio(over: float | None, under: float | None) -> float | None:
    return round(over / under, 2) if over is not None and under else None


def pause_rows(pauses: list[Pause], sizes: list[int]) -> list[dict[str, Any]]:
    """One row per prompt size: each side's median pause, and the peer's over each CPU side's."""
    rows = []
    for size in sizes:
        found = {side: [p for p in pauses if p.size == size and p.side == side] for side in SIDES}
        pause = {side: _median([p.pause_seconds for p in found[side]]) for side in SIDES}
        tokens = [p.prompt_tokens for p in found["cpu"] + found["cpu+mirror"]]
        cached = [p.cached_tokens for p in found["cpu+mirror"] if p.cached_tokens is not None]
        rows.append(
            {
                "size": size,
                "prompt_tokens": int(statistics.median(tokens)) if tokens else None,
                "measured": {side: len(found[side]) for side in SIDES},
                "peer_ms": _ms(pause["peer"]),
                "cpu_ms": _ms(pause["cpu"]),
                "cpu_mirror_ms": _ms(pause["cpu+mirror"]),
                "mirror_cached_tokens": int(statistics.median(cached)) if cached else None,
                "peer_over_cpu": _ratio(pause["peer"], pause["cpu"]),
                "peer_over_cpu_mirror": _ratio(pause["peer"], pause["cpu+mirror"]),
            }
        )
    return rows
