"""Wiring: config -> plans -> worker supervisors -> router parts. `Service` owns them all for one run."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tray_app import __version__, paths
from tray_app import config as config_module
from tray_app.budget.device import SimulatedDevice
from tray_app.budget.library_plan import ModelPlans
from tray_app.budget.plan import Plan
from tray_app.budget.plan_set import PlanSet, configured_endpoints, plan_from_config
from tray_app.budget.remote import RemoteDevice
from tray_app.config import Config, ConfigError
from tray_app.contract.events import (
    BudgetUpdated,
    Event,
    EventBus,
    JournalFailed,
    QueueChanged,
    WorkerStateChanged,
)
from tray_app.contract.roles import CHAT_ROLES, EMBED_ROLES, PEER_ROLE_PREFIX
from tray_app.contract.status import ServiceStatus, WorkerStatus
from tray_app.engine import binary, tools
from tray_app.engine.profile import WorkerProfile, WorkerProfiles
from tray_app.host import sd_notify
from tray_app.host.crash_record import RunRecord
from tray_app.host.gpu_side import GpuSide
from tray_app.host.gpu_watch import PlanningDevice
from tray_app.host.library import Library
from tray_app.host.metrics import Metrics
from tray_app.jobs import policy
from tray_app.jobs.admission import SlotPool
from tray_app.jobs.context import EngineHooks, HostHooks, JobsContext
from tray_app.jobs.engine import Executor
from tray_app.jobs.intake import Jobs
from tray_app.jobs.journal import Journal
from tray_app.jobs.mirror import Mirror, mirror_settings
from tray_app.jobs.registry import JobRegistry
from tray_app.jobs.relay import Relay, UpstreamError
from tray_app.jobs.worker_port import CpuSpeed, ExecutorSettings, Worker
from tray_app.library.catalog import ModelEntry, catalog_from_config
from tray_app.peers.directory import Peers
from tray_app.reach import admin_token
from tray_app.reach.capability import signer_for
from tray_app.reach.dispatcher import Dispatcher
from tray_app.supervisor.profile import library_profiles
from tray_app.tokenizer.model_tokens import ModelTokens
from tray_app.tokenizer.process import TokenizerProcess

log = logging.getLogger(__name__)
JOURNAL_FILE = "journal.sqlite3"


@dataclass(frozen=True)
class ConfigChange:
    applied: list[str]  # section.key taken over live
    needs_restart: list[str]  # section.key that wait for a restart
    restarted: bool  # the workers were restarted with the new config


TOKENIZER_LOG = "tokenizer.log"  # the tokenizer helper's output, beside the workers' logs


class Service:
    """The whole service for one run: build with a config, `await start()`, serve `app`, `await stop()`."""

    def __init__(self, cfg: Config, *, enable_faults: bool = False, bus: EventBus | None = None) -> None:
        self.cfg = cfg
        self.enable_faults = enable_faults
        self.bus = bus or EventBus()
        self.workers: dict[str, Any] = {}
        self.gpu = GpuSide(self)  # the device now: watcher, start gate, path state, yield
        self.plan_set: PlanSet = plan_from_config(cfg, gpu=self.device)
        self.model_path = cfg.model_path()
        try:
            self.engine = binary.find(cfg.engine.llama_server)
        except binary.EngineError as error:
            raise ConfigError(str(error)) from None
        # How the main model's workers' chat template opens a tool call (from the profiles they start with);
        # the library's models have their own (tool_call_opener_for).
        self.tool_call_opener = ""
        self._openers: dict[str, str] = {}
        self.catalog = catalog_from_config(cfg)
        self.model_id = self.catalog.main.name  # model.name, else its file's name
        # Every name a request may use: the main model's, and the library's models' and aliases.
        self.model_names = {name for entry in self.catalog.entries for name in entry.names()}
        self.admin_token = admin_token.ensure()  # the control API's credential (tray_app.reach.admin_token)
        # The phone's signed Approve/Reject links and the status page's login; the [[notify]] channels.
        self.signer = signer_for(paths.data_dir())
        self.notify = Dispatcher(
            self.bus, lambda: self.cfg.notify, lambda: self.cfg.server.public_url, self.signer
        )
        self.metrics = Metrics()
        self.bus.add_listener(self.metrics.on_event)
        self.bus.add_listener(self._slots_follow_workers)
        self.started_at = time.time()
        # This run as its status tells it; `failsoft serve` replaces it with one that knows the last crash.
        self.run = RunRecord(None, Path(), started_at=self.started_at)
        self.journal = Journal(
            paths.data_dir() / JOURNAL_FILE,
            cfg.journal.retention_days,
            cfg.journal.max_jobs,
            on_failure=lambda reason: self.bus.publish(JournalFailed(reason=reason)),  # the writer's thread
        )
        self.tokenizer = self._tokenizer_helper()
        self.tokens = ModelTokens(self.tokenizer, self.model_path, cfg.model.chat_format)
        self._file_tokens: dict[str, ModelTokens] = {}
        self.registry = JobRegistry(self.journal, self.bus)
        self.library = self._library()
        # Other machines' servers, the tier between this GPU and this CPU ([[peers]]), probed for health.
        self.peers = Peers(cfg.peers)
        self.slots = SlotPool(self._capacities(), cfg.server.queue_max, self._queue_changed)
        self.relay = Relay()
        self._tasks: list[asyncio.Task[Any]] = []
        self._speed_task: asyncio.Task[None] | None = None
        self.jobs: Jobs = self._jobs_engine()

    # ------------------------------------------------------------------------------------ set-up
    def _tokenizer_helper(self) -> TokenizerProcess:
        """The tokenizer, chat template and grammar parser run in a helper process: no native inference code
        in this one (tray_app.tokenizer). Started once the journal is this run's (a second service on the
        same data folder starts nothing), it loads the vocabulary while the workers start."""
        helper = TokenizerProcess(
            paths.log_dir() / TOKENIZER_LOG,
            preload=[(self.model_path, self.cfg.model.chat_format)],
            faults=self.enable_faults,
        )
        helper.start()
        return helper

    def _library(self) -> Library:
        """The models beside the main one, planned in what the main model leaves."""
        library = Library(
            self.catalog,
            self.workers.get,
            self.registry,
            self.bus,
            lambda: self.tokens,
            lambda path, chat_format: ModelTokens(self.tokenizer, path, chat_format),
            gpu_refusal=lambda role: self.gpu.gpu_refusal(role),
        )
        library.replan(self.cfg, self.plan_set)
        return library

    def _jobs_engine(self) -> Jobs:
        """The job engine's parts, sharing one context; the jobs facade over them."""
        context = JobsContext(
            self.registry,
            self.journal,
            self.slots,
            self.relay,
            self.bus,
            self.worker,
            lambda: self.cfg,
            peer_for=self._peer_for,
        )
        # The CPU mirror: the CPU worker reads GPU jobs' prompts ahead of a failover (jobs.mirror).
        self.mirror = Mirror(context, lambda: mirror_settings(self.cfg.cpu), CpuSpeed())
        engine = EngineHooks(
            cpu_state=lambda *args: self.jobs.cpu_state(*args),
            prompts=lambda model: self.library.tokens(model),  # the library may be replaced
            stand_in=lambda job, **kw: self.jobs.stand_in(job, **kw),
            on_fallback=lambda outcome: self.metrics.fallbacks.labels(outcome=outcome).inc(),
        )
        self.executor = Executor(context, self._executor_settings(), engine, self.mirror)
        hooks = HostHooks(
            count=lambda route, outcome: self.metrics.requests.labels(route=route, outcome=outcome).inc(),
            cpu_speed_ready=lambda: self._speed_task,
            gpu_path=lambda: (self.gpu.path.state, self.gpu.path.reason),
        )
        return Jobs(context, self, self.executor, hooks)

    # ------------------------------------------------------------------------------------ set-up
    def _capacities(self) -> dict[str, int]:
        embed = max(self.cfg.embeddings.n_parallel, 1)
        library: dict[str, int] = {}
        for entry in self.catalog.others():
            plans = self.library.plans[entry.name]
            for device, plan in (("gpu", plans.gpu), ("cpu", plans.cpu)):
                if plan is not None:
                    library[entry.role(device)] = max(plan.n_parallel, 1)
        return {
            "gpu": max(self.plan_set.gpu.n_parallel, 1),
            "cpu": max(self.plan_set.cpu.n_parallel, 1),
            **{role: embed for role in EMBED_ROLES.values()},
            **library,
            **{peer.role: peer.slots for peer in self.peers.all()},
        }

    def _executor_settings(self) -> ExecutorSettings:
        failover = self.cfg.failover
        sup = self.cfg.supervisor
        return ExecutorSettings(
            policy=policy.Settings(
                fallback=failover.fallback,
                stream_after_content=failover.stream_after_content,
                auto_approve_seconds=failover.auto_approve_seconds,
            ),
            # The supervisor's health probe finds a frozen worker process; this finds a generation that
            # stalls while the process still answers /health. Generous: a busy machine can be slow.
            stall_seconds=max(3 * (sup.health_interval + sup.health_timeout), 15.0),
            queue_timeout=self.cfg.server.queue_timeout,
            cpu_tokens_per_second=failover.cpu_tokens_per_second,
            worker_ready_wait=sup.start_timeout,
            max_pending_approvals=failover.max_pending_approvals,
            model_id=self.model_id,
        )

    def _queue_changed(self, depth: int) -> None:
        self.metrics.queue_depth.set(depth)
        self.bus.publish(QueueChanged(depth=depth, limit=self.cfg.server.queue_max))

    async def take_config(self, fresh: Config, *, restart: bool) -> ConfigChange:
        """The one place the running config changes: the live keys are taken over at once (a new snapshot
        replaces the old; nobody's copy changes under them); with `restart`, a change the workers need
        restarts them. ConfigError or ValueError when the new config cannot be used."""
        merged, applied, needs_restart = config_module.with_live_changes(self.cfg, fresh)
        if applied:
            self.cfg = merged
            self.apply_live_config()
            if any(name.startswith("journal.") for name in applied):
                self.journal.set_retention(merged.journal.retention_days, merged.journal.max_jobs)
        # The address and API key belong to the listening socket, and the library's models to the set of
        # workers made at start: only a service restart changes them.
        service_only = [name for name in needs_restart if name.startswith(("server.", "library.", "models"))]
        restarted = False
        if restart and len(service_only) < len(needs_restart):
            await self.reconfigure(fresh, "config changed: " + ", ".join(needs_restart))
            restarted, needs_restart = True, service_only
        return ConfigChange(applied, needs_restart, restarted)

    async def change_config(
        self, changes: dict[str, dict[str, Any]], *, restart: bool
    ) -> tuple[ConfigChange, list[str]]:
        """Write `changes` to this service's config file (validated first) and take the result over, as
        `take_config` does; also the `section.key` names that changed in the file. Command-line overrides
        still win over the file. ConfigError when a value is not allowed (nothing written)."""
        path = Path(self.cfg.source) if self.cfg.source else paths.config_file()
        saved, changed = await asyncio.to_thread(config_module.edit_file, path, changes)
        fresh = config_module.apply_overrides(saved, self.cfg.overrides)
        change = await self.take_config(fresh, restart=restart)
        return change, [f"{section}.{key}" for section, key in changed]

    def apply_live_config(self) -> None:
        """Take over config values that need no worker restart (after /failsoft/config/reload)."""
        self.executor.settings = self.jobs.embeddings.settings = self._executor_settings()
        self.slots.queue_limit = self.cfg.server.queue_max

    def library_plans(self, name: str) -> ModelPlans | None:
        return self.library.plans.get(name)

    @property
    def device(self) -> PlanningDevice:
        """The GPU the plans are made on: once the service runs, the device watcher's latest reading."""
        return self.gpu.watch.device

    def worker(self, role: str) -> Worker | None:
        """A worker as jobs see it: during a yield, the GPU workers take no new job (host.gpu_yield)."""
        if role.startswith(PEER_ROLE_PREFIX):
            return self.peers.get(role)
        worker: Worker | None = self.workers.get(role)
        return self.gpu.yielding.hide(role, worker) if worker is not None else None

    def _peer_for(self, model: str) -> str | None:
        """The worker role of the peer that would answer `model` now (jobs.context.JobsContext.peer_for)."""
        peer = self.peers.ready_for(model, self.model_id)
        return peer.role if peer is not None else None

    def in_flight(self, role: str) -> int:
        return self._in_flight(role)

    async def start(self) -> None:
        from tray_app.supervisor.supervisor import WorkerSupervisor

        await self.gpu.start()
        profiles = self._main_profiles()
        for role, profile in profiles.by_role().items():
            self.workers[role] = WorkerSupervisor(
                profile, self.bus, self.cfg.supervisor, engine=self.engine, start_gate=self.gpu.gate
            )
            if not profile.embeddings:
                self.tool_call_opener = tools.tool_call_opener(profile.chat_format)
        for profile in self._library_profiles():
            self.workers[profile.role] = WorkerSupervisor(
                profile, self.bus, self.cfg.supervisor, engine=self.engine, start_gate=self.gpu.gate
            )
            self._openers[profile.role.partition("@")[2]] = tools.tool_call_opener(profile.chat_format)
        self.bus.publish(BudgetUpdated(plan=self.plan_set.to_dict()))
        for worker in self.workers.values():
            if worker.profile.warm:
                # Not awaited: the API answers (status "starting") while the workers load.
                self._tasks.append(asyncio.create_task(worker.start(), name=f"start-{worker.role}"))
        self.notify.start()
        self._tasks.append(asyncio.create_task(self.executor.desk.run_approved(), name="approved-jobs"))
        self._tasks.append(asyncio.create_task(self.mirror.run(), name="cpu-mirror"))
        self._tasks.append(asyncio.create_task(self.library.reap(), name="keep-alive"))
        self._tasks.append(asyncio.create_task(self.peers.run(), name="peers"))
        self._tasks.append(asyncio.create_task(self._tell_systemd(), name="systemd-notify"))
        self._speed_task = asyncio.create_task(self._measure_cpu_speed(), name="cpu-speed")
        self._tasks.append(self._speed_task)
        for task in self._tasks:
            task.add_done_callback(_log_failure)
        self.jobs.resume_unfinished()

    async def _tell_systemd(self) -> None:
        """Under a Type=notify unit: READY once the warm workers answered, then watchdog pings."""
        if not sd_notify.notify("STATUS=starting workers"):
            return
        starts = [task for task in self._tasks if task.get_name().startswith("start-")]
        await asyncio.gather(*starts, return_exceptions=True)
        states = ", ".join(f"{role} {worker.state}" for role, worker in self.workers.items())
        sd_notify.notify(f"READY=1\nSTATUS=serving; {states}")
        interval = sd_notify.watchdog_interval()
        while interval is not None:
            await asyncio.sleep(interval)
            sd_notify.notify("WATCHDOG=1")

    async def stop(self) -> None:
        sd_notify.notify("STOPPING=1")
        self.executor.shutting_down = True
        for job in self.registry.live():
            if job.task is not None:
                job.task.cancel()
        for task in self._tasks:
            task.cancel()
        pending = [*self._tasks, *(job.task for job in self.registry.live() if job.task)]
        await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.gather(*(worker.aclose() for worker in self.workers.values()), return_exceptions=True)
        await self.gpu.stop()
        await self.notify.stop()
        await self.relay.aclose()
        await self.peers.close()
        await self.tokenizer.aclose()
        self.run.end()  # stopped cleanly (uvicorn then re-raises SIGTERM: nothing runs after this)
        self.journal.flush()
        self.journal.close()

    # ------------------------------------------------------------- what the intake asks (jobs.intake.Models)
    def find(self, name: str | None) -> ModelEntry | None:
        return self.catalog.find(name)

    def stand_in_for(self, entry: ModelEntry) -> ModelEntry | None:
        return self.catalog.stand_in_for(entry)

    def roles(self, entry: ModelEntry) -> dict[str, str]:
        return self.library.roles(entry)

    def n_ctx_per_seq(self, entry: ModelEntry, device: str) -> int:
        """The context per slot of `entry`'s worker on `device` (0: it has none there)."""
        if entry.main:
            return self._gpu_context()[1] if device == "gpu" else self.plan_set.cpu.n_ctx_per_seq
        return self.library.n_ctx_per_seq(entry, device)

    def _gpu_context(self) -> tuple[int, int, int]:
        """The main GPU worker's n_ctx, context per slot and slots: the ready process's own (its start may
        have been made smaller than the plan), else the plan's."""
        worker = self.workers.get("gpu")
        if worker is not None and worker.state == "ready":
            running = worker.running_profile
            parallel = max(running.n_parallel, 1)
            return running.n_ctx, running.n_ctx // parallel, parallel
        gpu = self.plan_set.gpu
        return gpu.n_ctx, gpu.n_ctx_per_seq, gpu.n_parallel

    def touch(self, name: str, keep_alive: float | None) -> None:
        self.library.touch(name, keep_alive)

    async def load(self, entry: ModelEntry, device: str, wait: float) -> bool:
        return await self.library.load(entry, device, wait)

    def tool_call_opener_for(self, model: str) -> str:
        """How model `model`'s workers open a tool call ("" when the router does not know it)."""
        return self._openers.get(model, self.tool_call_opener)

    def prompts(self, model: str = "") -> ModelTokens:
        return self.library.tokens(model)

    def file_prompts(self, model_file: str) -> ModelTokens:
        tokens = self._file_tokens.get(model_file)
        if tokens is None:
            tokens = self._file_tokens[model_file] = ModelTokens(self.tokenizer, Path(model_file))
        return tokens

    def _main_profiles(self) -> WorkerProfiles:
        from tray_app.supervisor.profile import profiles_from_plans

        return profiles_from_plans(self.cfg, self.plan_set, enable_faults=self.enable_faults)

    def _library_profiles(self) -> list[WorkerProfile]:
        profiles = []
        for entry in self.catalog.others():
            plans = self.library.plans[entry.name]
            profiles += library_profiles(
                self.cfg, entry, plans, self.plan_set, enable_faults=self.enable_faults
            )
        return profiles

    def cpu_plan(self, role: str | None) -> Plan | None:
        if role == "cpu":
            return self.plan_set.cpu
        entry = self.catalog.find(role.partition("@")[2]) if role else None
        plans = self.library.plans.get(entry.name) if entry is not None else None
        return plans.cpu if plans is not None else None

    async def _measure_cpu_speed(self) -> None:
        """One short generation on the CPU worker once ready: the first speed estimate for the policy."""
        worker = self.workers.get("cpu")
        if worker is None or self.cfg.failover.cpu_tokens_per_second > 0:
            return
        if not await worker.ensure_ready(self.cfg.supervisor.start_timeout) or not worker.base_url:
            return
        # A prompt of a hundred-odd tokens: its reading speed is what the CPU mirror plans with.
        count = ", ".join(str(number) for number in range(1, 60))
        body = json.dumps({"prompt": f"Count: {count},", "max_tokens": 24, "temperature": 0, "stream": True})
        started = time.monotonic()
        tokens = 0
        timings: dict[str, Any] = {}
        try:
            url, headers = worker.base_url + "/v1/completions", worker.request_headers
            async for chunk in self.relay.stream(url, body.encode(), headers, 30.0, 30.0):
                tokens += 1
                timings = chunk.obj.get("timings") or timings
        except UpstreamError as error:  # best effort: the estimate stays unknown (treated as too slow)
            log.warning("could not measure the CPU worker's speed: %s", error)
            return
        self.executor.cpu_meter.first_measurement(timings, tokens, started)

    # -------------------------------------------------------------------------------- status
    def caps(self) -> dict[str, int]:
        n_ctx, per_seq, parallel = self._gpu_context()
        return {
            "n_ctx": n_ctx,
            "n_ctx_per_seq": per_seq,
            "n_parallel": parallel,
            "cpu_n_ctx": self.plan_set.cpu.n_ctx,
        }

    def _in_flight(self, role: str) -> int:
        return self.slots.in_flight(role) if role in self.workers else 0

    def worker_status(self, role: str) -> WorkerStatus:
        worker = self.workers.get(role)
        if worker is None:
            return {
                "state": "absent",
                "pid": None,
                "rss_bytes": None,
                "cpu_percent": None,
                "restarts": 0,
                "last_failure": None,
            }
        status: WorkerStatus = worker.status()
        status["in_flight"] = self.slots.in_flight(role)
        status["slots"] = self.slots.capacity(role)
        return status

    def status(self) -> ServiceStatus:
        pending = len(self.registry.by_state("awaiting_approval"))
        self.metrics.approvals_pending.set(pending)
        failover = self.cfg.failover
        gpu = self.gpu.status()
        return {
            "version": __version__,
            "simulated": self.plan_set.device.simulated,
            "faults_enabled": self.enable_faults,
            "model": {"id": self.model_id, "path": str(self.model_path)},
            "engine": self.engine.to_dict(),
            # Degraded: accepted work can no longer be kept durably (new background jobs get 503).
            "journal": {"ok": self.journal.failure is None, "failure": self.journal.failure},
            "device": self.plan_set.device.to_dict(),
            "target": self.plan_set.target.to_dict(),
            "plan": self.plan_set.gpu.to_dict(),
            "cpu_plan": self.plan_set.cpu.to_dict(),
            # The GPU embeddings worker's share of what the chat plan leaves free; None: CPU only.
            "embeddings_plan": self.plan_set.embeddings.to_dict() if self.plan_set.embeddings else None,
            "caps": self.caps(),
            "workers": {role: self.worker_status(role) for role in CHAT_ROLES},
            "models": self.library.status(self.plan_set, self._in_flight),
            "library_workers": {
                role: self.worker_status(role)
                for entry in self.catalog.others()
                for role in self.library.roles(entry).values()
            },
            "embedding_workers": {role: self.worker_status(role) for role in EMBED_ROLES.values()},
            "peers": self.peers.status(),
            "rpc": self.plan_set.rpc_status(),
            "queue": {"depth": self.slots.depth, "limit": self.cfg.server.queue_max},
            "approvals": {"pending": pending},
            "counters": dict(self.registry.counters),
            "policy": {
                "fallback": failover.fallback,
                "stream_after_content": failover.stream_after_content,
                "auto_approve_seconds": failover.auto_approve_seconds,
                "deadline": failover.deadline,
                "cpu_tokens_per_second": round(self.jobs.cpu_tokens_per_second(), 2),
            },
            "mirror": self.mirror.status(),
            "device_now": gpu["device_now"],  # the device watcher's latest reading
            "gpu_path": gpu["gpu_path"],  # normal, squeezed, yielded or lost, and why
            "notify": self.notify.status(),  # each [[notify]] channel: sent, failed, its last error
            "uptime_seconds": round(time.time() - self.started_at, 1),
            "service": self.run.view(),  # this run, and the crash before it if there was one
            "tokenizer": self.tokenizer.status(),  # the helper process: pid, restarts, its last exit
        }

    def _slots_follow_workers(self, event: Event) -> None:
        """The router's slots for a worker are the slots its running process has: set again each time one
        becomes ready (a restart may bring another plan's `--parallel`)."""
        if isinstance(event, WorkerStateChanged) and event.new == "ready":
            worker = self.workers.get(event.role)
            if worker is not None:
                self.slots.resize(event.role, worker.running_profile.n_parallel)

    async def yield_gpu(self, wait: bool = True) -> dict[str, Any]:
        return await self.gpu.yield_gpu(wait)

    def resume_gpu(self) -> dict[str, Any]:
        return self.gpu.resume()

    def device_history(self, since: float | None = None) -> dict[str, Any]:
        return self.gpu.history(since)

    async def read_device(self) -> PlanSet:
        """Read the device now (as the next poll would) and plan again if it moved; the plans after it."""
        watcher = self.gpu.watch.watcher
        if watcher is not None:
            await watcher.poll()
        else:
            self.replan()
        return self.plan_set

    def replan(self, boxes: tuple[RemoteDevice, ...] | None = None) -> PlanSet:
        """Plan again against the device as it is now (another program's memory moved) and tell the tray.
        `boxes`: the RPC boxes as just probed (else as last probed, or probed now when the config names
        others).

        The running workers keep what they hold; their next start (a restart after a failure, or one the
        user asks for) follows the new plan, as a real GPU would demand.
        """
        if boxes is None and configured_endpoints(self.cfg) == [b.endpoint for b in self.plan_set.boxes]:
            boxes = self.plan_set.boxes
        self.plan_set = plan_from_config(self.cfg, gpu=self.device, boxes=boxes)
        self.gpu.watch.planned()
        self.library.replan(self.cfg, self.plan_set)
        self.bus.publish(BudgetUpdated(plan=self.plan_set.to_dict()))
        profiles = self._main_profiles()
        by_role = {**profiles.by_role(), **{p.role: p for p in self._library_profiles()}}
        for role, worker in self.workers.items():
            if role in by_role:
                worker.update_profile(by_role[role])
                # Fewer slots at once (the running worker may still have more, never the other way
                # round); more only once a worker started with them is ready (_slots_follow_workers).
                if role in self.slots.roles:
                    self.slots.resize(role, min(self.slots.capacity(role), by_role[role].n_parallel))
        return self.plan_set

    async def reconfigure(self, fresh: Config, reason: str) -> None:
        """Take over a config whose changes need the workers restarted (model, budget, device, CPU).

        Re-plans, then restarts each worker with its new profile, one after the other, so the other
        worker keeps serving meanwhile.
        """
        model_path = fresh.model_path()
        model = (model_path, fresh.model.chat_format, fresh.model.name)
        if model != (self.model_path, self.cfg.model.chat_format, self.cfg.model.name):
            self.tokens = ModelTokens(self.tokenizer, model_path, fresh.model.chat_format)
            self.model_path = model_path
            self.catalog = self.library.catalog = catalog_from_config(fresh)
            self.model_id = self.catalog.main.name
            self.model_names = {name for entry in self.catalog.entries for name in entry.names()}
        if fresh.device != self.cfg.device:
            await self.gpu.restart(fresh)
        fresh.source = self.cfg.source
        self.cfg = fresh
        self.apply_live_config()
        self.replan()
        for worker in list(self.workers.values()):
            if worker.profile.embeddings and worker.state == "stopped":
                continue  # not started yet: its first request starts it with the new profile
            await worker.restart(reason)

    @property
    def simulated_device(self) -> SimulatedDevice | None:
        return self.gpu.watch.simulated


def _log_failure(task: asyncio.Task[Any]) -> None:
    """A service task that ends with an error says so in the log (an asyncio task's error is otherwise
    seen only when someone awaits it, and nobody awaits these until shutdown)."""
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("task %s failed", task.get_name(), exc_info=error)
