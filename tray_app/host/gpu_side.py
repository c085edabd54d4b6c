"""The service's GPU path in one place: the device watch (gpu_watch), the gate every GPU start passes
(gpu_start), the path's state (gpu_path) and the yield and return (gpu_yield), wired to the service's
workers, plans and events. The service owns one for a run; `status()` is what `/failsoft/status` shows."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Protocol

from tray_app.budget.library_plan import ModelPlans
from tray_app.budget.plan_set import PlanSet, configured_endpoints, probe_boxes
from tray_app.budget.remote import RemoteDevice, answering
from tray_app.config import Config, GpuConfig
from tray_app.contract.events import (
    DeviceChanged,
    Event,
    EventBus,
    FallbackStarted,
    GpuPathChanged,
    OtherProcessAppeared,
    WorkerRestarted,
    WorkerStateChanged,
    WorkerUnhealthy,
)
from tray_app.device.snapshot import DeviceSnapshot
from tray_app.engine.profile import WorkerProfile
from tray_app.host.gpu_path import GpuPathTracker
from tray_app.host.gpu_start import GpuStarts, configured_reserve, on_gpu_side, weigh
from tray_app.host.gpu_watch import GpuWatch
from tray_app.host.gpu_yield import GpuWorker, GpuYield
from tray_app.host.rpc_watch import RpcWatch
from tray_app.supervisor.profile import profiles_from_plans

log = logging.getLogger(__name__)
MARKERS = 500


class Supervised(GpuWorker, Protocol):
    @property
    def profile(self) -> WorkerProfile: ...

    @property
    def running_profile(self) -> WorkerProfile: ...

    async def restart(self, reason: str) -> bool: ...


class Library(Protocol):
    async def unload(self, name: str, devices: tuple[str, ...] = ("gpu", "cpu")) -> None: ...


class Host(Protocol):
    """What the GPU path needs of the service."""

    bus: EventBus

    @property
    def cfg(self) -> Config: ...

    @property
    def plan_set(self) -> PlanSet: ...

    @property
    def workers(self) -> Mapping[str, Supervised]: ...

    @property
    def library(self) -> Library: ...

    def library_plans(self, name: str) -> ModelPlans | None: ...

    def in_flight(self, role: str) -> int: ...

    def replan(self, boxes: tuple[RemoteDevice, ...] | None = None) -> PlanSet: ...


class GpuSide:
    def __init__(self, host: Host) -> None:
        self.host = host
        self.path = GpuPathTracker(host.bus)
        self.starts = GpuStarts(host, self.read_now, lambda: self.path.state)
        self.watch = self._new_watch(host.cfg)
        self.yielding = GpuYield(self)
        self._task: asyncio.Task[None] | None = None
        self._rpc_task: asyncio.Task[None] | None = None  # host.rpc_watch, with RPC boxes configured
        # What the timeline marks: failovers, restarts, GPU loads, the path's changes (bounded, newest last).
        self.markers: deque[dict[str, Any]] = deque(maxlen=MARKERS)
        self._remove = host.bus.add_listener(self._on_event)

    def _new_watch(self, cfg: Config) -> GpuWatch:
        return GpuWatch(cfg.device, self.host.bus, lambda: self.host.workers, self.starts.share_of)

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        await self.watch.start()
        loop = asyncio.get_running_loop()
        if self.watch.watcher is not None:
            self.host.replan()  # on the watcher's first reading rather than the probe's
            self._task = loop.create_task(self._follow(), name="gpu-path")
        if configured_endpoints(self.host.cfg):
            watch = RpcWatch(lambda: self.host.workers, self.host.in_flight)
            self._rpc_task = loop.create_task(watch.run(), name="rpc-boxes")

    async def stop(self) -> None:
        for task in (self._task, self._rpc_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._rpc_task = None
        await self.yielding.stop()
        await self.watch.stop()

    async def restart(self, cfg: Config) -> None:
        """Another device (the config changed it): watch that one from now on."""
        await self.stop()
        self.watch = self._new_watch(cfg)
        await self.start()

    def close(self) -> None:
        self._remove()

    async def _follow(self) -> None:
        """After every reading: yield to a program that appeared, or come back when due."""
        watcher = self.watch.watcher
        assert watcher is not None
        last = 0.0

        def newer(snapshot: DeviceSnapshot) -> bool:
            return snapshot.at > last

        while True:
            snapshot = await watcher.wait_for(newer)
            last = snapshot.at
            try:
                await self.yielding.check(snapshot)
            except Exception:  # a bug here must not end the watching of the GPU path
                log.exception("the GPU path's check failed")

    def _on_event(self, event: Event) -> None:
        self._mark(event)
        if isinstance(event, WorkerUnhealthy) and event.kind == "oom_load":
            # Before its restart is weighed (published before the restart is scheduled).
            self.starts.load_ran_short(event.role, event.failed_bytes, event.reached_bytes)
        elif isinstance(event, WorkerStateChanged) and event.new == "ready" and event.role.startswith("gpu"):
            self.starts.load_succeeded(event.role)
        elif isinstance(event, DeviceChanged):
            if self.watch.plan_is_stale():
                self.host.replan()
            self.path_changed()
        elif isinstance(event, OtherProcessAppeared) and self.host.cfg.gpu.yield_to:
            # Yield at once rather than at the next reading's check.
            snapshot = self.watch.latest
            with contextlib.suppress(RuntimeError):  # published off the loop: the next check catches it
                asyncio.get_running_loop().create_task(self.yielding.check(snapshot))

    def _mark(self, event: Event) -> None:
        text = ""
        if isinstance(event, FallbackStarted):
            # A move to a peer ("peer:gaming-pc") names the peer, never "the CPU": the job left this machine.
            where = "the CPU" if event.to == "cpu" else event.to.removeprefix("peer:")
            kind, text = "failover", f"job {event.job_id[:12]} to {where}: {event.reason}"
        elif isinstance(event, WorkerRestarted):
            kind, text = "restart", f"{event.role} worker restarted: {event.reason}"
        elif isinstance(event, WorkerStateChanged) and event.new == "ready" and event.role.startswith("gpu"):
            kind, text = "load", f"{event.role} worker loaded"
        elif isinstance(event, GpuPathChanged):
            kind, text = "path", f"GPU {event.state}: {event.reason}"
        if text:
            self.markers.append({"at": event.at, "kind": kind, "text": text})

    # ------------------------------------------------------------------------------------- the gate
    def read_now(self) -> DeviceSnapshot | None:
        return self.watch.read_now()

    async def gate(self, profile: WorkerProfile) -> WorkerProfile | str:
        """The supervisors' start gate (gpu_start), weighed on a reading taken now (awaited: a driver's
        reading never holds the event loop), then the path's state again."""
        if profile.role == "gpu" and (profile.rpc or configured_endpoints(self.host.cfg)):
            profile = await self._follow_rpc_boxes(profile)
        snapshot = await self.watch.read_now_async() if on_gpu_side(profile) else None
        before = dict(self.starts.held_back)
        gated = self.starts.gate_on(profile, snapshot)
        if self.starts.held_back != before:
            self.path_changed()
        return gated

    async def _follow_rpc_boxes(self, profile: WorkerProfile) -> WorkerProfile:
        """The main GPU worker's RPC boxes, probed again before each of its starts: one that went away is
        planned without (its layers go back to the CPU), one that came back is planned with again."""
        boxes = await asyncio.to_thread(probe_boxes, self.host.cfg)
        if answering(boxes) == answering(self.host.plan_set.boxes):
            return profile
        for box in boxes:
            log.warning(
                "RPC box %s (%s): %s", box.peer, box.endpoint, box.problem or "answers again: planned with it"
            )
        plan_set = self.host.replan(boxes)
        fresh = profiles_from_plans(self.host.cfg, plan_set, enable_faults=profile.enable_faults).gpu
        return profile if fresh is None else replace(fresh, fault_load_oom=profile.fault_load_oom)

    def gpu_refusal(self, role: str) -> str | None:
        """Why the GPU worker `role` would not start now (a library model's load asks first)."""
        worker = self.host.workers.get(role)
        return self.starts.refusal(worker.profile) if worker is not None else None

    # ----------------------------------------------------------------------- what the yield needs
    def gpu_settings(self) -> GpuConfig:
        return self.host.cfg.gpu

    def gpu_workers(self) -> Mapping[str, GpuWorker]:
        return {role: w for role, w in self.host.workers.items() if on_gpu_side(w.profile)}

    def in_flight(self, role: str) -> int:
        return self.host.in_flight(role)

    async def unload_from_gpu(self, role: str) -> bool:
        if not role.startswith("gpu@"):
            return False
        await self.host.library.unload(role.partition("@")[2], devices=("gpu",))
        return True

    def main_fits_now(self, snapshot: DeviceSnapshot) -> bool:
        worker = self.host.workers.get("gpu")
        if worker is None:
            return False
        learned = self.starts.learned("gpu")
        return weigh(self.host, worker.profile, snapshot, "normal", learned).profile is not None

    def main_held_back(self) -> bool:
        worker = self.host.workers.get("gpu")
        return "gpu" in self.starts.held_back and worker is not None and worker.state == "stopped"

    def reserve(self) -> int:
        latest = self.watch.latest
        total = latest.total_bytes if latest is not None else self.host.plan_set.device.total_bytes
        return configured_reserve(self.host.cfg, total)

    def path_changed(self) -> None:
        self.path.update(
            self.watch.latest,
            self.reserve(),
            self.starts.held_back,
            self.yielding.reason,
        )

    # ------------------------------------------------------------------------------ yield, resume
    async def yield_gpu(self, wait: bool = True) -> dict[str, Any]:
        done = self.yielding.start_yield("asked with failsoft yield", manual=True)
        if wait:
            await done
        return self.status()["gpu_path"]

    def resume(self) -> dict[str, Any]:
        self.yielding.resume()
        return self.status()["gpu_path"]

    # -------------------------------------------------------------------------------------- status
    def status(self) -> dict[str, Any]:
        """`device_now` (the watcher's latest reading) and `gpu_path` (its state, the yield, held starts)."""
        watcher = self.watch.watcher
        latest = self.watch.latest
        device_now: dict[str, Any] = {"watching": watcher is not None, "source_note": self.watch.source_note}
        if watcher is not None and latest is not None:
            device_now.update(latest.to_dict())
            for process, data in zip(latest.processes, device_now["processes"], strict=True):
                data["describe"] = process.describe()
            device_now.update(poll_seconds=watcher.poll_seconds, polls=watcher.polls)
        simulated = self.watch.simulated
        if simulated is not None and simulated.ledger is not None:
            device_now["ledger"] = str(simulated.ledger.path)  # where a hog takes from (`failsoft hog`)
        path = {
            **self.path.to_dict(),
            "held_back": dict(self.starts.held_back),
            "smaller": {role: note for role, note in self.starts.notes.items() if note},
            "load_shortfall": self.starts.learned_all(),
            **self.yielding.to_dict(),
        }
        return {"device_now": device_now, "gpu_path": path}

    def history(self, since: float | None = None) -> dict[str, Any]:
        """The watcher's ring of readings (oldest first), for the timeline."""
        watcher = self.watch.watcher
        if watcher is None:
            return {"watching": False, "reason": self.watch.source_note, "samples": []}
        return {
            "watching": True,
            "poll_seconds": watcher.poll_seconds,
            "limit": watcher.history_limit,
            "reserve_bytes": self.reserve(),
            "samples": [snapshot.to_dict() for snapshot in watcher.history(since)],
            "markers": [m for m in self.markers if since is None or m["at"] >= since],
        }
