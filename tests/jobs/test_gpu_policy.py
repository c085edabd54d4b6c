"""The GPU path's rules (jobs.gpu_policy), as plain data: the path's state, a GPU start weighed against the
memory free now, the programs the GPU is yielded to, and when it comes back."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tray_app.jobs import gpu_policy
from tray_app.jobs.gpu_policy import Holder, ReturnCheck, StartCheck

MIB = 1024**2
GIB = 1024**3
COMFY = Holder("comfyui (python3, pid 4242)", 3 * GIB)


@pytest.mark.parametrize(
    ("device", "yielded", "free", "held_back", "path"),
    [
        ("normal", False, 2 * GIB, False, "normal"),
        ("normal", False, 100 * MIB, False, "squeezed"),  # below the 400 MiB reserve
        ("normal", False, 2 * GIB, True, "squeezed"),  # a start was held back for want of memory
        ("normal", True, 100 * MIB, False, "yielded"),  # on purpose beats squeezed
        ("lost", True, 2 * GIB, False, "lost"),  # the card is gone: nothing else matters
    ],
)
def test_the_gpu_path_state(device: str, yielded: bool, free: int, held_back: bool, path: str) -> None:
    state = gpu_policy.gpu_path_state(
        device_state=device, yielded=yielded, free_bytes=free, reserve_bytes=400 * MIB, held_back=held_back
    )
    assert state == path


START = StartCheck(
    role="gpu",
    need_bytes=1 * GIB,
    free_bytes=2 * GIB,
    reserve_bytes=400 * MIB,
    n_ctx_per_seq=2048,
    n_gpu_layers=31,
    min_ctx=512,
    min_layers=1,
    holders=(COMFY, Holder("gpu@gemma (llama-server, pid 7)", 300 * MIB)),
)


def test_a_start_that_fits_the_memory_free_now_is_made_as_planned() -> None:
    assert gpu_policy.decide_gpu_start(START) == gpu_policy.StartDecision("start", "")


def test_a_start_that_does_not_fit_takes_the_smaller_plan_within_the_minimums() -> None:
    squeezed = replace(
        START, free_bytes=1 * GIB, smaller_need_bytes=500 * MIB, smaller_ctx=1024, smaller_layers=31
    )
    decision = gpu_policy.decide_gpu_start(squeezed)
    assert decision.action == "smaller"
    assert (
        "1024 tokens per request" in decision.reason
        and "comfyui (python3, pid 4242) holds 3.00 GiB" in decision.reason
    )


def test_what_a_failed_load_lacked_is_weighed_beside_the_plans_need() -> None:
    # 1 GiB + 400 MiB reserve fits 2 GiB; with the 700 MiB its last load lacked it does not.
    learned = replace(START, learned_bytes=700 * MIB)
    decision = gpu_policy.decide_gpu_start(learned)
    assert decision.refused
    assert "needs 1.00 GiB (+700.00 MiB its last load lacked)" in decision.reason
    assert decision.reason.endswith("its last load ran out of memory, 700.00 MiB more held back")
    smaller = replace(learned, smaller_need_bytes=800 * MIB, smaller_ctx=1024, smaller_layers=31)
    assert gpu_policy.decide_gpu_start(smaller).action == "smaller"


def test_a_start_below_the_minimums_or_with_no_room_is_not_made_and_names_who_holds_the_memory() -> None:
    too_small = replace(
        START, free_bytes=1 * GIB, smaller_need_bytes=500 * MIB, smaller_ctx=256, smaller_layers=31
    )
    decision = gpu_policy.decide_gpu_start(too_small)
    assert decision.refused
    assert "below gpu.min_ctx 512" in decision.reason
    # The largest holder first, then Failsoft's own other workers.
    assert decision.reason.endswith(
        "comfyui (python3, pid 4242) holds 3.00 GiB; gpu@gemma (llama-server, pid 7) holds 300.00 MiB"
    )
    no_room = gpu_policy.decide_gpu_start(replace(START, free_bytes=1 * GIB))
    assert no_room.refused and "needs 1.00 GiB and the 400.00 MiB reserve, 1.00 GiB free" in no_room.reason


@pytest.mark.parametrize("path", ["yielded", "lost"])
def test_nothing_starts_on_a_yielded_or_lost_gpu(path: gpu_policy.GpuPath) -> None:
    decision = gpu_policy.decide_gpu_start(replace(START, path=path))
    assert decision.refused and path in decision.reason


def test_holders_are_named_largest_first_and_a_long_list_is_cut() -> None:
    many = [Holder(f"p{i}", i * MIB) for i in range(5)]
    assert (
        gpu_policy.holders_text(many) == "p4 holds 4.00 MiB; p3 holds 3.00 MiB; p2 holds 2.00 MiB; and 2 more"
    )
    assert "no other program is listed" in gpu_policy.holders_text([])


def test_yield_targets_match_names_or_labels_as_shell_patterns_in_any_case() -> None:
    programs = [
        gpu_policy.Program("python3", "ComfyUI", "ComfyUI (python3, pid 1)", GIB),
        gpu_policy.Program("steam_app_42", "", "steam_app_42 (pid 2)", GIB),
        gpu_policy.Program("llama-server", "gpu", "gpu (llama-server, pid 3)", GIB),
    ]
    found = gpu_policy.yield_targets(programs, ["comfyui", "Steam*", " "])
    assert [p.describe for p in found] == ["ComfyUI (python3, pid 1)", "steam_app_42 (pid 2)"]
    assert gpu_policy.yield_targets(programs, []) == []


RETURN = ReturnCheck(
    manual=False,
    resume_asked=False,
    targets_present=False,
    fits_now=True,
    fits_since=100.0,
    now=131.0,
    return_after=30.0,
    recent_returns=(),
    max_returns=2,
    return_window=600.0,
)


def test_the_gpu_returns_once_the_memory_stayed_free_for_return_after() -> None:
    assert gpu_policy.decide_return(RETURN).action == "return"
    early = gpu_policy.decide_return(replace(RETURN, now=110.0))
    assert (early.action, early.at) == ("wait", 130.0)
    assert gpu_policy.decide_return(replace(RETURN, fits_now=False, fits_since=None)).action == "wait"
    assert gpu_policy.decide_return(replace(RETURN, targets_present=True)).action == "wait"


def test_no_flapping_returns_are_bounded_per_window() -> None:
    flapping = gpu_policy.decide_return(replace(RETURN, recent_returns=(0.0, 50.0)))
    assert flapping.action == "wait" and flapping.at == 600.0 and "gpu.max_returns" in flapping.reason
    old = gpu_policy.decide_return(replace(RETURN, now=700.0, fits_since=600.0, recent_returns=(0.0, 50.0)))
    assert old.action == "return"  # those returns are out of the window now


def test_a_manual_yield_is_held_until_resumed_and_then_returns_at_once_if_it_fits() -> None:
    held = gpu_policy.decide_return(replace(RETURN, manual=True))
    assert held.action == "hold" and "failsoft resume" in held.reason
    resumed = replace(RETURN, resume_asked=True, targets_present=True, now=100.0)
    assert gpu_policy.decide_return(resumed).action == "return"
    assert gpu_policy.decide_return(replace(resumed, fits_now=False, fits_since=None)).action == "wait"


def test_a_job_routed_off_the_gpu_says_what_the_gpu_path_is() -> None:
    assert gpu_policy.why_not_gpu("normal", "") == ""
    assert gpu_policy.why_not_gpu("yielded", "comfyui (python3, pid 1) appeared") == (
        "the GPU is yielded to another program: comfyui (python3, pid 1) appeared"
    )
    assert gpu_policy.why_not_gpu("squeezed", "x").startswith("the GPU is squeezed by another program")
    assert gpu_policy.why_not_gpu("lost", "NVML: GPU is lost") == "the GPU is lost: NVML: GPU is lost"
