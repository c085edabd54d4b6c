"""`Peers`: every configured peer by role, the one a job goes to (ready, serving its model, the lowest
priority, then config order), and the task probing them all at start, then each when it is due."""

from __future__ import annotations

import asyncio

from tests.peers.health_server import FAILSOFT_GPU_READY, Health, closed_port
from tests.support.waits import wait_until_async
from tray_app.config import PeerConfig
from tray_app.peers import Peers, ProbeSchedule

Served = tuple[Health, str]


def directory(*peers: tuple[str, str, int, list[str]]) -> Peers:
    """Peers from (name, url, priority, models)."""
    return Peers([PeerConfig(name=n, url=u, priority=rank, models=models) for n, u, rank, models in peers])


async def test_roles_in_config_order_and_each_found_by_its_role(served: Served) -> None:
    _, url = served
    peers = directory(("b", url, 0, []), ("a", url, 0, []))
    assert peers.roles() == ["peer:b", "peer:a"]
    found = peers.get("peer:a")
    assert found is not None and found.name == "a"
    assert peers.get("a") is None and peers.get("gpu") is None
    assert [peer.name for peer in peers.all()] == ["b", "a"] == [peer.name for peer in peers]


async def test_the_ready_peer_asked_first_has_the_lowest_priority_then_comes_first(served: Served) -> None:
    _, url = served
    dead = f"http://127.0.0.1:{closed_port()}"
    peers = directory(
        ("late", url, 5, []),
        ("first", dead, 0, []),  # the best, but down
        ("second", url, 1, []),
        ("third", url, 1, []),
        ("gemma-box", url, 0, ["gemma"]),
    )
    assert peers.ready_for("SmolLM2", main_model="SmolLM2") is None  # nothing probed yet
    await asyncio.gather(*(peer.probe_if_due(None) for peer in peers))

    chosen = peers.ready_for("SmolLM2", main_model="SmolLM2")
    assert chosen is not None and chosen.name == "second"
    chosen.mark_unhealthy("connection reset", "upstream_disconnect")
    chosen = peers.ready_for("SmolLM2", main_model="SmolLM2")
    assert chosen is not None and chosen.name == "third"
    gemma = peers.ready_for("gemma", main_model="SmolLM2")
    assert gemma is not None and gemma.name == "gemma-box"
    assert peers.ready_for("qwen", main_model="SmolLM2") is None


async def test_run_probes_every_peer_at_start_then_a_failed_one_after_its_backoff(served: Served) -> None:
    health, url = served
    health.answer(200, FAILSOFT_GPU_READY)
    fast = ProbeSchedule(timeout=1.0, ready_every=30.0, backoff_base=0.05, backoff_max=0.2)
    peers = Peers(
        [PeerConfig(name="pc", url=url), PeerConfig(name="gone", url=f"http://127.0.0.1:{closed_port()}")],
        schedule=fast,
    )
    task = asyncio.create_task(peers.run())
    try:

        def probed() -> bool:
            return all(peer.state != "unknown" for peer in peers)

        await wait_until_async(probed, 5.0, "the first probes")
        pc, gone = peers.all()
        assert (pc.state, pc.gpu_ready, gone.state) == ("ready", True, "down")
        assert len(health.requests) == 1

        # A failed request wakes the task, which asks again after the (short) backoff, not after 30 s.
        pc.mark_unhealthy("connection reset", "upstream_disconnect")
        assert pc.state == "down"
        await wait_until_async(lambda: pc.state == "ready", 5.0, "the probe after the backoff")
        assert len(health.requests) == 2
        await wait_until_async(lambda: gone.last_failure is not None, 1.0, "a failure")
        status = peers.status()
        assert [entry["name"] for entry in status] == ["pc", "gone"]
        assert status[1]["last_failure"]["kind"] == "unreachable"
    finally:
        await peers.close()
    assert task.done() and task.exception() is None


async def test_close_ends_a_cancelled_or_unstarted_run_at_once() -> None:
    unstarted = Peers([PeerConfig(name="pc", url="http://10.0.0.2")])
    await asyncio.wait_for(unstarted.close(), 1.0)
    await asyncio.wait_for(unstarted.run(), 1.0)  # closed: returns at once

    cancelled = Peers([PeerConfig(name="pc", url=f"http://127.0.0.1:{closed_port()}")])
    task = asyncio.create_task(cancelled.run())
    await asyncio.sleep(0.1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.wait_for(cancelled.close(), 1.0)

    await asyncio.wait_for(Peers([]).run(), 1.0)  # no peers: nothing to do
