"""Two services for the drill's peer scenarios and the peer bench: a peer B (`failsoft serve` on its own
simulated GPU, with an API key, as another machine's Failsoft would have) and the service A under test, whose
`[[peers]]` names B. Both run from temporary directories (launcher.launched_service) and are stopped leaving
nothing, B also when a scenario has killed it."""

from __future__ import annotations

import contextlib
import copy
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tray_app.drill.launcher import launched_service
from tray_app.host.launch import ServeProcess

PEER_NAME = "drill-peer"


@dataclass(frozen=True)
class PeerSide:
    """The peer B as the drill reaches it: its name in A's `[[peers]]`, where it listens, its serve process
    (a scenario kills it), its API key and its control API's token (to read the jobs it ran)."""

    name: str
    base_url: str
    pid: int
    api_key: str
    admin: str


def peer_config(settings: dict[str, Any], api_key: str) -> dict[str, Any]:
    """B's config: the drill's own, with an API key (A sends it, as to another machine), no peers and no CPU
    mirror: on one machine B's mirror would read each prompt beside B's simulated GPU, on the same cores,
    and nothing asks B's CPU for anything."""
    data = copy.deepcopy(settings)
    data["server"]["api_key"] = api_key
    data["cpu"]["mirror"] = False
    data["peers"] = []
    return data


def with_peer(settings: dict[str, Any], url: str, api_key: str) -> dict[str, Any]:
    """A's config: the drill's own, B its one peer."""
    data = copy.deepcopy(settings)
    data["peers"] = [{"name": PEER_NAME, "url": url, "api_key": api_key}]
    return data


@contextlib.contextmanager
def launched_pair(settings: dict[str, Any]) -> Iterator[tuple[ServeProcess, PeerSide]]:
    """B, then A with B as its peer, both from `settings`; yields A and B once both have their workers ready
    (A may not have probed B yet: `/failsoft/status` `peers` says when it has)."""
    api_key = secrets.token_urlsafe(24)
    with launched_service(peer_config(settings, api_key)) as peer:
        side = PeerSide(PEER_NAME, peer.base_url, peer.process.pid, api_key, peer.admin_token)
        with launched_service(with_peer(settings, peer.base_url, api_key)) as service:
            yield service, side
