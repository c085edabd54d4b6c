"""A GPU start weighed on the device now (host.gpu_start) with the bundled model's real plan: as planned when
it fits, a smaller plan when only that fits, none (naming who holds the memory) when nothing does."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from tray_app.budget.device import SimulatedDevice
from tray_app.budget.library_plan import ModelPlans
from tray_app.budget.plan_set import PlanSet, plan_from_config
from tray_app.budget.remote import RemoteDevice
from tray_app.config import Config, from_dict
from tray_app.contract.events import EventBus, WorkerStateChanged, WorkerUnhealthy
from tray_app.contract.sizes import format_size
from tray_app.device.snapshot import DeviceProcess, DeviceSnapshot
from tray_app.engine.profile import WorkerProfile
from tray_app.host import gpu_start
from tray_app.host.gpu_side import GpuSide
from tray_app.host.gpu_start import GpuStarts, weigh
from tray_app.supervisor.profile import profiles_from_plans

MIB = 1024**2
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


def test_a_smaller_start_gives_the_rpc_box_what_this_gpu_no_longer_holds(
    plans: Plans, gpu: WorkerProfile
) -> None:
    box = RemoteDevice("nas", "10.0.0.3:50052", "10.0.0.3:50052", 24 * GIB, 24 * GIB, cap_bytes=GIB)
    with_box = Plans(plans.cfg, replace(plans.plan_set, boxes=(box,)))
    plan = plans.plan_set.gpu
    assert plan.n_gpu_layers == plan.n_layers  # as planned, this GPU held every layer: no share on the box
    free = plan.reserve_bytes + plan.used_bytes // 4  # room for some of the layers only
    weighed = weigh(with_box, gpu, device_with(TOTAL - free), "normal")
    assert weighed.decision.action == "smaller" and weighed.profile is not None, weighed.decision.reason
    on_gpu = weighed.profile.n_gpu_layers
    assert 0 < on_gpu < plan.n_layers and weighed.profile.rpc == (box.endpoint,)
    assert 0 < weighed.profile.rpc_layers[0] <= plan.n_layers - on_gpu


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


# ---------------------------------------------------------- what failed loads taught is bounded (review F10)
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_few_transient_failures_cannot_refuse_the_gpu(plans: Plans, gpu: WorkerProfile) -> None:
    """Another program's brief spike fails a load with no excess of its own: the whole allocation is held
    back. Three of them once added up to more than the card and refused the GPU until a restart; the total
    is capped at a quarter of the device, and the card is free again."""
    reading = device_with(0)
    starts = GpuStarts(plans, lambda: reading, lambda: "normal")
    starts.gate(gpu)
    for _ in range(3):
        starts.load_ran_short("gpu", int(1.5 * GIB), 0)
    cap = int(TOTAL * gpu_start.LEARNED_CAP_FRACTION)
    assert starts.learned("gpu") == cap == starts.learned_all()["gpu"]
    started = starts.gate(gpu)
    assert isinstance(started, WorkerProfile) and started.n_ctx == gpu.n_ctx, started


def test_a_load_that_succeeds_forgets_what_others_took_and_keeps_the_estimates_shortfall(
    plans: Plans, gpu: WorkerProfile
) -> None:
    plan = plans.plan_set.gpu
    reading = device_with(0)
    starts = GpuStarts(plans, lambda: reading, lambda: "normal")
    starts.gate(gpu)
    short = plan.used_bytes // 8
    starts.load_ran_short("gpu", plan.used_bytes // 2, plan.used_bytes + short)  # the estimate was short
    starts.load_ran_short("gpu", 64 * MIB, plan.used_bytes // 2)  # someone took memory meanwhile
    assert starts.learned("gpu") == short + 64 * MIB
    starts.load_succeeded("gpu")
    # The start that loaded held the estimate's shortfall back: a restart does too. The spike is gone.
    assert starts.learned_all() == {"gpu": short}
    starts.load_succeeded("gpu-embed")  # nothing learned there: nothing to forget
    assert starts.learned_all() == {"gpu": short}

    # Only others' memory learned: a success leaves nothing.
    transient = GpuStarts(plans, lambda: reading, lambda: "normal")
    transient.load_ran_short("gpu", 64 * MIB, 0)
    transient.load_succeeded("gpu")
    assert transient.learned_all() == {}


def test_what_failed_loads_taught_is_forgotten_after_a_while(plans: Plans, gpu: WorkerProfile) -> None:
    clock = Clock()
    reading = device_with(0)
    starts = GpuStarts(plans, lambda: reading, lambda: "normal", clock=clock)
    starts.load_ran_short("gpu", 256 * MIB, 0)
    clock.now += gpu_start.LEARNED_FOR_SECONDS - 1
    starts.load_ran_short("gpu", 128 * MIB, 0)  # a new failure renews the lesson and adds to it
    clock.now += gpu_start.LEARNED_FOR_SECONDS - 1
    assert starts.learned("gpu") == 384 * MIB
    clock.now += 2
    assert starts.learned("gpu") == 0 and starts.learned_all() == {}
    # What was forgotten does not come back with the next failure: that starts from nothing.
    starts.load_ran_short("gpu", 32 * MIB, 0)
    assert starts.learned("gpu") == 32 * MIB


def test_the_gpu_path_forgets_others_memory_when_a_gpu_worker_loads() -> None:
    """GpuSide wires it: a load out of memory teaches its start gate, the worker's `ready` ends a spike's
    lesson (the service publishes both)."""
    bus = EventBus()
    host = PathHost(bus, Config(), plan_from_config(Config(), gpu=SimulatedDevice(TOTAL)))
    side = GpuSide(host)  # type: ignore[arg-type]
    try:
        bus.publish(WorkerUnhealthy(role="gpu", kind="oom_load", reason="x", failed_bytes=64 * MIB))
        assert side.starts.learned("gpu") == 64 * MIB
        bus.publish(WorkerStateChanged(role="cpu", old="starting", new="ready", reason="", pid=1))
        assert side.starts.learned("gpu") == 64 * MIB  # another worker's load says nothing of the GPU's
        bus.publish(WorkerStateChanged(role="gpu", old="starting", new="ready", reason="", pid=2))
        assert side.starts.learned_all() == {}
    finally:
        side.close()


@dataclass
class PathHost:
    bus: EventBus
    cfg: Config
    plan_set: PlanSet
    workers: dict[str, Any] = field(default_factory=dict)
    library: Any = None

    def library_plans(self, name: str) -> ModelPlans | None:
        return None

    def in_flight(self, role: str) -> int:
        return 0

    def replan(self) -> PlanSet:
        return self.plan_set
