"""A GPU start weighed on the device now (host.gpu_start) with the bundled model's real plan: as planned when
it fits, a smaller plan when only that fits, none (naming who holds the memory) when nothing does."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tray_app.budget.device import SimulatedDevice
from tray_app.budget.library_plan import ModelPlans
from tray_app.budget.plan_set import PlanSet, plan_from_config
from tray_app.config import Config, from_dict
from tray_app.device.snapshot import DeviceProcess, DeviceSnapshot
from tray_app.engine.profile import WorkerProfile
from tray_app.host.gpu_start import GpuStarts, weigh
from tray_app.sizes import format_size
from tray_app.supervisor.profile import profiles_from_plans

GIB = 1024**3
TOTAL = 4 * GIB


@dataclass
class Plans:
    cfg: Config
    plan_set: PlanSet

    def library_plans(self, name: str) -> ModelPlans | None:
        return None


@pytest.fixture(scope="module")
def plans() -> Plans:
    cfg = Config()
    return Plans(cfg, plan_from_config(cfg, gpu=SimulatedDevice(TOTAL)))


@pytest.fixture(scope="module")
def gpu(plans: Plans) -> WorkerProfile:
    profile = profiles_from_plans(plans.cfg, plans.plan_set).gpu
    assert profile is not None
    return profile


def device_with(hog_bytes: int) -> DeviceSnapshot:
    """The simulated GPU with a hog holding `hog_bytes` (the GPU worker itself is down: about to start)."""
    hog = DeviceProcess(4242, "python3", hog_bytes, False, "comfyui")
    return DeviceSnapshot(
        0.0, "simulated", "simulated GPU", True, "normal", TOTAL, TOTAL - hog_bytes, hog_bytes, (hog,)
    )


def test_a_start_that_fits_keeps_its_plan_and_meets_the_device_as_it_is(
    plans: Plans, gpu: WorkerProfile
) -> None:
    weighed = weigh(plans, gpu, device_with(1 * GIB), "normal")
    assert weighed.decision.action == "start" and weighed.profile is not None
    assert weighed.profile.n_ctx == gpu.n_ctx
    assert weighed.profile.simulated_vram_bytes == 3 * GIB  # free now, not the size of the card
    assert weighed.need_bytes == plans.plan_set.gpu.used_bytes


def test_a_context_cap_below_the_gpu_floor_still_starts_as_configured() -> None:
    """max_ctx 512 over two slots plans 256 tokens per request, below gpu.min_ctx 512: that is the user's
    choice, not a squeeze, so the start is made as planned."""
    cfg = from_dict({"budget": {"max_ctx": 512}})
    capped = Plans(cfg, plan_from_config(cfg, gpu=SimulatedDevice(TOTAL)))
    profile = profiles_from_plans(cfg, capped.plan_set).gpu
    assert profile is not None and capped.plan_set.gpu.n_ctx_per_seq < cfg.gpu.min_ctx
    weighed = weigh(capped, profile, device_with(0), "normal")
    assert weighed.decision.action == "start", weighed.decision.reason
    assert weighed.profile is not None and weighed.profile.n_ctx == profile.n_ctx


def test_a_start_that_only_fits_smaller_gets_the_smaller_plan(plans: Plans, gpu: WorkerProfile) -> None:
    plan = plans.plan_set.gpu
    free = plan.reserve_bytes + plan.used_bytes // 2
    # The main model's name (model.name, as for a model from Ollama's store), not its file's.
    named = Plans(from_dict({"model": {"name": "smollm2:135m"}}), plans.plan_set)
    weighed = weigh(named, gpu, device_with(TOTAL - free), "normal")
    assert weighed.decision.action == "smaller", weighed.decision.reason
    assert weighed.profile is not None and weighed.profile.n_ctx < gpu.n_ctx
    assert weighed.profile.model_name == "smollm2:135m"
    assert weighed.need_bytes + plan.reserve_bytes <= free
    assert "comfyui (python3, pid 4242)" in weighed.decision.reason


def test_a_start_with_no_room_is_not_made_and_says_who_holds_the_memory(
    plans: Plans, gpu: WorkerProfile
) -> None:
    free = plans.plan_set.gpu.reserve_bytes // 2
    weighed = weigh(plans, gpu, device_with(TOTAL - free), "normal")
    assert weighed.profile is None and weighed.decision.refused
    assert weighed.decision.reason.startswith("gpu not started on the GPU")
    assert "comfyui (python3, pid 4242) holds" in weighed.decision.reason


def test_the_gate_records_why_and_what_each_start_holds(plans: Plans, gpu: WorkerProfile) -> None:
    reading = device_with(TOTAL - plans.plan_set.gpu.reserve_bytes // 2)
    starts = GpuStarts(plans, lambda: reading, lambda: "normal")
    refused = starts.gate(gpu)
    assert isinstance(refused, str) and starts.held_back == {"gpu": refused}
    reading = device_with(1 * GIB)
    started = starts.gate(gpu)
    assert isinstance(started, WorkerProfile) and starts.held_back == {}
    assert starts.share_of("gpu") == plans.plan_set.gpu.used_bytes
    cpu = profiles_from_plans(plans.cfg, plans.plan_set).cpu
    assert cpu is not None and starts.gate(cpu) is cpu  # the CPU worker is not weighed


def test_a_load_that_ran_short_makes_the_next_start_smaller_until_the_plans_change(
    plans: Plans, gpu: WorkerProfile
) -> None:
    # The plan fits the device with room to spare, but its load failed, having reached a quarter of the plan
    # beyond what it was weighed to need (the estimate was short on this card): the next start holds that
    # back, and gets a smaller plan.
    plan = plans.plan_set.gpu
    short = plan.used_bytes // 4
    free = plan.used_bytes + plan.reserve_bytes + short // 2
    reading = device_with(TOTAL - free)
    starts = GpuStarts(plans, lambda: reading, lambda: "normal")
    first = starts.gate(gpu)
    assert isinstance(first, WorkerProfile) and first.n_ctx == gpu.n_ctx
    assert starts.learned("gpu") == 0

    failed = plan.used_bytes // 2
    starts.load_ran_short("gpu", failed, plan.used_bytes + short)
    starts.load_ran_short("cpu", failed, plan.used_bytes + short)  # not a GPU worker: nothing to learn
    starts.load_ran_short("gpu", 0, 0)  # no size printed: nothing learned
    assert starts.learned_all() == {"gpu": short}
    smaller = starts.gate(gpu)
    assert isinstance(smaller, WorkerProfile) and smaller.n_ctx < gpu.n_ctx
    assert f"its last load ran out of memory, {format_size(short)} more held back" in starts.notes["gpu"]
    assert starts.share_of("gpu") + short + plan.reserve_bytes <= free

    # Failed again, within what it was weighed to need (someone else took memory, or the driver did): the
    # allocation that failed is held back too.
    starts.load_ran_short("gpu", failed, starts.share_of("gpu") - 1)
    assert starts.learned("gpu") == short + failed

    # A new plan set (the device changed, `replan`) starts from the estimate again.
    plans.plan_set = plan_from_config(plans.cfg, gpu=SimulatedDevice(TOTAL))
    assert starts.learned_all() == {}
    again = starts.gate(gpu)
    assert isinstance(again, WorkerProfile) and again.n_ctx == gpu.n_ctx
