"""The library's models at run time: each one's plans and tokenizer, loading on demand (making room on the
GPU by the eviction rule), the keep-alive that unloads an idle model, and what the status shows of them.

The main model is here too (its entry and plans are the service's), so every model is described the same
way; but only the other models are ever loaded or unloaded here: the main model's workers are kept."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from tray_app.budget.library_plan import ModelPlans, library_share, plan_library_model
from tray_app.budget.plan_set import PlanSet
from tray_app.config import Config
from tray_app.contract.events import Event, EventBus, JobStateChanged
from tray_app.contract.status import ModelStatus
from tray_app.contract.vocabulary import FINAL_JOB_STATES
from tray_app.jobs.registry import JobRegistry
from tray_app.library.catalog import Catalog, ModelEntry
from tray_app.library.errors import LoadRefused
from tray_app.library.eviction import Loaded, make_room
from tray_app.library.keep_alive import FOREVER
from tray_app.tokenizer.model_tokens import ModelTokens

log = logging.getLogger(__name__)
REAP_INTERVAL = 1.0  # how often idle models are looked at
# States in which a worker holds its memory (or is about to): counted against the GPU share.
RUNNING_STATES = ("starting", "ready", "restarting", "unhealthy")
LOADED_STATES = (*RUNNING_STATES, "stopping")


class LibraryWorker(Protocol):
    """What the library needs of a worker's supervisor."""

    @property
    def state(self) -> str: ...

    async def ensure_ready(self, timeout: float) -> bool: ...

    async def stop(self) -> None: ...


