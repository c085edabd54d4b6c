"""The peers (other machines' servers, `[[peers]]`) in words, one line each, from the status's `peers`.
Plain data, no Qt."""

from __future__ import annotations

from tests.support.status_samples import GAMING_PC, NAS, make_status, with_peers
from tray_app.view.peers import peer_lines, peer_views


def test_a_ready_peer_says_its_gpu_and_a_down_one_why_and_when_it_is_tried_again() -> None:
    assert peer_lines(with_peers(GAMING_PC, NAS)) == [
        "gaming-pc  ready (GPU)  http://192.168.1.20:8750",
        "nas  down: unreachable (next try in 12 s)  http://192.168.1.30:8080",
    ]


def test_the_details_say_what_a_peer_is_asked_for_and_its_last_failure() -> None:
    gaming_pc, nas = peer_views(with_peers(GAMING_PC, NAS))
    assert gaming_pc.details == ("priority 0 · 2 slots · serves qwen3-8b",)
    assert nas.details == (
        "priority 1 · 1 slot · serves the main model",
        "last failure: unreachable: GET /health: ConnectError: refused",
    )
    assert (gaming_pc.state, nas.state) == ("ready", "down")


def test_a_peer_not_asked_yet_or_not_saying_its_gpu_is_not_called_ready_on_a_gpu() -> None:
    never = {**NAS, "state": "unknown", "last_failure": None, "next_probe_in": None}
    plain = {**GAMING_PC, "gpu_ready": None}  # a plain llama-server does not report its GPU
    its_gpu = {**NAS, "gpu_ready": False, "last_failure": {"kind": "peer_gpu_unavailable", "message": "m"}}
    assert [view.state_text for view in peer_views(with_peers(never, plain, its_gpu))] == [
        "not asked yet",
        "ready",
        "down: its GPU not ready (next try in 12 s)",
    ]


def test_a_request_failure_keeps_its_code_rather_than_words_about_this_machines_gpu() -> None:
    hung = {**NAS, "last_failure": {"kind": "hung", "message": "no token for 60 s"}}
    (view,) = peer_views(with_peers(hung))
    assert view.state_text == "down: hung (next try in 12 s)"
    assert "GPU worker" not in view.line


def test_a_status_without_peers_has_no_lines() -> None:
    assert peer_lines(make_status()) == []
    assert peer_lines(None) == []
    assert peer_lines(with_peers()) == []
