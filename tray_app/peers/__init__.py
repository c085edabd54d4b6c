"""Peers: other machines' OpenAI-compatible servers (best another Failsoft), used as a worker tier between
the local GPU and the local CPU.

`address.py` (where plain HTTP may go), `health.py` (one probe: `GET /health`, read as Failsoft's or
llama-server's answer), `peer.py` (`Peer`: one peer as a worker, its state and backoff), `directory.py`
(`Peers`: all of them, and the task that probes them). Imports `tray_app.config` and `tray_app.contract`
only: the job engine takes a `Peer` as a `Worker` by its shape."""

from __future__ import annotations

from tray_app.peers.address import plain_http_allowed_host, resolved_is_local
from tray_app.peers.directory import Peers
from tray_app.peers.peer import Peer, PeerState, ProbeSchedule

__all__ = ["Peer", "PeerState", "Peers", "ProbeSchedule", "plain_http_allowed_host", "resolved_is_local"]
