"""A peer probed against a real server on loopback: a Failsoft whose GPU is ready (ready) or not (down: a
peer stands in for a GPU), a plain llama-server (ready, its GPU unknown), an error status, a closed port,
a silent one, a name resolving to a public address over plain HTTP; and what a request to it carries."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.peers.health_server import (
    FAILSOFT_GPU_READY,
    FAILSOFT_GPU_RESTARTING,
    Health,
    closed_port,
    resolving,
)
from tests.support.http_server import silent_listener
from tray_app.config import PeerConfig
from tray_app.jobs.worker_port import Worker
from tray_app.peers import Peer, ProbeSchedule

Served = tuple[Health, str]


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False) as shared:
        yield shared


def peer_at(url: str, **keys: object) -> Peer:
    return Peer(PeerConfig(name="gaming-pc", url=url, **keys))  # type: ignore[arg-type]


async def test_a_failsoft_peer_with_its_gpu_ready_is_ready(client: httpx.AsyncClient, served: Served) -> None:
    health, url = served
    health.answer(200, FAILSOFT_GPU_READY)
    peer = peer_at(url + "/")
    assert (peer.state, peer.base_url, peer.gpu_ready) == ("unknown", None, None)
    assert await peer.probe(client)
    assert (peer.state, peer.base_url, peer.gpu_ready, peer.last_failure) == ("ready", url, True, None)
    assert [path for path, _ in health.requests] == ["/health"]


async def test_a_failsoft_peer_whose_gpu_is_not_ready_is_down(
    client: httpx.AsyncClient, served: Served
) -> None:
    health, url = served
    health.answer(200, FAILSOFT_GPU_RESTARTING)
    peer = peer_at(url)
    assert not await peer.probe(client)
    assert (peer.state, peer.base_url, peer.gpu_ready) == ("down", None, False)
    assert peer.last_failure is not None
    assert peer.last_failure["kind"] == "peer_gpu_unavailable"
    assert "restarting" in peer.last_failure["message"]
    health.answer(200, {"status": "ok", "workers": {"cpu": "ready"}})  # a Failsoft without a GPU
    assert not await peer.probe(client)
    assert (peer.gpu_ready, peer.last_failure["kind"]) == (False, "peer_gpu_unavailable")
    health.answer(200, FAILSOFT_GPU_READY)
    assert await peer.probe(client)
    assert (peer.state, peer.gpu_ready) == ("ready", True)


async def test_a_llama_server_peer_is_ready_without_saying_what_it_runs_on(
    client: httpx.AsyncClient, served: Served
) -> None:
    _, url = served  # {"status": "ok"}
    peer = peer_at(url)
    assert await peer.probe(client)
    assert (peer.state, peer.gpu_ready) == ("ready", None)


async def test_a_long_body_is_read_no_further_than_64_kib(client: httpx.AsyncClient, served: Served) -> None:
    health, url = served
    health.answer(200, b'{"status": "ok", "padding": "' + b"x" * 200_000 + b'", "workers": {"gpu": "down"}}')
    peer = peer_at(url)
    assert await peer.probe(client)  # cut off: not a Failsoft answer it can read
    assert (peer.state, peer.gpu_ready) == ("ready", None)


@pytest.mark.parametrize("status", [503, 401, 404, 302])
async def test_an_error_status_is_unhealthy(client: httpx.AsyncClient, served: Served, status: int) -> None:
    health, url = served
    health.answer(status, FAILSOFT_GPU_READY)
    peer = peer_at(url)
    assert not await peer.probe(client)
    assert peer.state == "down" and peer.last_failure is not None
    assert (peer.last_failure["kind"], peer.last_failure["message"]) == (
        "unhealthy",
        f"GET /health answered {status}",
    )


async def test_a_closed_port_is_unreachable(client: httpx.AsyncClient) -> None:
    peer = peer_at(f"http://127.0.0.1:{closed_port()}")
    assert not await peer.probe(client)
    assert peer.state == "down" and peer.last_failure is not None
    assert peer.last_failure["kind"] == "unreachable"
    assert "ConnectError" in peer.last_failure["message"]
    assert isinstance(peer.last_failure["at"], float)


async def test_a_silent_peer_is_unreachable_after_the_probe_timeout(client: httpx.AsyncClient) -> None:
    with silent_listener() as port:
        peer = Peer(PeerConfig(name="p", url=f"http://127.0.0.1:{port}"), schedule=ProbeSchedule(timeout=0.3))
        started = asyncio.get_running_loop().time()
        assert not await peer.probe(client)
        took = asyncio.get_running_loop().time() - started
    assert peer.last_failure is not None and peer.last_failure["kind"] == "unreachable"
    assert "within 0.3 s" in peer.last_failure["message"]
    assert 0.25 < took < 2.0


async def test_a_lan_name_resolving_to_a_public_address_is_not_asked_over_plain_http(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", resolving({"gaming-pc": ["8.8.8.8"]}))
    peer = peer_at("http://gaming-pc:8750")
    assert not await peer.probe(client)
    assert peer.state == "down" and peer.last_failure is not None
    assert peer.last_failure["kind"] == "insecure"
    assert "plain HTTP only on the local network; use https://" in peer.last_failure["message"]
    unknown = peer_at("http://nowhere:8750")
    assert not await unknown.probe(client)
    assert unknown.last_failure is not None and unknown.last_failure["kind"] == "unreachable"


async def test_a_local_name_is_resolved_then_asked(client: httpx.AsyncClient, served: Served) -> None:
    _, url = served
    peer = peer_at(url.replace("127.0.0.1", "localhost"))
    assert await peer.probe(client)


async def test_a_request_carries_the_peers_key_and_nothing_else(
    client: httpx.AsyncClient, served: Served
) -> None:
    health, url = served
    keyed = peer_at(url, api_key="sk-peer")
    plain = peer_at(url)
    await keyed.probe(client)
    await plain.probe(client)
    assert keyed.request_headers == {"Authorization": "Bearer sk-peer"}
    assert plain.request_headers == {}
    (_, sent_keyed), (_, sent_plain) = health.requests
    assert sent_keyed["Authorization"] == "Bearer sk-peer"
    assert "Authorization" not in sent_plain
    assert not any(name.lower().startswith("x-failsoft") for name in sent_keyed)


def test_the_status_shows_no_key_and_no_more_of_the_url_than_its_origin() -> None:
    peer = peer_at("https://ai.example.org:8443/", api_key="sk-peer-secret", models=["gemma"], priority=2)
    status = peer.status()
    assert "sk-peer-secret" not in str(status)
    assert status == {
        "name": "gaming-pc",
        "url": "https://ai.example.org:8443",
        "state": "unknown",
        "gpu_ready": None,
        "priority": 2,
        "slots": 4,
        "models": ["gemma"],
        "last_failure": None,
        "next_probe_in": None,
    }


def test_what_it_serves() -> None:
    main_only = peer_at("http://10.0.0.2")
    assert main_only.serves("SmolLM2", main_model="SmolLM2")
    assert not main_only.serves("gemma", main_model="SmolLM2")
    listed = peer_at("http://10.0.0.2", models=["gemma", "default"])
    assert listed.serves("gemma", main_model="SmolLM2") and listed.serves("default", main_model="SmolLM2")
    assert not listed.serves("SmolLM2", main_model="SmolLM2")


async def test_a_peer_has_the_shape_of_a_worker() -> None:
    """The engine takes a Peer as a `Worker` by its shape (this package does not import the engine)."""
    peer = peer_at("http://10.0.0.2")
    members = [name for name in vars(Worker) if not name.startswith("_")]
    assert {"state", "base_url", "pid", "ensure_ready", "mark_unhealthy"} <= set(members)
    for name in members:
        wanted, found = getattr(Worker, name), getattr(Peer, name)
        if isinstance(wanted, property):
            assert isinstance(found, property), name
        else:
            assert inspect.signature(found) == inspect.signature(wanted), name
            assert inspect.iscoroutinefunction(found) == inspect.iscoroutinefunction(wanted), name
    assert (peer.role, peer.pid) == ("peer:gaming-pc", None)
    assert await peer.failure_of(1234, timeout=5.0) is None
    peer.note_tokens(10)
