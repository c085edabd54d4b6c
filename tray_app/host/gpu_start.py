"""Every start on the GPU (the main worker after a failure, a library model's load, the embeddings worker) is
weighed against the memory free now, read fresh from the device watcher, before its process is spawned
(jobs.gpu_policy decides): it starts as planned, with a smaller plan, or not at all, and then the worker
stays stopped with a reason that names the programs holding the memory."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from tray_app.budget import calibration
from tray_app.budget.footprint import reserve_bytes
from tray_app.budget.library_plan import ModelPlans
from tray_app.budget.plan import Plan
from tray_app.budget.plan_set import PlanSet, gpu_request
from tray_app.budget.planner import plan_gpu
from tray_app.budget.remote import RemoteShare, remote_shares
from tray_app.config import Config
from tray_app.contract.roles import EMBED_ROLES
from tray_app.contract.sizes import parse_size
from tray_app.device.snapshot import DeviceSnapshot
from tray_app.engine.profile import WorkerProfile
from tray_app.jobs import gpu_policy
from tray_app.supervisor.profile import gpu_profile


class StartPlans(Protocol):
    """What the weighing reads of the service: its config and its plans."""

    @property
    def cfg(self) -> Config: ...

    @property
    def plan_set(self) -> PlanSet: ...

    def library_plans(self, name: str) -> ModelPlans | None: ...


@dataclass(frozen=True)
class Weighed:
    decision: gpu_policy.StartDecision
    profile: WorkerProfile | None  # what to start with (None: refused)
    need_bytes: int


def holders(snapshot: DeviceSnapshot, role: str = "") -> tuple[gpu_policy.Holder, ...]:
    """Everyone on the device but the worker `role` itself: other programs, and Failsoft's other workers."""
    return tuple(
        gpu_policy.Holder(p.describe(), p.used_bytes)
        for p in snapshot.processes
        if not (p.own and p.label == role)
    )


def on_gpu_side(profile: WorkerProfile) -> bool:
    """A GPU worker by its role (gpu, gpu-embed, gpu@name), even when its plan left it no layer there."""
    return profile.role.startswith("gpu")


def configured_reserve(cfg: Config, total_bytes: int) -> int:
    """The reserve as the config sets it for this device (a plan that does not fit shows less of it)."""
    return reserve_bytes(total_bytes, cfg.budget.reserve_percent, parse_size(cfg.budget.reserve_min))


def role_plan(plans: StartPlans, role: str) -> Plan | None:
    """The plan a GPU worker `role` starts with now."""
    if role == "gpu":
        return plans.plan_set.gpu
    if role == EMBED_ROLES["gpu"]:
        return plans.plan_set.embeddings
    model = role.partition("@")[2]
    library = plans.library_plans(model) if role.startswith("gpu@") else None
    return library.gpu if library is not None else None


def smaller_plan(plans: StartPlans, free_bytes: int) -> Plan:
    """The main model's plan for exactly what is free now (the planner shrinks the context, then layers)."""
    cfg, plan_set = plans.cfg, plans.plan_set
    total = plan_set.device.total_bytes
    device = replace(plan_set.device, free_bytes=free_bytes, used_by_others_bytes=max(total - free_bytes, 0))
    measured = calibration.measured_compute(cfg.model_path())
    return plan_gpu(device, plan_set.model, gpu_request(cfg), measured)


def boxes_beside(plans: StartPlans, smaller: Plan) -> tuple[RemoteShare, ...]:
    """The RPC boxes' shares of what a smaller plan leaves off this GPU (as they were last probed)."""
    plan_set = plans.plan_set
    if not plan_set.boxes:
        return ()
    return remote_shares(
        plan_set.model,
        gpu_request(plans.cfg),
        smaller,
        list(plan_set.boxes),
        local_device_in_build=plan_set.target.kind == "gpu",
        measured=calibration.measured_compute(plans.cfg.model_path()),
    )


