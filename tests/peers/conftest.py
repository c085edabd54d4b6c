"""One loopback peer server per test module (starting and stopping one takes half a second), its answer
set back to llama-server's `{"status": "ok"}` for each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.peers.health_server import Health, peer_server


@pytest.fixture(scope="module")
def module_peer() -> Iterator[tuple[Health, str]]:
    health = Health()
    with peer_server(health) as url:
        yield health, url


@pytest.fixture
def served(module_peer: tuple[Health, str]) -> tuple[Health, str]:
    """(what the server answers, its base URL), as a new server would start."""
    health, url = module_peer
    health.reset()
    return health, url
