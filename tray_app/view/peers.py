"""The peers (`status["peers"]`: other machines' servers, `[[peers]]`, the tier between this machine's GPU
and its CPU) in words, one line each, for `failsoft status` and the tray's menu. No Qt here.

A peer stands in for a GPU: "ready (GPU)" says a Failsoft peer's GPU worker is ready; a server that does not
report its GPU (a plain llama-server) is just "ready"."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tray_app.contract.status import ServiceStatus
from tray_app.contract.vocabulary import Reason
from tray_app.view.state import format_duration

NOT_ASKED = "not asked yet"  # a peer's state before its first probe ("unknown")
# Why a peer is down, in a few words: its probe's failure kinds (peers/health.py), and a request it failed.
# A failure kind of a request (hung, exited, ...) keeps its code: the reason table's words for those name
# this machine's GPU worker. The status page's script has the same table (PEER_FAILURE_WORDS in app.js).
PEER_FAILURE_WORDS = {
    "unreachable": "unreachable",
    "unhealthy": "unhealthy",
    "insecure": "insecure address",
    "peer_gpu_unavailable": "its GPU not ready",
    Reason.PEER_FAILED: "other machine failed",
}


@dataclass(frozen=True)
class PeerView:
    name: str
    state: str  # unknown, ready or down (the status's own word, for a colour)
    state_text: str  # "ready (GPU)", "down: unreachable (next try in 12 s)", "not asked yet"
    url: str  # scheme://host:port: the status never holds a path or a key
    details: tuple[str, ...]  # "priority 1 · 2 slots · serves qwen3-8b", "last failure: unreachable: ..."

    @property
    def line(self) -> str:
        """ "gaming-pc  ready (GPU)  http://192.168.1.20:8750"."""
        return "  ".join(part for part in (self.name, self.state_text, self.url) if part)


def peer_state_text(peer: Mapping[str, Any]) -> str:
    """The peer's state in a few words: ready (and whether its GPU is), down (why, and when it is asked
    again), or not asked yet."""
    state = str(peer.get("state") or "unknown")
    if state == "ready":
        return "ready (GPU)" if peer.get("gpu_ready") is True else "ready"
    if state == "down":
        failure = peer.get("last_failure") or {}
        kind = str(failure.get("kind") or "") if isinstance(failure, Mapping) else ""
        why = PEER_FAILURE_WORDS.get(kind, kind)
        text = f"down: {why}" if why else "down"
        next_probe_in = peer.get("next_probe_in")
        if isinstance(next_probe_in, int | float) and not isinstance(next_probe_in, bool):
            text += f" (next try in {format_duration(next_probe_in)})"
        return text
    return NOT_ASKED if state == "unknown" else state


def peer_details(peer: Mapping[str, Any]) -> tuple[str, ...]:
    """What a peer is asked for and how (its priority, its slots, its models: the main model when it lists
    none), and its last failure, in the words of the workers' lines."""
    parts = []
    if isinstance(peer.get("priority"), int):
        parts.append(f"priority {peer['priority']}")
    slots = peer.get("slots")
    if slots:
        parts.append(f"{slots} slot" if slots == 1 else f"{slots} slots")
    models = [str(model) for model in peer.get("models") or []]
    parts.append(f"serves {', '.join(models) if models else 'the main model'}")
    details = [" · ".join(parts)]
    failure = peer.get("last_failure")
    if isinstance(failure, Mapping) and failure.get("kind"):
        details.append(f"last failure: {failure['kind']}: {failure.get('message') or ''}".rstrip(": "))
    return tuple(details)


def peer_view(peer: Mapping[str, Any]) -> PeerView:
    return PeerView(
        name=str(peer.get("name") or "?"),
        state=str(peer.get("state") or "unknown"),
        state_text=peer_state_text(peer),
        url=str(peer.get("url") or ""),
        details=peer_details(peer),
    )


def peer_views(status: ServiceStatus | None) -> list[PeerView]:
    """The status's peers in config order; none from a service without peers (or an older one)."""
    peers = status.get("peers") if status else None
    return [peer_view(peer) for peer in peers or [] if isinstance(peer, Mapping)]


def peer_lines(status: ServiceStatus | None) -> list[str]:
    """One line per peer: "gaming-pc  ready (GPU)  http://192.168.1.20:8750"."""
    return [view.line for view in peer_views(status)]