def weigh(
    plans: StartPlans,
    profile: WorkerProfile,
    snapshot: DeviceSnapshot,
    path: gpu_policy.GpuPath,
    learned_bytes: int = 0,
) -> Weighed:
    """The policy's answer for starting `profile` now, with the profile to start (simulated VRAM: what is
    free now, so the simulated load check meets the device as it is). `learned_bytes`: what its last loads
    lacked, held back beside the plan (a smaller plan is made for what is free less that)."""
    cfg = plans.cfg
    plan = role_plan(plans, profile.role)
    free = snapshot.free_bytes
    if plan is None:
        others = gpu_policy.holders_text(holders(snapshot, profile.role))
        reason = f"{profile.role} not started on the GPU: no plan of it fits the device now; {others}"
        return Weighed(gpu_policy.StartDecision("refuse", reason), None, 0)
    check = _start_check(cfg, profile, plan, snapshot, path, learned_bytes)
    smaller: Plan | None = None
    if profile.role == "gpu" and plan.used_bytes + learned_bytes + check.reserve_bytes > free:
        smaller = smaller_plan(plans, max(free - learned_bytes, 0))
        if smaller.fits:
            check = replace(
                check,
                smaller_need_bytes=smaller.used_bytes,
                smaller_ctx=smaller.n_ctx_per_seq,
                smaller_layers=smaller.n_gpu_layers,
            )
    decision = gpu_policy.decide_gpu_start(check)
    simulated = free if profile.simulated_vram_bytes is not None else None
    if decision.action == "start":
        return Weighed(decision, replace(profile, simulated_vram_bytes=simulated), check.need_bytes)
    if decision.action == "smaller" and smaller is not None:
        started = replace(
            gpu_profile(cfg, smaller, profile.model_path, simulated, boxes_beside(plans, smaller)),
            enable_faults=profile.enable_faults,
            fault_load_oom=profile.fault_load_oom,
        )
        return Weighed(decision, started, smaller.used_bytes)
    return Weighed(decision, None, 0)


def _start_check(
    cfg: Config,
    profile: WorkerProfile,
    plan: Plan,
    snapshot: DeviceSnapshot,
    path: gpu_policy.GpuPath,
    learned_bytes: int,
) -> gpu_policy.StartCheck:
    """What the policy weighs: `profile`'s plan as it stands against the device now."""
    return gpu_policy.StartCheck(
        role=profile.role,
        need_bytes=plan.used_bytes,
        free_bytes=snapshot.free_bytes,
        reserve_bytes=configured_reserve(cfg, snapshot.total_bytes),
        n_ctx_per_seq=plan.n_ctx_per_seq,
        n_gpu_layers=plan.n_gpu_layers,
        # The user's own context cap can plan below gpu.min_ctx (max_ctx 512 over 2 slots): the plan as
        # configured is always startable; only a smaller plan made for the device now is held to the floor.
        min_ctx=0 if profile.embeddings else min(cfg.gpu.min_ctx, plan.n_ctx_per_seq),
        min_layers=cfg.gpu.min_layers,
        holders=holders(snapshot, profile.role),
        path=path,
        learned_bytes=learned_bytes,
    )


# What failed loads teach is bounded: at most this share of the device is held back for one worker...
LEARNED_CAP_FRACTION = 0.25
# ...and a lesson that no new failure renewed for this long is forgotten (the device's other users moved on).
LEARNED_FOR_SECONDS = 30 * 60.0


@dataclass
class Shortfall:
    """What one worker's failed loads taught, in two parts that end differently."""

    estimate: int = 0  # reached beyond the need its start was weighed with: the estimate's error here
    others: int = 0  # failed allocations without such an excess: memory someone else took meanwhile
    at: float = 0.0  # monotonic time of the last failure

    @property
    def total(self) -> int:
        return self.estimate + self.others


