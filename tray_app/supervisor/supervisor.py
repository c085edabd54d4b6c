"""One owner per worker: spawn, wait for /health, watch it, classify its failures, restart it with backoff.

All state changes happen in one asyncio task (the owner) that reads a queue of messages: commands from the
public methods, the process's exit, health-probe results. Nobody else writes the state, so there is no
"read the state, then act on it" race; callers ask (`ensure_ready`) instead of peeking. Every transition is
published as an event with a reason.

The worker is llama.cpp's own `llama-server` (tray_app.engine), started with explicit arguments from the
plan. It is ready once `/health` answers 200 (503 while it loads), its load passed the checks of
`load_check`, and one warm-up token came back (`health_probe`): the first real request then costs no more
than the next one. Drill faults (`drill_faults`), status rendering (`status_view`) and the calibration
record (`calibration`) are functions this owner calls.

The interface the router and the service use is deliberately narrow (start, stop, restart, ensure_ready,
base_url, request_headers, status, mark_unhealthy, arm_fault, note_tokens).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from tray_app import paths
from tray_app.config import SupervisorConfig
from tray_app.contract.events import EventBus, WorkerRestarted, WorkerStateChanged, WorkerUnhealthy
from tray_app.contract.status import WorkerStatus
from tray_app.contract.vocabulary import WORKER_STATES, WorkerState
from tray_app.engine import WORKER_KEY_ENV, binary, offload
from tray_app.engine.faults import ArmedFault
from tray_app.engine.llama_log import parse_buffer_sizes
from tray_app.engine.profile import WorkerProfile
from tray_app.supervisor import drill_faults, health_probe, launch_plan, load_check, status_view
from tray_app.supervisor.backoff import Backoff
from tray_app.supervisor.calibration import engine_lists_a_gpu, record_calibration
from tray_app.supervisor.classify import FAILURE_KINDS, Failure, FailureKind, classify_exit, hung_failure
from tray_app.supervisor.failed_allocation import failed_allocation
from tray_app.supervisor.mailbox import Mailbox
from tray_app.supervisor.messages import Attempt, Command, Exited, HealthResult, Message, SupervisorError
from tray_app.supervisor.ports import free_port
from tray_app.supervisor.process import worker_log_path

__all__ = ["STATES", "State", "SupervisorError", "WorkerSupervisor"]

State = WorkerState
log = logging.getLogger(__name__)
STATES = WORKER_STATES

# Weighs each start before its process is spawned (the host's GPU gate): the profile to start with, or
# why it is not started (the worker then stays stopped with that reason).
StartGate = Callable[[WorkerProfile], Awaitable["WorkerProfile | str"]]

STARTUP_POLL_SECONDS = 0.1  # /health polling while a worker loads: load takes well under a second
DEATH_GRACE_SECONDS = 0.5  # how long a reported failure waits for a dying process to be reaped


class WorkerSupervisor:
    def __init__(
        self,
        profile: WorkerProfile,
        bus: EventBus,
        settings: SupervisorConfig,
        *,
        log_dir: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        engine: binary.EngineInfo | None = None,
        start_gate: StartGate | None = None,
    ) -> None:
        self._start_gate = start_gate
        self._profile = profile  # for the next start; the running process keeps its own (Attempt.profile)
        self._bus = bus
        self._settings = settings
        self._log_dir = log_dir
        self._clock = clock
        self._state: State = "stopped"
        self._state_reason = "not started"
        self._attempt: Attempt | None = None
        self._generation = 0
        self._backoff = Backoff(settings.backoff_initial, settings.backoff_max, settings.stable_after)
        self._restarts = 0
        self._last_failure: dict[str, Any] | None = None
        self._retry_at: float | None = None  # monotonic
        self._next_retry_wall: float | None = None  # the same moment as a wall-clock time, for status
        self._health: dict[str, Any] = {}
        self._mailbox = Mailbox(clock)
        self._owner: asyncio.Task[None] | None = None
        self._prober = health_probe.Prober(settings.health_timeout, self._mailbox.post)
        self._engine = engine
        # Each worker accepts only the router: llama-server answers any origin (CORS *) on its own port.
        # A harness that starts the service (bench, tests) may set the key to ask the workers directly.
        self._key = os.environ.get(WORKER_KEY_ENV) or secrets.token_urlsafe(24)
        self._armed: ArmedFault | None = None

    # ------------------------------------------------------------------------------------ public interface

    @property
    def role(self) -> str:
        return self._profile.role

    @property
    def profile(self) -> WorkerProfile:
        """The profile the next start begins with (the plan's)."""
        return self._profile

    @property
    def running_profile(self) -> WorkerProfile:
        """What the process started last runs with: the start gate may have made it smaller than `profile`
        (less memory free then, or what an earlier load lacked). `profile` before any start."""
        attempt = self._attempt
        return attempt.profile if attempt is not None else self._profile

    @property
    def state(self) -> State:
        return self._state

    @property
    def pid(self) -> int | None:
        attempt = self._attempt
        return attempt.process.pid if attempt is not None and attempt.process.returncode is None else None

    @property
    def base_url(self) -> str | None:
        """Where the worker's OpenAI API is, while a process is up (it changes on every restart)."""
        attempt = self._attempt
        if attempt is None or attempt.process.exited.done():
            return None
        return f"http://127.0.0.1:{attempt.port}"

    @property
    def health(self) -> dict[str, Any]:
        """The worker's last /health answer (empty before the first one of the current process)."""
        return dict(self._health)

    async def start(self) -> bool:
        """Start now (also cutting short a backoff wait); True once /health says ready, False if this attempt
        failed (the process exited, or no ready answer within start_timeout); `status()` says why."""
        return bool(await self._send(Command("start", reason="start requested")))

    async def ensure_ready(self, timeout: float) -> bool:
        """Ready within `timeout` seconds? Starts a stopped (on-demand) worker, never skips a backoff wait."""
        if self._state == "ready":
            return True
        await self._send(Command("ensure_started", reason="needed for a request"))
        settled = await self._mailbox.wait_for(lambda: self._state in ("ready", "failed", "stopped"), timeout)
        return settled and self._state == "ready"

    def update_profile(self, profile: WorkerProfile) -> None:
        """Use this profile (a new plan or config) from the worker's next start on. Runs on the service's
        loop; the owner applies it, so a start in progress is checked against the profile it began with."""
        if profile.role != self._profile.role:
            raise ValueError(f"a {profile.role} profile cannot replace the {self._profile.role} worker's")
        if self._owner is None or self._owner.done():
            self._profile = profile  # no owner (yet, or any more): nothing else writes it
            return
        # Put, not posted: a restart sent right after must find it applied.
        self._mailbox.put(Command("update_profile", profile=profile))

    async def restart(self, reason: str) -> bool:
        """Stop the worker (grace, then SIGKILL) and start a fresh one now; True when it is ready."""
        return bool(await self._send(Command("restart", reason=reason)))

    async def stop(self) -> None:
        """SIGTERM to the worker's process group, `stop_grace` seconds, then SIGKILL; state stopped."""
        if self._owner is None:
            return
        await self._send(Command("stop", reason="stop requested"))

    async def aclose(self) -> None:
        """Stop the worker and end the owner task (the supervisor cannot be used afterwards)."""
        await self.stop()
        if self._owner is not None:
            self._owner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._owner
            self._owner = None
        await self._prober.aclose()

    @property
    def last_failure(self) -> dict[str, Any] | None:
        """The latest failure: kind, message, when (wall clock) and the pid of the process that failed."""
        return self._last_failure

    async def failure_of(self, pid: int, timeout: float) -> dict[str, Any] | None:
        """How the process `pid` failed, once this supervisor has classified it (None if it has not within
        `timeout` seconds): a request that saw its connection drop asks this to name what happened."""

        def known() -> bool:
            return self._last_failure is not None and self._last_failure.get("pid") == pid

        await self._mailbox.wait_for(known, timeout)
        return self._last_failure if known() else None

    def mark_unhealthy(self, reason: str, kind: str, *, pid: int | None = None) -> None:
        """A request saw this worker fail (e.g. `oom_decode`): restart it in the background. Thread-safe.

        `pid`: the process the request talked to. A report about another process is dropped: several jobs
        that saw one incident must not fail the worker that replaced it. None: applies to the current one."""
        self._mailbox.post(Command("mark_unhealthy", reason=reason, kind=kind, pid=pid))

    @property
    def request_headers(self) -> dict[str, str]:
        """Headers every request to this worker carries (its API key)."""
        return {"Authorization": f"Bearer {self._key}"}

    async def arm_fault(self, kind: str, after_tokens: int) -> dict[str, Any]:
        """Arm a one-shot fault (tray_app.engine.faults) in a worker started with faults enabled."""
        up = self.base_url is not None
        self._armed = drill_faults.arm(
            self.role, self._profile.enable_faults, self._state, up, kind, after_tokens
        )
        return {"armed": self._armed.to_dict(), "pid": self.pid}

    def note_tokens(self, count: int) -> None:
        """The router relayed `count` more tokens from this worker (0: a request is about to be sent). Fires
        an armed fault once it is due. Runs on the service's loop, like every other call here."""
        fault = self._armed
        if fault is None or not drill_faults.due(fault, count):
            return
        self._armed = None  # one-shot
        attempt = self._attempt
        if attempt is not None and not attempt.process.exited.done():
            drill_faults.fire(fault, attempt.process)

    def status(self) -> WorkerStatus:
        return status_view.worker_status(
            state=self._state,
            reason=self._state_reason,
            attempt=self._attempt,
            pid=self.pid,
            base_url=self.base_url,
            restarts=self._restarts,
            last_failure=self._last_failure,
            next_retry_at=self._next_retry_wall,
            profile=self._profile,
            engine=self._engine,
            log_file=self._log_file(),
            health=self._health,
        )

    # --------------------------------------------------------------------------------- messaging plumbing

    def _ensure_owner(self) -> None:
        if self._owner is not None and not self._owner.done():
            return
        self._mailbox.open()
        self._owner = asyncio.get_running_loop().create_task(self._run(), name=f"supervisor-{self.role}")

    async def _send(self, command: Command) -> Any:
        self._ensure_owner()
        return await self._mailbox.send(command)

    def _log_file(self) -> Path:
        return worker_log_path(self._log_dir or paths.log_dir(), self.role)

    # -------------------------------------------------------------------------------------------- owner

    async def _run(self) -> None:
        while True:
            due = self._next_due()
            timeout = None if due is None else max(0.0, due - self._clock())
            try:
                message = await self._mailbox.receive(timeout)
            except TimeoutError:
                await self._on_timer()
                continue
            await self._handle(message)

    def _next_due(self) -> float | None:
        candidates: list[float] = []
        attempt = self._attempt
        if self._state == "restarting" and self._retry_at is not None:
            candidates.append(self._retry_at)
        if attempt is not None and self._state in ("starting", "ready"):
            if not attempt.probe_in_flight:
                candidates.append(attempt.probe_due)
            if self._state == "starting":
                candidates.append(attempt.started_at + self._settings.start_timeout)
        return min(candidates) if candidates else None

    async def _on_timer(self) -> None:
        now = self._clock()
        attempt = self._attempt
        if self._state == "restarting" and self._retry_at is not None and now >= self._retry_at:
            await self._spawn(f"retry after {self._last_failure_kind()}", counts_as_restart=True)
            return
        if attempt is None or self._state not in ("starting", "ready"):
            return
        if self._state == "starting" and now >= attempt.started_at + self._settings.start_timeout:
            await self._fail(hung_failure(self._settings.start_timeout, "start"))
            return
        if not attempt.probe_in_flight and now >= attempt.probe_due:
            attempt.probe_in_flight = True
            self._prober.start(
                attempt.generation,
                attempt.port,
                self.request_headers,
                warm_up=self._state == "starting",  # the first ready answer waits for one token
                embeddings=attempt.profile.embeddings,
            )

    async def _handle(self, message: Message) -> None:
        if isinstance(message, Exited):
            await self._on_exit(message)
        elif isinstance(message, HealthResult):
            await self._on_health(message)
        else:
            await self._on_command(message)

    async def _on_command(self, command: Command) -> None:
        result: Any = None
        if command.name in ("start", "ensure_started"):
            result = await self._on_start(manual=command.name == "start")
        elif command.name == "stop":
            await self._stop_process("stopped", "stop requested")
            self._backoff.reset()
        elif command.name == "restart":
            await self._stop_process("restarting", f"restart: {command.reason}")
            result = self._spawn_and_outcome(await self._spawn(command.reason, counts_as_restart=True))
        elif command.name == "update_profile":
            assert command.profile is not None
            self._profile = command.profile
        else:
            await self._on_mark_unhealthy(command)
        self._mailbox.reply(command, result)

    def _spawn_and_outcome(self, attempt: Attempt | None) -> asyncio.Future[bool] | bool:
        return attempt.outcome if attempt is not None else False

    async def _on_start(self, manual: bool) -> asyncio.Future[bool] | bool:
        if self._state == "ready":
            return True
        if self._state == "starting" and self._attempt is not None:
            return self._attempt.outcome
        if self._state == "restarting" and not manual:
            return False  # keep the backoff wait; ensure_ready waits for its outcome
        if self._state == "failed" and not manual:
            return False  # a worker that cannot start (bad config) is started again only on request
        reason = "start requested" if manual else "started on demand"
        return self._spawn_and_outcome(
            await self._spawn(reason, counts_as_restart=self._state == "restarting")
        )

    async def _on_mark_unhealthy(self, command: Command) -> None:
        attempt = self._attempt
        if attempt is None or self._state not in ("starting", "ready"):
            return
        if command.pid is not None and command.pid != attempt.process.pid:
            log.debug(
                "%s worker: dropped a report about process %s (now %s): %s",
                self.role,
                command.pid,
                attempt.process.pid,
                command.reason,
            )
            return
        # A request that saw the connection drop may be ahead of the process's own death (the kernel closes
        # its sockets before it reaps it): give the exit a moment, so the real classification wins.
        grace = None if attempt.process.dead() else DEATH_GRACE_SECONDS
        try:
            returncode = await asyncio.wait_for(asyncio.shield(attempt.process.exited), timeout=grace)
        except TimeoutError:
            await self._fail(Failure(_known_kind(command.kind), command.reason))
            return
        await self._on_exit(Exited(attempt.generation, returncode))

    async def _on_exit(self, message: Exited) -> None:
        attempt = self._attempt
        if (
            attempt is None
            or message.generation != attempt.generation
            or self._state not in ("starting", "ready")
        ):
            return  # an old process, or one we stopped on purpose
        process = attempt.process
        failure = classify_exit(message.returncode, process.load_log(), process.tail())
        await self._fail(_sized(failure, attempt.profile, process.load_log()))

    async def _on_health(self, result: HealthResult) -> None:
        attempt = self._attempt
        if attempt is None or result.generation != attempt.generation:
            return
        attempt.probe_in_flight = False
        now = self._clock()
        interval = STARTUP_POLL_SECONDS if self._state == "starting" else self._settings.health_interval
        attempt.probe_due = now + interval
        if self._state not in ("starting", "ready"):
            return
        if result.body is not None:
            attempt.unanswered_since = None
            if self._state == "starting" and result.body.get("state") == "ready":
                await self._on_loaded(attempt, result.body, now)
            return
        if self._state == "starting":
            return  # not listening yet; the start deadline and the exit watcher cover one that never will
        if result.timed_out:
            await self._fail(hung_failure(self._settings.health_timeout, "a health check"))
            return
        if attempt.unanswered_since is None:
            attempt.unanswered_since = now
        elif now - attempt.unanswered_since >= self._settings.health_timeout:
            await self._fail(
                Failure(
                    "hung", f"/health unreachable for {now - attempt.unanswered_since:.1f} s: {result.error}"
                )
            )

    async def _on_loaded(self, attempt: Attempt, answer: dict[str, Any], now: float) -> None:
        """The first ready answer: what llama.cpp allocated, read once from the load log, is checked, shown
        and recorded; then the worker is ready."""
        load_log = "\n".join(attempt.process.load_log())
        buffers = parse_buffer_sizes(load_log)
        attempt.placement = offload.parse_offload(load_log, buffers)
        refused = load_check.check_load(attempt.profile, attempt.placement, buffers)
        if refused is not None:
            for line in refused.log_lines:
                attempt.process.log_line(line)
            await self._fail(_sized(refused.failure, attempt.profile, refused.log_lines))
            return
        attempt.ready_at = now
        attempt.load_seconds = now - attempt.started_at
        self._health = status_view.worker_health(attempt, answer, buffers, self._engine)
        engine = self._engine
        gpu_build = (
            attempt.profile.n_gpu_layers == 0
            and engine is not None
            and await asyncio.to_thread(engine_lists_a_gpu, engine.path)  # a child process, read once
        )
        record_calibration(attempt.profile, buffers, gpu_build=gpu_build)
        self._backoff.note_ready(now)
        self._retry_at = self._next_retry_wall = None
        self._set_state("ready", f"answered /health in {now - attempt.started_at:.2f} s")
        if not attempt.outcome.done():
            attempt.outcome.set_result(True)

    # ------------------------------------------------------------------------------------------ effects

    async def _spawn(self, reason: str, counts_as_restart: bool) -> Attempt | None:
        self._retry_at = self._next_retry_wall = None
        self._generation += 1
        generation = self._generation
        port = free_port()
        profile = self._profile
        if self._start_gate is not None:
            gated = await self._start_gate(profile)
            if isinstance(gated, str):
                self._attempt = None
                self._set_state("stopped", gated)
                return None
            profile = gated
        launch = self._prepare_launch(profile, port)
        if isinstance(launch, str):
            self._attempt = None
            await self._fail(Failure("bad_config", launch), never_ready=True)
            return None
        try:
            process = launch_plan.start(launch, self._log_file(), profile.log_requests)
        except OSError as error:
            self._attempt = None
            await self._fail(Failure("bad_config", f"could not start the worker: {error}"), never_ready=True)
            return None
        attempt = Attempt(generation, process, port, self._clock(), profile, memory_limit=launch.memory_limit)
        attempt.psutil_process = status_view.usage_meter(process.pid)
        self._armed = None  # a fault armed for the previous process does not carry over
        process.exited.add_done_callback(
            lambda future: (
                self._mailbox.post(Exited(generation, future.result())) if not future.cancelled() else None
            )
        )
        self._attempt = attempt
        self._health = {}
        self._set_state("starting", reason)
        if counts_as_restart:
            self._restarts += 1
            self._bus.publish(
                WorkerRestarted(
                    role=self.role, pid=process.pid, attempt=self._backoff.failures, reason=reason
                )
            )
        return attempt

    def _prepare_launch(self, profile: WorkerProfile, port: int) -> launch_plan.Launch | str:
        """The worker's launch, or why there is none (no engine, a profile refused before it starts)."""
        try:
            if self._engine is None:
                self._engine = binary.find("")
            return launch_plan.prepare(self._engine.path, profile, port, self._key)
        except binary.EngineError as error:
            return str(error)
        except Exception as error:  # a fault here must end this start, not the owner (start() would hang)
            log.exception("preparing the %s worker failed", self.role)
            return f"could not prepare the worker: {error!r}"

    async def _stop_process(self, final_state: State, reason: str) -> None:
        attempt = self._attempt
        self._retry_at = self._next_retry_wall = None
        if attempt is not None and not attempt.process.exited.done():
            self._set_state("stopping", reason)
            await attempt.process.stop(self._settings.stop_grace)
        if attempt is not None and not attempt.outcome.done():
            attempt.outcome.set_result(False)
        self._set_state(final_state, reason)

    async def _fail(self, failure: Failure, never_ready: bool | None = None) -> None:
        """Record a failure, make sure the process is gone, and schedule the next start (or give up)."""
        attempt = self._attempt
        now = self._clock()
        if never_ready is None:
            never_ready = attempt is None or attempt.ready_at is None
        self._last_failure = {
            "kind": failure.kind,
            "message": failure.message,
            "at": time.time(),
            "pid": attempt.process.pid if attempt is not None else None,
        }
        self._set_state("unhealthy", f"{failure.kind}: {failure.message}")
        self._bus.publish(
            WorkerUnhealthy(
                role=self.role,
                kind=failure.kind,
                reason=failure.message,
                failed_bytes=failure.allocation.failed_bytes if failure.allocation else 0,
                reached_bytes=failure.allocation.reached_bytes if failure.allocation else 0,
            )
        )
        try:
            await self._end_failed(attempt, failure, now, never_ready)
        finally:
            # Resolved last, so a caller of start() sees the state the failure led to (e.g. restarting).
            if attempt is not None and not attempt.outcome.done():
                attempt.outcome.set_result(False)

    async def _end_failed(
        self, attempt: Attempt | None, failure: Failure, now: float, never_ready: bool
    ) -> None:
        if attempt is not None and not attempt.process.exited.done():
            # A hung process gets no grace: it would not use it.
            if failure.kind == "hung":
                await attempt.process.kill()
            else:
                await attempt.process.stop(self._settings.stop_grace)
        if failure.kind == "bad_config":
            self._set_state(
                "failed", f"{failure.message} (not retried: fix the configuration, then start it)"
            )
            return
        # A worker that never became ready is not retried at once: loading again would most likely fail again.
        delay = self._backoff.note_failure(now, load_failure=failure.kind == "oom_load" or never_ready)
        if delay <= 0:
            await self._spawn(f"restart after {failure.kind}", counts_as_restart=True)
            return
        self._retry_at = now + delay
        self._next_retry_wall = time.time() + delay
        self._set_state("restarting", f"{failure.kind}: next start in {delay:.1f} s")

    def _set_state(self, new: State, reason: str) -> None:
        old = self._state
        self._state = new
        self._state_reason = reason
        self._bus.publish(WorkerStateChanged(role=self.role, old=old, new=new, reason=reason, pid=self.pid))
        self._mailbox.changed()

    def _last_failure_kind(self) -> str:
        return str(self._last_failure["kind"]) if self._last_failure else "failure"


def _sized(failure: Failure, profile: WorkerProfile, load_lines: Sequence[str]) -> Failure:
    """An out-of-memory load with the allocation that failed, where llama.cpp printed its size."""
    if failure.kind != "oom_load":
        return failure
    simulated = profile.simulated_vram_bytes is not None
    return replace(failure, allocation=failed_allocation(load_lines, simulated=simulated))


def _known_kind(kind: str) -> FailureKind:
    return cast(FailureKind, kind) if kind in FAILURE_KINDS else "exited"