class Library:
    """Owns which library models are loaded, and when each was last used (nobody else writes these)."""

    def __init__(
        self,
        catalog: Catalog,
        workers: Callable[[str], LibraryWorker | None],
        registry: JobRegistry,
        bus: EventBus,
        main_tokens: Callable[[], ModelTokens],
        tokens_of: Callable[[Path, str], ModelTokens],
        *,
        gpu_refusal: Callable[[str], str | None] | None = None,
    ) -> None:
        self.catalog = catalog
        # Why a GPU worker would not start now, weighed on the memory free now (host.gpu_start).
        self._gpu_refusal = gpu_refusal
        self.plans: dict[str, ModelPlans] = {}  # the other models' plans, by name
        self.share_bytes = 0  # what the main model's plans leave on the GPU for the other models
        self.max_loaded = 3
        self._workers = workers
        self._registry = registry
        self._main_tokens = main_tokens
        self._tokens_of = tokens_of
        self._tokens: dict[str, ModelTokens] = {}
        self._last_used: dict[str, float] = {}
        self._keep_alive: dict[str, float] = {}  # a request's keep_alive, by model (the latest wins)
        self._loading: set[str] = set()
        # Models being unloaded, each with the event set when that is over: a load waits for it, and the
        # unload stops short if a request arrives for the model meanwhile (review N8).
        self._unloading: dict[str, asyncio.Event] = {}
        # What each model's GPU worker was planned to hold when it was loaded: still counted while it runs
        # after a re-plan (drill pressure) left its model no GPU plan for new requests.
        self._held: dict[str, int] = {}
        self._room = asyncio.Lock()  # one GPU load decision at a time: two must not count the same bytes
        bus.add_listener(self._on_event)

    # ------------------------------------------------------------------------------------- plans
    def replan(self, cfg: Config, plan_set: PlanSet) -> None:
        """Plan every other model against the main model's current plans (at start, after pressure)."""
        share = library_share(plan_set)
        self.share_bytes = share.free_bytes if share is not None else 0
        self.max_loaded = cfg.library.max_loaded
        self.plans = {entry.name: plan_library_model(cfg, entry, plan_set) for entry in self.catalog.others()}

    # ---------------------------------------------------------------------------------- lookups
    def tokens(self, name: str) -> ModelTokens:
        """The tokenizer of model `name` (the helper loads its vocabulary on first use)."""
        entry = self.catalog.find(name)
        if entry is None or entry.main:
            return self._main_tokens()
        counter = self._tokens.get(entry.name)
        if counter is None:
            counter = self._tokens[entry.name] = self._tokens_of(entry.path, entry.chat_format)
        return counter

    def n_ctx_per_seq(self, entry: ModelEntry, device: str) -> int:
        plans = self.plans.get(entry.name)
        plan = (plans.gpu if device == "gpu" else plans.cpu) if plans is not None else None
        return plan.n_ctx_per_seq if plan is not None else 0

    def roles(self, entry: ModelEntry) -> dict[str, str]:
        """Device -> worker role for the devices the model has a worker on."""
        if entry.main:
            return {"gpu": "gpu", "cpu": "cpu"}
        plans = self.plans.get(entry.name)
        roles = {}
        if plans is not None and plans.gpu is not None:
            roles["gpu"] = entry.role("gpu")
        if plans is not None and plans.cpu is not None:
            roles["cpu"] = entry.role("cpu")
        return {device: role for device, role in roles.items() if self._workers(role) is not None}

    def busy(self, name: str) -> int:
        """Jobs not finished that name this model on any device (queued, running or waiting)."""
        return sum(1 for job in self._registry.live() if name in (job.asked_model, *job.models.values()))

    # ------------------------------------------------------------------------------------ usage
    def touch(self, name: str, keep_alive: float | None = None) -> None:
        """A request for `name` arrived (with its own keep_alive, if it sent one)."""
        self._last_used[name] = time.monotonic()
        if keep_alive is not None:
            self._keep_alive[name] = keep_alive

    def _on_event(self, event: Event) -> None:
        if isinstance(event, JobStateChanged) and event.state in FINAL_JOB_STATES:
            job = self._registry.get(event.job_id)
            if job is not None:
                for name in {job.asked_model, *job.models.values()}:
                    if name in self._last_used:
                        self._last_used[name] = time.monotonic()

    def keep_alive(self, entry: ModelEntry) -> float:
        if entry.main:
            return FOREVER
        return self._keep_alive.get(entry.name, entry.keep_alive)

    # ----------------------------------------------------------------------------------- loading
    def loaded_on_gpu(self) -> list[ModelEntry]:
        """The other models holding (or about to hold) their share of the GPU."""
        return [
            entry
            for entry in self.catalog.others()
            if self._state(entry, "gpu") in LOADED_STATES or entry.name in self._loading
        ]

    async def load(self, entry: ModelEntry, device: str, timeout: float) -> bool:
        """Start `entry`'s worker on `device` (on the GPU after making room); True once it is ready.
        LoadRefused when the GPU has no room for it even after unloading the idle models."""
        role = self.roles(entry).get(device)
        worker = self._workers(role) if role else None
        if worker is None:
            # A re-plan on the device now may have taken its GPU plan away: say who holds the memory.
            gone = device == "gpu" and "gpu" in entry.devices and self._gpu_refusal is not None
            why = self._gpu_refusal(entry.role("gpu")) if gone and self._gpu_refusal else None
            if why is not None:
                raise LoadRefused(f"{entry.name} does not fit on the GPU now: {why}")
            raise LoadRefused(f"{entry.name} has no {device.upper()} worker here", "model_not_on_device")
        unloading = self._unloading.get(entry.name)
        if unloading is not None:
            await unloading.wait()  # its worker is being stopped: start it again once that is done
        if entry.main or worker.state == "ready":
            return await worker.ensure_ready(timeout)
        if device == "gpu":
            async with self._room:
                if self._state(entry, "gpu") not in LOADED_STATES:
                    await self._make_room(entry)
                    self._refuse_if_no_room_now(entry, entry.role("gpu"))
                self._held[entry.name] = self.plans[entry.name].vram_bytes
                self._loading.add(entry.name)
        self.touch(entry.name)
        try:
            return await worker.ensure_ready(timeout)
        finally:
            self._loading.discard(entry.name)
            self.touch(entry.name)  # its keep-alive counts from ready: a slow load is not unloaded at once

    def _refuse_if_no_room_now(self, entry: ModelEntry, role: str) -> None:
        """The share says it fits; the device now may not (another program took memory since the plan)."""
        why = self._gpu_refusal(role) if self._gpu_refusal is not None else None
        if why is not None:
            raise LoadRefused(f"{entry.name} does not fit on the GPU now: {why}")

    async def _make_room(self, entry: ModelEntry) -> None:
        need = self.plans[entry.name].vram_bytes
        loaded = [
            Loaded(
                other.name,
                self.vram_held(other),
                busy=self.busy(other.name) > 0 or other.name in self._loading,
                last_used=self._last_used.get(other.name, 0.0),
            )
            for other in self.loaded_on_gpu()
            if other is not entry
        ]
        room = make_room(self.share_bytes, self.max_loaded, loaded, need)
        if not room.fits:
            raise LoadRefused(f"{entry.name} does not fit on the GPU now: {room.reason}")
        for name in room.evict:
            log.info("unloading %s from the GPU to make room for %s", name, entry.name)
            if not await self.unload(name, devices=("gpu",), if_idle=True):
                raise LoadRefused(
                    f"{entry.name} does not fit on the GPU now: {name} got a request", "model_busy"
                )

    async def unload(
        self, name: str, devices: tuple[str, ...] = ("gpu", "cpu"), *, if_idle: bool = False
    ) -> bool:
        """Stop the model's workers on `devices`. `if_idle`: only while nothing of it is in flight, looked at
        again before each worker (a request may arrive during the first stop); False when it stopped short."""
        entry = self.catalog.find(name)
        if entry is None or entry.main:
            return False
        done = self._unloading.setdefault(name, asyncio.Event())
        try:
            for device in devices:
                if if_idle and self.busy(name):
                    return False
                worker = self._workers(entry.role(device))
                if worker is not None and worker.state in RUNNING_STATES:
                    await worker.stop()
            return True
        finally:
            if self._unloading.get(name) is done:
                del self._unloading[name]
            done.set()

    async def reap(self) -> None:
        """Unload each model whose keep-alive ran out with nothing of it in flight (the service's task)."""
        while True:
            await asyncio.sleep(REAP_INTERVAL)
            for entry in self.catalog.others():
                if self.unload_in(entry) == 0.0:
                    log.info("unloading %s: idle past its keep-alive", entry.name)
                    await self.unload(entry.name, if_idle=True)

    def unload_in(self, entry: ModelEntry) -> float | None:
        """Seconds until `entry` is unloaded for being idle; None when it is not loaded, busy or kept."""
        keep = self.keep_alive(entry)
        loaded = any(self._state(entry, device) in RUNNING_STATES for device in ("gpu", "cpu"))
        if entry.main or keep < 0 or not loaded or self.busy(entry.name) or entry.name in self._loading:
            return None
        idle = time.monotonic() - self._last_used.get(entry.name, time.monotonic())
        return max(keep - idle, 0.0)

    # ------------------------------------------------------------------------------------ status
    def _state(self, entry: ModelEntry, device: str) -> str:
        """Its worker's state on `device`, whether or not the current plan still gives it that device."""
        worker = self._workers(entry.role(device))
        return worker.state if worker is not None else "absent"

    def vram_held(self, entry: ModelEntry) -> int:
        """What its GPU worker holds while it runs (planned at its load), else 0."""
        if entry.main or self._state(entry, "gpu") not in LOADED_STATES:
            return 0
        plans = self.plans.get(entry.name)
        return self._held.get(entry.name, plans.vram_bytes if plans is not None else 0)

    def status(self, main_plans: PlanSet, in_flight: Callable[[str], int]) -> list[ModelStatus]:
        return [self._entry_status(entry, main_plans, in_flight) for entry in self.catalog.entries]

    def _entry_status(
        self, entry: ModelEntry, main_plans: PlanSet, in_flight: Callable[[str], int]
    ) -> ModelStatus:
        states = {device: self._state(entry, device) for device in ("gpu", "cpu")}
        on = [device for device, state in states.items() if state == "ready"]
        if on:
            where = "+".join(on)
        elif "stopping" in states.values():
            where = "unloading"
        elif any(state in LOADED_STATES for state in states.values()):
            where = "loading"
        else:
            where = "not loaded"
        # The workers its plans give it, and one that still runs although a re-plan took its plan away.
        roles = {
            **self.roles(entry),
            **{device: entry.role(device) for device, state in states.items() if state in LOADED_STATES},
        }
        plan: dict[str, Any] | None
        if entry.main:
            gpu_plan = main_plans.gpu if main_plans.device.available else None
            plan = gpu_plan.to_dict() if gpu_plan is not None else None
            vram = gpu_plan.used_bytes if gpu_plan is not None and states["gpu"] in LOADED_STATES else 0
        else:
            plans = self.plans.get(entry.name)
            plan = plans.gpu.to_dict() if plans is not None and plans.gpu is not None else None
            vram = self.vram_held(entry)
        last = self._last_used.get(entry.name)
        busy = self.busy(entry.name)
        return {
            "name": entry.name,
            "aliases": list(entry.aliases),
            "path": str(entry.path),
            "main": entry.main,
            "devices": list(entry.devices),
            "stand_in": entry.stand_in or None,
            "where": where,
            "workers": roles,
            "vram_bytes": vram,
            "plan": plan,
            "keep_alive": self.keep_alive(entry),
            "idle_seconds": None if busy or last is None else round(time.monotonic() - last, 1),
            "unload_in": _rounded(self.unload_in(entry)),
            "in_flight": sum(in_flight(role) for role in roles.values()),
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