class GpuStarts:
    """The supervisors' start gate, and what each GPU start was weighed to need (its share on the device)."""

    def __init__(
        self,
        plans: StartPlans,
        read_now: Callable[[], DeviceSnapshot | None],
        path: Callable[[], gpu_policy.GpuPath],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._plans = plans
        self._read_now = read_now
        self._path = path
        self._clock = clock
        self._need: dict[str, int] = {}  # role -> bytes its current start was weighed with
        self.held_back: dict[str, str] = {}  # role -> why its last start was not made
        self.notes: dict[str, str] = {}  # role -> why it started with a smaller plan
        # role -> what its loads lacked (load_ran_short), held back at its next starts. Learned against one
        # plan set: a new one (the device changed) starts from the estimate again.
        self._learned: dict[str, Shortfall] = {}
        self._learned_on: PlanSet | None = None

    def _cap(self) -> int:
        return int(self._plans.plan_set.device.total_bytes * LEARNED_CAP_FRACTION)

    def load_ran_short(self, role: str, failed_bytes: int, reached_bytes: int) -> None:
        """`role`'s load ran out of device memory allocating `failed_bytes`, having reached `reached_bytes`
        with it: its next start holds back what that was beyond what the start was weighed to need (the
        estimate's shortfall), or the allocation itself where that says nothing (another program took the
        memory meanwhile, or the driver did). Again after each such failure, up to LEARNED_CAP_FRACTION of
        the device: repeated failures end in a plan that loads, or in none, and a few transient ones cannot
        take more than that share of the card."""
        if failed_bytes <= 0 or not role.startswith("gpu"):
            return
        if self._learned_on is not self._plans.plan_set:
            self._learned, self._learned_on = {}, self._plans.plan_set
        # What was learned before counts unless it was forgotten (its time ran out).
        shortfall = self._learned[role] if self.learned(role) else Shortfall()
        beyond = reached_bytes - self._need.get(role, reached_bytes)
        if beyond > 0:
            shortfall.estimate += beyond
        else:
            shortfall.others += failed_bytes
        cap = self._cap()
        shortfall.estimate = min(shortfall.estimate, cap)
        shortfall.others = min(shortfall.others, cap - shortfall.estimate)
        shortfall.at = self._clock()
        self._learned[role] = shortfall

    def load_succeeded(self, role: str) -> None:
        """`role`'s worker loaded: what its failures learned of others' memory (taken between a reading and
        the load: a passing spike, not this device's state) is forgotten; the estimate's own shortfall stays,
        as the start that just loaded held it back."""
        shortfall = self._learned.get(role)
        if shortfall is None:
            return
        shortfall.others = 0
        if shortfall.total == 0:
            del self._learned[role]

    def learned(self, role: str) -> int:
        """What `role`'s start holds back now for its earlier loads' shortfall: 0 once the plans changed or
        LEARNED_FOR_SECONDS after its last failure; never more than LEARNED_CAP_FRACTION of the device."""
        shortfall = self._learned.get(role)
        if shortfall is None or self._learned_on is not self._plans.plan_set:
            return 0
        if self._clock() - shortfall.at > LEARNED_FOR_SECONDS:
            return 0
        return min(shortfall.total, self._cap())

    def learned_all(self) -> dict[str, int]:
        """role -> what its starts hold back now (roles with nothing learned left out)."""
        return {role: size for role in self._learned if (size := self.learned(role))}

    def gate(self, profile: WorkerProfile) -> WorkerProfile | str:
        """The profile to start `profile`'s worker with, or why it is not started (jobs.gpu_policy)."""
        return self.gate_on(profile, self._read_now() if on_gpu_side(profile) else None)

    def gate_on(self, profile: WorkerProfile, snapshot: DeviceSnapshot | None) -> WorkerProfile | str:
        """`gate` on a reading taken by the caller (off the event loop: GpuSide.gate)."""
        if not on_gpu_side(profile):
            return profile
        if snapshot is None:
            return profile  # nothing is watched here: the plan made at start is all there is
        weighed = weigh(self._plans, profile, snapshot, self._path(), self.learned(profile.role))
        if weighed.profile is None:
            self.held_back[profile.role] = weighed.decision.reason
            return weighed.decision.reason
        self.held_back.pop(profile.role, None)
        self.notes[profile.role] = weighed.decision.reason
        self._need[profile.role] = weighed.need_bytes
        return weighed.profile

    def refusal(self, profile: WorkerProfile) -> str | None:
        """Why `profile` would not start on the GPU now (None: it would), without recording anything."""
        snapshot = self._read_now()
        if snapshot is None or not on_gpu_side(profile):
            return None
        weighed = weigh(self._plans, profile, snapshot, self._path(), self.learned(profile.role))
        return weighed.decision.reason if weighed.profile is None else None

    def share_of(self, role: str) -> int:
        """What the worker `role` holds on the device once ready: what its start was weighed to need."""
        if role in self._need:
            return self._need[role]
        plan = role_plan(self._plans, role)
        return plan.used_bytes if plan is not None else 0
