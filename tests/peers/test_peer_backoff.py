"""A down peer is asked again after its backoff (2, 4, 8, ... up to 120 s), a ready one every 30 s; a job
that finds it down waits for nothing: `ensure_ready` probes only when a probe is due. Time here is a clock
the test moves, against a real server on loopback."""

from __future__ import annotations

import asyncio

import pytest

from tests.peers.health_server import Clock, Health, closed_port
from tests.support.http_server import silent_listener
from tray_app.config import PeerConfig
from tray_app.peers import Peer, ProbeSchedule

Served = tuple[Health, str]


def test_the_backoff_doubles_up_to_two_minutes() -> None:
    schedule = ProbeSchedule()
    assert [schedule.backoff(failures) for failures in range(1, 10)] == [2, 4, 8, 16, 32, 64, 120, 120, 120]
    assert schedule.backoff(10_000) == 120
    assert ProbeSchedule(backoff_base=0.01, backoff_max=0.05).backoff(4) == 0.05


def clocked_peer(url: str, clock: Clock) -> Peer:
    return Peer(PeerConfig(name="gaming-pc", url=url), clock=clock)


async def test_a_failed_request_downs_the_peer_until_its_backoff_is_over(served: Served) -> None:
    health, url = served
    clock = Clock()
    peer = clocked_peer(url, clock)
    assert await peer.ensure_ready(timeout=3.0)  # never probed: probed now
    assert len(health.requests) == 1
    assert await peer.ensure_ready(timeout=3.0)  # ready: no probe
    assert len(health.requests) == 1

    peer.mark_unhealthy("connection reset mid-stream", "upstream_disconnect", pid=None)
    assert (peer.state, peer.base_url) == ("down", None)
    assert peer.last_failure is not None
    assert (peer.last_failure["kind"], peer.last_failure["message"]) == (
        "upstream_disconnect",
        "connection reset mid-stream",
    )
    assert peer.status()["next_probe_in"] == 2.0

    clock.advance(1.9)
    assert not await peer.ensure_ready(timeout=3.0)  # within the backoff: False at once, nothing asked
    assert len(health.requests) == 1
    clock.advance(0.1)
    assert await peer.ensure_ready(timeout=3.0)
    assert len(health.requests) == 2
    assert (peer.state, peer.base_url, peer.status()["next_probe_in"]) == ("ready", url, 30.0)


async def test_each_failure_in_a_row_doubles_the_wait_and_a_success_resets_it(served: Served) -> None:
    _, url = served
    clock = Clock()
    dead = f"http://127.0.0.1:{closed_port()}"
    peer = clocked_peer(dead, clock)
    waits = []
    for _ in range(4):
        assert not await peer.ensure_ready(timeout=3.0)
        waits.append(peer.status()["next_probe_in"])
        clock.advance(waits[-1])
    assert waits == [2.0, 4.0, 8.0, 16.0]

    peer.url = url  # the peer is back (the same peer, now answering)
    assert await peer.ensure_ready(timeout=3.0)
    peer.mark_unhealthy("boom", "upstream_error")
    assert peer.status()["next_probe_in"] == 2.0


async def test_jobs_that_saw_one_incident_push_the_backoff_on_once(served: Served) -> None:
    _, url = served
    clock = Clock()
    peer = clocked_peer(url, clock)
    assert await peer.ensure_ready(timeout=3.0)
    for _ in range(4):  # four jobs on the peer's four slots, one broken connection
        peer.mark_unhealthy("connection reset", "upstream_disconnect")
    assert peer.status()["next_probe_in"] == 2.0


async def test_jobs_waiting_on_a_due_peer_share_one_probe(served: Served) -> None:
    health, url = served
    peer = clocked_peer(url, Clock())
    answers = await asyncio.gather(*(peer.ensure_ready(timeout=3.0) for _ in range(8)))
    assert answers == [True] * 8
    assert len(health.requests) == 1


async def test_ensure_ready_gives_up_at_its_timeout() -> None:
    with silent_listener() as port:
        peer = Peer(PeerConfig(name="p", url=f"http://127.0.0.1:{port}"), schedule=ProbeSchedule(timeout=3.0))
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert not await peer.ensure_ready(timeout=0.2)
        assert loop.time() - started < 1.0
    assert peer.state == "unknown" and peer.probe_due()  # cut short: the next job asks again


@pytest.mark.parametrize("state_after", ["ready", "down"])
async def test_a_probe_moves_the_schedule(served: Served, state_after: str) -> None:
    health, url = served
    clock = Clock()
    peer = clocked_peer(url, clock)
    if state_after == "down":
        health.answer(503, b"{}")
    await peer.probe_if_due(None)
    assert peer.state == state_after and not peer.probe_due()
    clock.advance(30.0 if state_after == "ready" else 2.0)
    assert peer.probe_due()
