"""The badges under an answer: who served it, why, and how fast; which model on which device. Plain data,
no Qt."""

from __future__ import annotations

import pytest

from tray_app.view.answer import (
    MODEL_NAME_CHARS,
    Badge,
    answer_badge,
    job_info,
    model_badge,
    short_model_name,
    with_header_model,
)


@pytest.mark.parametrize(
    ("failsoft", "simulated", "expected"),
    [
        (
            {"worker": "gpu", "attempts": 1, "fallback_reason": None},
            True,
            Badge("gpu", "GPU (simulated) · 40.0 tok/s"),
        ),
        ({"worker": "gpu", "attempts": 1, "fallback_reason": None}, False, Badge("gpu", "GPU · 40.0 tok/s")),
        (
            {"worker": "cpu", "attempts": 2, "fallback_reason": "oom_decode"},
            True,
            Badge("failover", "Failed over to CPU: GPU out of memory · 40.0 tok/s"),
        ),
        (
            {"worker": "cpu", "attempts": 1, "fallback_reason": "exceeds_gpu_profile"},
            True,
            Badge("cpu", "CPU: too large for the GPU profile · 40.0 tok/s"),
        ),
        (
            {"worker": "cpu", "attempts": 1, "fallback_reason": "approval_required"},
            True,
            Badge("cpu", "CPU, approved by you · 40.0 tok/s"),
        ),
    ],
)
def test_badge_names_worker_reason_and_speed(
    failsoft: dict[str, object], simulated: bool, expected: Badge
) -> None:
    badge = answer_badge(failsoft, tokens=80, seconds=2.0, simulated=simulated)
    assert (badge.kind, badge.text) == (expected.kind, expected.text)


def test_tooltip_spells_out_the_reason_code() -> None:
    badge = answer_badge({"worker": "cpu", "attempts": 2, "fallback_reason": "crash_abort"}, 10, 1.0)
    assert badge.detail == "Reason: the GPU worker crashed (crash_abort); attempts: 2"


def test_no_rate_from_a_single_token() -> None:
    assert answer_badge({"worker": "gpu", "attempts": 1}, tokens=1, seconds=0.5).text == "GPU"


STAND_IN = {
    "worker": "gpu@gemma3-270m",
    "attempts": 1,
    "fallback_reason": None,
    "model": "gemma3-270m",
    "device": "gpu",
    "stand_in_for": "qwen3-8b",
}


def test_a_stand_in_answer_names_the_model_and_the_one_it_stood_in_for() -> None:
    assert answer_badge(STAND_IN, tokens=80, seconds=2.0).text == "GPU · 40.0 tok/s"
    badge = model_badge(STAND_IN)
    assert badge is not None
    assert (badge.kind, badge.text) == ("stand_in", "gemma3-270m on GPU · stand-in for qwen3-8b")
    assert badge.detail == (
        "Answered by gemma3-270m on the GPU, standing in for qwen3-8b, which could not answer on the GPU"
    )


@pytest.mark.parametrize(
    "failsoft",
    [
        {"worker": "cpu@gemma3-270m", "attempts": 1, "model": "gemma3-270m", "device": "cpu"},
        {"worker": "cpu@gemma3-270m", "attempts": 1, "model": "gemma3-270m"},  # no device: from the role
        {"worker": "cpu", "attempts": 1, "model": "gemma3-270m", "device": "cpu", "stand_in_for": None},
    ],
)
def test_a_cpu_answer_is_never_called_gpu(failsoft: dict[str, object]) -> None:
    badge = answer_badge(failsoft, tokens=80, seconds=2.0)
    assert (badge.kind, badge.text) == ("cpu", "CPU · 40.0 tok/s")
    named = model_badge(failsoft)
    assert named is not None and (named.kind, named.text) == ("cpu", "gemma3-270m on CPU")


def test_the_main_model_on_the_gpu() -> None:
    badge = model_badge({"worker": "gpu", "model": "qwen3-8b", "device": "gpu", "stand_in_for": None})
    assert badge is not None and (badge.kind, badge.text) == ("gpu", "qwen3-8b on GPU")


