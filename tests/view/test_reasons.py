"""Reason codes in words: every code the service sends has them, in the one table the tray's messages and
the chat's badges read."""

from __future__ import annotations

from tray_app.contract.events import FallbackStarted
from tray_app.contract.vocabulary import FAILURE_KINDS, Reason
from tray_app.view.reasons import (
    REASON_WORDS,
    fallback_place,
    fallback_target,
    fallback_to,
    moves_to_peer,
    peer_name,
    reason_text,
    short_reason,
)

# The error codes of /failsoft/models/{name}/load and /unload (until the contract names them).
MODEL_CONTROL_CODES = ("model_does_not_fit", "model_not_found", "model_busy", "main_model")


def test_every_reason_has_words() -> None:
    missing = [code for code in Reason if code not in REASON_WORDS]
    assert not missing, f"no words in the tray for {missing}"


def test_every_failure_kind_and_model_control_error_has_words() -> None:
    missing = [code for code in (*FAILURE_KINDS, *MODEL_CONTROL_CODES) if code not in REASON_WORDS]
    assert not missing, f"no words in the tray for {missing}"


def test_a_code_that_is_a_reason_is_keyed_by_its_member() -> None:
    # A bare string key for a Reason would survive a renamed member; the member itself would not.
    bare = [key for key in REASON_WORDS if key in set(Reason) and not isinstance(key, Reason)]
    assert not bare, f"key these by their Reason member: {bare}"


def test_the_long_words_keep_the_code_and_the_short_ones_fall_back_to_it() -> None:
    assert reason_text("oom_decode") == "the GPU ran out of memory while generating (oom_decode)"
    assert reason_text("something_new") == "something_new"
    assert reason_text("") == "no reason given"
    assert short_reason(Reason.EXCEEDS_GPU_PROFILE) == "too large for the GPU profile"
    assert short_reason(Reason.CPU_TOO_SLOW) == "cpu_too_slow"  # no badge words: the code itself
    assert short_reason("something_new") == "something_new"


def test_a_fallback_to_the_cpu_says_the_cpu_and_one_to_a_peer_names_the_peer() -> None:
    assert (fallback_target("cpu"), fallback_place("cpu"), fallback_place("cpu", aside=True)) == (
        "the CPU",
        "the CPU",
        "the CPU",
    )
    assert fallback_target("peer:gaming-pc") == "gaming-pc"
    assert fallback_place("peer:gaming-pc") == "gaming-pc, another machine's GPU"
    assert fallback_place("peer:gaming-pc", aside=True) == "gaming-pc (another machine's GPU)"
    # The route alone names no peer: still never "the CPU".
    assert (fallback_target("peer"), fallback_place("peer")) == ("another machine", "another machine's GPU")


def test_only_a_peers_role_is_a_peer() -> None:
    assert peer_name("peer:nas") == "nas"
    assert [peer_name(role) for role in ("cpu", "gpu", "cpu@gemma3-270m", "")] == [None] * 4


def test_an_older_services_fallback_names_no_place_and_went_to_the_cpu() -> None:
    assert fallback_to({"type": "fallback_started", "job_id": "j", "reason": "oom_decode"}) == "cpu"
    assert not moves_to_peer({"type": "fallback_started", "job_id": "j", "reason": "oom_decode"})
    assert moves_to_peer(FallbackStarted(job_id="j", reason="oom_decode", to="peer:nas").to_dict())
    assert not moves_to_peer({"type": "fallback_refused", "to": "peer:nas"})
