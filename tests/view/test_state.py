"""The tray's level and tooltip from a status dict."""

from __future__ import annotations

from tests.support.status_samples import make_library_status, make_status
from tray_app.view.state import (
    DEGRADED,
    DOWN,
    SERVING,
    WHERE_WORDS,
    device_name,
    gpu_guests,
    library,
    model_line,
    summarize,
)


def test_gpu_ready_is_serving_and_marked_simulated() -> None:
    summary = summarize(make_status(), reachable=True)
    assert summary.level == SERVING
    assert summary.simulated
    assert summary.tooltip.startswith("Failsoft: GPU serving")
    assert "simulated 4.00 GiB" in summary.tooltip
    assert "context 4,096 × 2 parallel" in summary.tooltip
    assert "\n" not in summary.tooltip


def test_active_fallback_is_degraded_even_with_gpu_ready() -> None:
    summary = summarize(make_status(), reachable=True, active_fallbacks=2)
    assert summary.level == DEGRADED
    assert summary.headline == "GPU serving, 2 jobs on CPU fallback"


def test_restarting_gpu_is_degraded_and_says_cpu_serves() -> None:
    summary = summarize(make_status(gpu="restarting"), reachable=True)
    assert summary.level == DEGRADED
    assert summary.headline == "GPU worker restarting, CPU serving"


def test_failed_gpu_with_cpu_ready_is_degraded() -> None:
    assert summarize(make_status(gpu="failed"), reachable=True).level == DEGRADED


def test_both_workers_gone_is_down() -> None:
    summary = summarize(make_status(gpu="failed", cpu="stopped"), reachable=True)
    assert summary.level == DOWN
    assert summary.headline == "GPU worker failed, CPU worker stopped"


def test_unreachable_service_is_down() -> None:
    summary = summarize(make_status(), reachable=False)
    assert summary.level == DOWN
    assert "not reachable" in summary.tooltip


def test_tooltip_counts_queue_and_approvals() -> None:
    summary = summarize(make_status(pending=3, depth=2), reachable=True)
    assert "2 queued" in summary.tooltip
    assert "3 awaiting approval" in summary.tooltip


def test_real_gpu_shows_its_name() -> None:
    status = make_status(simulated=False)
    status["device"]["name"] = "NVIDIA GeForce RTX 4090"
    summary = summarize(status, reachable=True)
    assert not summary.simulated
    assert "NVIDIA GeForce RTX 4090 4.00 GiB" in summary.tooltip
    assert "simulated" not in summary.tooltip


def test_starting_service_is_amber_not_down() -> None:
    summary = summarize(None, reachable=False, starting=True)
    assert summary.level == DEGRADED
    assert summary.headline == "Starting the service…"
    # Once the service answers, its own state wins.
    assert summarize(make_status(), reachable=True, starting=True).level == SERVING


# Every value of ModelStatus.where (until the contract names them).
WHERE_VALUES = ("gpu", "cpu", "gpu+cpu", "loading", "unloading", "not loaded")  # ModelStatus.where


def test_every_place_a_model_can_be_has_words() -> None:
    missing = [where for where in WHERE_VALUES if where not in WHERE_WORDS]
    assert not missing, f"no words in the tray for {missing}"


def test_a_model_line_names_where_vram_and_the_keep_alive() -> None:
    main, gemma, phi = library(make_library_status())
    assert (
        model_line(main) == "qwen3-0.6b · main · on the GPU and the CPU · 344.00 MiB VRAM · 1 request running"
    )
    assert model_line(gemma) == "gemma3-270m · on the GPU · 300.00 MiB VRAM · unloads in 42 s"
    assert model_line(dict(gemma, unload_in=754.0)) == (
        "gemma3-270m · on the GPU · 300.00 MiB VRAM · unloads in 12 min 34 s"
    )
    assert model_line(phi) == "phi-4-mini · not loaded"
    assert model_line(dict(phi, where="loading")) == "phi-4-mini · loading…"


def test_only_other_models_holding_vram_are_gpu_guests() -> None:
    assert [m["name"] for m in gpu_guests(make_library_status())] == ["gemma3-270m"]
    assert gpu_guests(make_status()) == []


def test_an_unknown_device_keeps_its_own_name() -> None:
    assert (device_name("gpu"), device_name("cpu"), device_name("npu")) == ("GPU", "CPU", "NPU")