def test_a_service_that_names_no_model_shows_no_model_badge() -> None:
    assert model_badge({"worker": "gpu", "attempts": 1}) is None


def test_headers_fill_in_the_model_but_not_a_device_the_answer_contradicts() -> None:
    headers = {"x-failsoft-model": "qwen3-8b", "x-failsoft-device": "gpu"}
    # A job read back after a failover: its worker is the CPU, whatever the first headers said.
    info = with_header_model({"worker": "cpu", "attempts": 2, "fallback_reason": "oom_decode"}, headers)
    named = model_badge(info)
    assert named is not None and named.text == "qwen3-8b on CPU"
    assert answer_badge(info, 0, 0.0).kind == "failover"
    # The answer's own model wins over the headers.
    assert with_header_model(STAND_IN, headers)["model"] == "gemma3-270m"


LONG_MODEL = "Qwen2.5-Coder-32B-Instruct-Q4_K_M.gguf"


def test_a_long_model_name_is_cut_in_the_middle_and_kept_whole_in_the_tooltip() -> None:
    assert short_model_name("SmolLM2-135M-Instruct.Q4_1.gguf") == "SmolLM2-135M-Instruct.Q4_1.gguf"
    short = short_model_name(LONG_MODEL)
    assert len(short) == MODEL_NAME_CHARS
    assert short.startswith("Qwen2.5-Coder-32B") and short.endswith("Q4_K_M.gguf") and "…" in short
    badge = model_badge({"worker": "gpu", "model": LONG_MODEL, "device": "gpu", "stand_in_for": LONG_MODEL})
    assert badge is not None
    assert badge.text == f"{short} on GPU · stand-in for {short}"
    assert badge.detail.count(LONG_MODEL) == 2


PEER = {
    "worker": "peer:gaming-pc",
    "attempts": 2,
    "fallback_reason": "oom_decode",
    "model": "qwen3-8b",
    "device": None,
    "route": "peer",
    "peer": "gaming-pc",
    "stand_in_for": None,
}


def test_a_peers_answer_is_badged_with_the_peer_never_this_machines_gpu_or_cpu() -> None:
    badge = answer_badge(PEER, tokens=80, seconds=2.0)
    assert (badge.kind, badge.text) == (
        "failover",
        "Failed over to gaming-pc: GPU out of memory · 40.0 tok/s",
    )
    assert badge.detail == (
        "Answered on gaming-pc, another machine's GPU. Reason: the GPU ran out of memory while generating "
        "(oom_decode); attempts: 2"
    )
    named = model_badge(PEER)
    assert named is not None and (named.kind, named.text) == ("failover", "qwen3-8b on gaming-pc")
    assert named.detail == "Answered by qwen3-8b on gaming-pc, another machine's GPU"
    for text in (badge.text, named.text, badge.detail, named.detail):
        assert "CPU" not in text and " on GPU" not in text


def test_a_job_routed_to_a_peer_at_admission_and_one_read_back_name_the_peer() -> None:
    admitted = {**PEER, "attempts": 1, "fallback_reason": "gpu_unavailable"}
    assert answer_badge(admitted, 80, 2.0).text == "On gaming-pc: GPU worker unavailable · 40.0 tok/s"
    # A job read back has no failsoft object: its worker's role names the peer.
    read_back = job_info({"worker": "peer:nas", "route": "peer", "attempts": 1, "fallback_reason": None})
    assert answer_badge(read_back, 0, 0.0).text == "On nas"
    # The first headers said this GPU; the answer came from the peer.
    headers = {"x-failsoft-model": "qwen3-8b", "x-failsoft-device": "gpu"}
    info = with_header_model({"route": "peer", "peer": "nas", "attempts": 2}, headers)
    assert "device" not in info
    named = model_badge(info)
    assert named is not None and named.text == "qwen3-8b on nas"


def test_after_a_peer_failed_the_cpu_answer_is_the_cpus() -> None:
    info = {"worker": "cpu", "route": "cpu", "attempts": 3, "fallback_reason": "peer_failed", "device": "cpu"}
    assert answer_badge(info, 80, 2.0).text == "Failed over to CPU: other machine failed · 40.0 tok/s"
