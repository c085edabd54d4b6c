"""One owner per worker: spawn, wait for /health, watch it, classify its failures, restart it with backoff.

All state changes happen in one asyncio task (the owner) that reads a queue of messages: commands from the
public methods, the process's exit, health-probe results. Nobody else writes the state, so there is no
"read the state, then act on it" race; callers ask (`ensure_ready`) instead of peeking. Every transition is
published as an event with a reason.

The worker is llama.cpp's own `llama-server` (tray_app.engine), started with explicit arguments from the
plan. It is ready once `/health` answers 200 (503 while it loads), its load passed the simulated device's
check where there is one, and one warm-up token came back: the first real request then costs no more than
the next one.

The interface the router and the service use is deliberately narrow (start, stop, restart, ensure_ready,
base_url, request_headers, status, mark_unhealthy, arm_fault, note_tokens).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import httpx
import psutil

from tray_app import paths
from tray_app.budget import calibration
from tray_app.budget.llama_log import BufferSizes, parse_buffer_sizes
from tray_app.budget.model_info import inspect_model
from tray_app.config import SupervisorConfig
from tray_app.contract.events import EventBus, WorkerRestarted, WorkerStateChanged, WorkerUnhealthy
from tray_app.contract.status import WorkerStatus
from tray_app.contract.vocabulary import WORKER_STATES, WorkerState
from tray_app.engine import WORKER_KEY_ENV, binary, offload, simulated
from tray_app.engine.argv import llama_server_argv, worker_env
from tray_app.engine.devices import DeviceListError, list_devices
from tray_app.engine.faults import SIGNALS, ArmedFault, check_fault
from tray_app.engine.loopback_http import ConnectionFailed, ConnectTimeout, Response, UpstreamPool
from tray_app.supervisor.backoff import Backoff
from tray_app.supervisor.classify import FAILURE_KINDS, Failure, FailureKind, classify_exit, hung_failure
from tray_app.supervisor.process import WorkerProcess, worker_log_path
from tray_app.supervisor.profile import WorkerProfile

State = WorkerState
log = logging.getLogger(__name__)
STATES = WORKER_STATES

STARTUP_POLL_SECONDS = 0.1  # /health polling while a worker loads: load takes well under a second
WARM_UP_SECONDS = 60.0  # the first token after load (a cold page cache or a slow device can take a while)
DEATH_GRACE_SECONDS = 0.5  # how long a reported failure waits for a dying process to be reaped


class SupervisorError(RuntimeError):
    """A request to the supervisor could not be carried out (e.g. faults armed on a worker that is down)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ------------------------------------------------------------------------------------------------ messages


@dataclass
class _Command:
    name: Literal["start", "ensure_started", "stop", "restart", "mark_unhealthy"]
    reason: str = ""
    kind: str = ""
    done: asyncio.Future[Any] | None = None


@dataclass
class _Exited:
    generation: int
    returncode: int


@dataclass
class _HealthResult:
    generation: int
    body: dict[str, Any] | None
    error: str = ""
    timed_out: bool = False


_Message = _Command | _Exited | _HealthResult


@dataclass
class _Attempt:
    """One spawned process and what the owner tracks about it."""

    generation: int
    process: WorkerProcess
    port: int
    started_at: float
    ready_at: float | None = None
    probe_due: float = 0.0
    probe_in_flight: bool = False
    unanswered_since: float | None = None
    outcome: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    psutil_process: psutil.Process | None = None
    load_seconds: float | None = None
    memory_limit: int | None = None  # RLIMIT_AS of a worker on a simulated device
    placement: offload.Offload | None = None  # where llama.cpp put the model, read once it is loaded


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
    ) -> None:
        self._profile = profile
        self._bus = bus
        self._settings = settings
        self._log_dir = log_dir
        self._clock = clock
        self._state: State = "stopped"
        self._state_reason = "not started"
        self._attempt: _Attempt | None = None
        self._generation = 0
        self._backoff = Backoff(settings.backoff_initial, settings.backoff_max, settings.stable_after)
        self._restarts = 0
        self._last_failure: dict[str, Any] | None = None
        self._retry_at: float | None = None  # monotonic
        self._next_retry_wall: float | None = None  # the same moment as a wall-clock time, for status
        self._health: dict[str, Any] = {}
        self._queue: asyncio.Queue[_Message] | None = None
        self._owner: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None  # control calls (faults); health checks use the pool
        self._probe_pool: UpstreamPool | None = None
        self._changed: asyncio.Event | None = None
        self._probes: set[asyncio.Task[None]] = set()  # kept until done: never collected mid-flight
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
        return self._profile

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
        return bool(await self._send(_Command("start", reason="start requested")))

    async def ensure_ready(self, timeout: float) -> bool:
        """Ready within `timeout` seconds? Starts a stopped (on-demand) worker, never skips a backoff wait."""
        if self._state == "ready":
            return True
        await self._send(_Command("ensure_started", reason="needed for a request"))
        return await self._wait_for(lambda: self._state in ("ready", "failed", "stopped"), timeout) and (
            self._state == "ready"
        )

    def update_profile(self, profile: WorkerProfile) -> None:
        """Use this profile (a new plan or config) from the worker's next start on."""
        if profile.role != self._profile.role:
            raise ValueError(f"a {profile.role} profile cannot replace the {self._profile.role} worker's")
        self._profile = profile

    async def reconfigure(self, profile: WorkerProfile, reason: str) -> bool:
        """Restart the worker with a new profile now; True when it is ready."""
        self.update_profile(profile)
        return await self.restart(reason)

    async def restart(self, reason: str) -> bool:
        """Stop the worker (grace, then SIGKILL) and start a fresh one now; True when it is ready."""
        return bool(await self._send(_Command("restart", reason=reason)))

    async def stop(self) -> None:
        """SIGTERM to the worker's process group, `stop_grace` seconds, then SIGKILL; state stopped."""
        if self._owner is None:
            return
        await self._send(_Command("stop", reason="stop requested"))

    async def aclose(self) -> None:
        """Stop the worker and end the owner task (the supervisor cannot be used afterwards)."""
        await self.stop()
        if self._owner is not None:
            self._owner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._owner
            self._owner = None
        for probe in list(self._probes):
            probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probe
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._probe_pool is not None:
            await self._probe_pool.aclose()
            self._probe_pool = None

    @property
    def last_failure(self) -> dict[str, Any] | None:
        """The latest failure: kind, message, when (wall clock) and the pid of the process that failed."""
        return self._last_failure

    async def failure_of(self, pid: int, timeout: float) -> dict[str, Any] | None:
        """How the process `pid` failed, once this supervisor has classified it (None if it has not within
        `timeout` seconds): a request that saw its connection drop asks this to name what happened."""

        def known() -> bool:
            return self._last_failure is not None and self._last_failure.get("pid") == pid

        await self._wait_for(known, timeout)
        return self._last_failure if known() else None

    def mark_unhealthy(self, reason: str, kind: str) -> None:
        """A request saw this worker fail (e.g. `oom_decode`): restart it in the background. Thread-safe."""
        self._post(_Command("mark_unhealthy", reason=reason, kind=kind))

    @property
    def request_headers(self) -> dict[str, str]:
        """Headers every request to this worker carries (its API key)."""
        return {"Authorization": f"Bearer {self._key}"}

    async def arm_fault(self, kind: str, after_tokens: int) -> dict[str, Any]:
        """Arm a one-shot fault (tray_app.engine.faults) in a worker started with faults enabled."""
        if not self._profile.enable_faults:
            raise SupervisorError(f"fault injection is off for the {self.role} worker")
        if self.base_url is None or self._state != "ready":
            raise SupervisorError(f"the {self.role} worker is {self._state}: no fault can be armed")
        try:
            self._armed = check_fault(kind, after_tokens)
        except ValueError as error:
            raise SupervisorError(f"the {self.role} worker refused the fault: {error}") from None
        return {"armed": self._armed.to_dict(), "pid": self.pid}

    def note_tokens(self, count: int) -> None:
        """The router relayed `count` more tokens from this worker (0: a request is about to be sent). Fires
        an armed fault once it is due. Runs on the service's loop, like every other call here."""
        fault = self._armed
        if fault is None:
            return
        fault.seen_tokens += count
        if fault.seen_tokens < fault.after_tokens:
            return
        self._armed = None  # one-shot
        attempt = self._attempt
        if attempt is None or attempt.process.exited.done():
            return
        attempt.process.log_line(f"--- fault injected: {fault.kind} after {fault.seen_tokens} tokens (drill)")
        attempt.process.signal_group(SIGNALS[fault.kind])

    def status(self) -> WorkerStatus:
        attempt = self._attempt
        rss = cpu = None
        if attempt is not None and attempt.psutil_process is not None:
            try:
                rss = attempt.psutil_process.memory_info().rss
                cpu = attempt.psutil_process.cpu_percent(interval=None)
            except psutil.Error:
                rss = cpu = None
        return {
            "role": self.role,
            "state": self._state,
            "reason": self._state_reason,
            "pid": self.pid,
            "base_url": self.base_url,
            "rss_bytes": rss,
            "cpu_percent": cpu,
            "restarts": self._restarts,
            "last_failure": self._last_failure,
            "next_retry_at": self._next_retry_wall,
            "warm": self._profile.warm,
            "warm_reason": self._profile.warm_reason,
            "log_file": str(self._log_file()),
            "profile": self._profile.to_dict(),
            "engine": self._engine.to_dict() if self._engine else None,
            "health": dict(self._health),
        }

    # --------------------------------------------------------------------------------- messaging plumbing

    def _ensure_owner(self) -> None:
        if self._owner is not None and not self._owner.done():
            return
        self._loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        self._changed = asyncio.Event()
        self._owner = self._loop.create_task(self._run(), name=f"supervisor-{self.role}")

    async def _send(self, command: _Command) -> Any:
        self._ensure_owner()
        assert self._loop is not None and self._queue is not None
        command.done = self._loop.create_future()
        self._queue.put_nowait(command)
        return await command.done

    def _post(self, message: _Message) -> None:
        loop, queue = self._loop, self._queue
        if loop is None or queue is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(queue.put_nowait, message)

    async def _wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        deadline = self._clock() + timeout
        while not predicate():
            left = deadline - self._clock()
            if left <= 0 or self._changed is None:
                return False
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=left)
        return True

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            # trust_env=False: a proxy from the environment must never sit between us and 127.0.0.1.
            self._client = httpx.AsyncClient(trust_env=False)
        return self._client

    def _log_file(self) -> Path:
        return worker_log_path(self._log_dir or paths.log_dir(), self.role)

    # -------------------------------------------------------------------------------------------- owner

    async def _run(self) -> None:
        assert self._queue is not None
        while True:
            due = self._next_due()
            timeout = None if due is None else max(0.0, due - self._clock())
            try:
                message = await asyncio.wait_for(self._queue.get(), timeout=timeout)
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
            warm_up = self._state == "starting"
            probe = asyncio.get_running_loop().create_task(
                self._probe(attempt.generation, attempt.port, warm_up)
            )
            self._probes.add(probe)
            probe.add_done_callback(self._probes.discard)

    async def _handle(self, message: _Message) -> None:
        if isinstance(message, _Exited):
            await self._on_exit(message)
        elif isinstance(message, _HealthResult):
            await self._on_health(message)
        else:
            await self._on_command(message)

    async def _on_command(self, command: _Command) -> None:
        result: Any = None
        if command.name in ("start", "ensure_started"):
            result = await self._on_start(manual=command.name == "start")
        elif command.name == "stop":
            await self._stop_process("stopped", "stop requested")
            self._backoff.reset()
            result = None
        elif command.name == "restart":
            await self._stop_process("restarting", f"restart: {command.reason}")
            result = self._spawn_and_outcome(await self._spawn(command.reason, counts_as_restart=True))
        else:
            await self._on_mark_unhealthy(command.reason, command.kind)
        if command.done is not None and not command.done.done():
            if isinstance(result, asyncio.Future):
                # Resolve the caller when the attempt settles, without holding up the owner.
                _chain(result, command.done)
            else:
                command.done.set_result(result)

    def _spawn_and_outcome(self, attempt: _Attempt | None) -> asyncio.Future[bool] | bool:
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

    async def _on_mark_unhealthy(self, reason: str, kind: str) -> None:
        attempt = self._attempt
        if attempt is None or self._state not in ("starting", "ready"):
            return
        # A request that saw the connection drop may be ahead of the process's own death (the kernel closes
        # its sockets before it reaps it): give the exit a moment, so the real classification wins.
        grace = None if _process_gone(attempt) else DEATH_GRACE_SECONDS
        try:
            returncode = await asyncio.wait_for(asyncio.shield(attempt.process.exited), timeout=grace)
        except TimeoutError:
            await self._fail(Failure(_known_kind(kind), reason))
            return
        await self._on_exit(_Exited(attempt.generation, returncode))

    async def _on_exit(self, message: _Exited) -> None:
        attempt = self._attempt
        if (
            attempt is None
            or message.generation != attempt.generation
            or self._state not in ("starting", "ready")
        ):
            return  # an old process, or one we stopped on purpose
        process = attempt.process
        await self._fail(classify_exit(message.returncode, process.load_log(), process.tail()))

    async def _on_health(self, result: _HealthResult) -> None:
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
                # What llama.cpp allocated, read once from the load log: checked, shown, recorded.
                load_log = "\n".join(attempt.process.load_log())
                buffers = parse_buffer_sizes(load_log)
                attempt.placement = offload.parse_offload(load_log, buffers)
                failure = self._check_load(attempt, buffers)
                if failure is not None:
                    await self._fail(failure)
                    return
                attempt.ready_at = now
                attempt.load_seconds = now - attempt.started_at
                self._health = self._worker_health(attempt, result.body, buffers)
                record_calibration(self._profile, buffers)
                self._backoff.note_ready(now)
                self._retry_at = self._next_retry_wall = None
                self._set_state("ready", f"answered /health in {now - attempt.started_at:.2f} s")
                if not attempt.outcome.done():
                    attempt.outcome.set_result(True)
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

    async def _probe(self, generation: int, port: int, warm_up: bool) -> None:
        # The lean loopback client, not httpx: this runs every `health_interval` for as long as the service
        # does, and httpx cost about 2 ms of CPU per check, most of an idle service's CPU.
        timeout = self._settings.health_timeout
        if self._probe_pool is None:
            self._probe_pool = UpstreamPool(connect_timeout=timeout)
        pool = self._probe_pool
        response: Response | None = None
        try:
            async with asyncio.timeout(timeout):
                response = await pool.send("GET", f"http://127.0.0.1:{port}/health", b"", {})
                raw = await response.read()
            if response.status == 503:
                message = _HealthResult(generation, {"state": "loading"})  # llama-server: "Loading model"
            elif response.status != 200:
                message = _HealthResult(generation, None, error=f"HTTP {response.status}")
            else:
                body = json.loads(raw)
                if warm_up:
                    async with asyncio.timeout(WARM_UP_SECONDS):
                        await self._warm_up(pool, port)
                message = _HealthResult(generation, {**body, "state": "ready"})
        except (TimeoutError, ConnectTimeout):
            if response is not None:
                response.abort()  # a stopped worker never answers: its connection must not linger
            message = _HealthResult(generation, None, error="timed out", timed_out=True)
        except (ConnectionFailed, ValueError) as error:
            message = _HealthResult(generation, None, error=f"{type(error).__name__}: {error}")
        self._post(message)

    async def _warm_up(self, pool: UpstreamPool, port: int) -> None:
        """One token (one embedding) through the whole path, so the first real request finds everything
        paged in."""
        request: dict[str, Any]
        if self._profile.embeddings:
            path, request = "/v1/embeddings", {"input": "Hi"}
        else:
            path, request = "/completion", {"prompt": "Hi", "n_predict": 1, "cache_prompt": False}
        headers = {"Content-Type": "application/json", **self.request_headers}
        response = await pool.send(
            "POST", f"http://127.0.0.1:{port}{path}", json.dumps(request).encode(), headers
        )
        await response.read()
        if response.status != 200:
            raise ConnectionFailed(f"warm-up answered HTTP {response.status}")

    # ------------------------------------------------------------------------------------------ effects

    async def _spawn(self, reason: str, counts_as_restart: bool) -> _Attempt | None:
        self._retry_at = self._next_retry_wall = None
        self._generation += 1
        generation = self._generation
        port = free_port()
        profile = self._profile
        try:
            if self._engine is None:
                self._engine = binary.find("")
            argv = llama_server_argv(self._engine.path, profile, port)
            refusal = self._refusal_before_start(self._engine.path)
        except binary.EngineError as error:
            refusal = str(error)
        if refusal is not None:
            self._attempt = None
            await self._fail(Failure("bad_config", refusal), never_ready=True)
            return None
        # Level 4 ("trace"): the load log then has the buffer sizes, what the simulated check reads.
        argv += ["--log-verbosity", "4"]
        limit = None
        if profile.simulated_vram_bytes is not None:
            limit = simulated.address_space_limit(
                profile.simulated_vram_bytes, load_fault=profile.fault_load_oom
            )
        # The key in the environment, not on the command line that `ps` shows.
        env = {"LLAMA_API_KEY": self._key, **worker_env(profile)}
        try:
            process = WorkerProcess.spawn(
                argv,
                self._log_file(),
                env=env,
                preexec=simulated.limit_in_child(limit) if limit is not None else None,
                log_requests=profile.log_requests,
            )
        except OSError as error:
            self._attempt = None
            await self._fail(Failure("bad_config", f"could not start the worker: {error}"), never_ready=True)
            return None
        attempt = _Attempt(generation=generation, process=process, port=port, started_at=self._clock())
        attempt.memory_limit = limit
        self._armed = None  # a fault armed for the previous process does not carry over
        with contextlib.suppress(psutil.Error):
            attempt.psutil_process = psutil.Process(process.pid)
            attempt.psutil_process.cpu_percent(interval=None)  # the first call only sets the baseline
        process.exited.add_done_callback(
            lambda future: (
                self._post(_Exited(generation, future.result())) if not future.cancelled() else None
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

    def _needs_gpu_proof(self) -> bool:
        profile = self._profile
        simulated_device = profile.simulated_vram_bytes is not None
        return offload.needs_gpu_proof(profile.role, simulated_device, profile.n_gpu_layers)

    def _refusal_before_start(self, engine_path: Path) -> str | None:
        """A GPU worker on a real device is not started with a build that lists no GPU (it would run on the
        CPU under the GPU's name). See tray_app.engine.offload."""
        if not self._needs_gpu_proof():
            return None
        try:
            return offload.refusal_before_start(list_devices(engine_path))
        except DeviceListError as error:
            return f"cannot tell whether this llama.cpp build has a GPU backend: {error}"

    def _check_load(self, attempt: _Attempt, buffers: BufferSizes) -> Failure | None:
        """On a real GPU: did the layers and weights land on a GPU device? On a simulated device: does what
        llama.cpp allocated fit the simulated VRAM? (tray_app.engine.offload, tray_app.engine.simulated)"""
        free = self._profile.simulated_vram_bytes
        if free is None:
            if not self._needs_gpu_proof():
                return None
            placement = attempt.placement or offload.Offload(None, None, ())
            reason = offload.failure_after_load(placement, self._profile.n_gpu_layers)
            if reason is None:
                return None
            attempt.process.log_line(f"--- {reason}")
            return Failure("bad_config", reason)
        n_layers = inspect_model(self._profile.model_path).n_layers  # read once per model file, then cached
        share = simulated.device_share(buffers, self._profile.n_gpu_layers, n_layers)
        lines = simulated.failure_lines(share, free)
        if lines is None:
            return None
        for line in lines:
            attempt.process.log_line(line)
        return Failure("oom_load", lines[-1])

    def _worker_health(
        self, attempt: _Attempt, answer: dict[str, Any], buffers: BufferSizes
    ) -> dict[str, Any]:
        """What status shows of a ready worker: its /health answer, the plan it runs and what it allocated."""
        profile = self._profile
        return {
            **answer,
            "role": profile.role,
            "pid": attempt.process.pid,
            "engine": self._engine.describe() if self._engine else "",
            "model_path": str(profile.model_path),
            "n_ctx": profile.n_ctx,
            "n_ctx_per_slot": profile.n_ctx // max(profile.n_parallel, 1),
            "n_parallel": profile.n_parallel,
            "n_gpu_layers": profile.n_gpu_layers,
            "n_threads": profile.n_threads,
            "simulated": profile.simulated_vram_bytes is not None,
            # What the worker runs on by llama.cpp's own load log: GPU devices, "simulated", or "CPU".
            "runs_on": self._runs_on(attempt),
            "offload": attempt.placement.to_dict() if attempt.placement else None,
            "simulated_vram_bytes": profile.simulated_vram_bytes,
            "memory_limit": {"limit_bytes": attempt.memory_limit} if attempt.memory_limit else None,
            "faults_enabled": profile.enable_faults,
            "buffers": buffers.to_dict(),
            "load_seconds": attempt.load_seconds,
        }

    def _runs_on(self, attempt: _Attempt) -> str:
        if self._profile.simulated_vram_bytes is not None:
            return "simulated"
        devices = attempt.placement.devices if attempt.placement else ()
        return ", ".join(devices) if devices else "CPU"

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
        self._bus.publish(WorkerUnhealthy(role=self.role, kind=failure.kind, reason=failure.message))
        try:
            await self._end_failed(attempt, failure, now, never_ready)
        finally:
            # Resolved last, so a caller of start() sees the state the failure led to (e.g. restarting).
            if attempt is not None and not attempt.outcome.done():
                attempt.outcome.set_result(False)

    async def _end_failed(
        self, attempt: _Attempt | None, failure: Failure, now: float, never_ready: bool
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
        if self._changed is not None:
            # Wake every waiter, then arm a fresh event for the next change.
            self._changed.set()
            self._changed = asyncio.Event()

    def _last_failure_kind(self) -> str:
        return str(self._last_failure["kind"]) if self._last_failure else "failure"


def record_calibration(profile: WorkerProfile, buffers: BufferSizes) -> None:
    """Keep what llama.cpp allocated for this profile: the planner's compute estimate is checked against it
    and replaced by it (tray_app.budget.calibration)."""
    if buffers.total_bytes == 0:
        log.warning("llama-server printed no buffer sizes: nothing to record for calibration")
        return
    if profile.n_gpu_layers == 0 and gpu_offload_build():
        return  # with a GPU build a CPU worker's compute buffer is not the one a VRAM plan needs
    try:
        calibration.record_measurement(profile.model_path, profile.compute_settings(), buffers)
    except OSError as error:
        log.warning("could not record the measured buffers: %s", error)


def gpu_offload_build() -> bool:
    """Whether the installed llama.cpp (the binding, built with the server) has a GPU backend."""
    import llama_cpp

    return bool(llama_cpp.llama_supports_gpu_offload())


def _chain(source: asyncio.Future[bool], target: asyncio.Future[Any]) -> None:
    def copy(done: asyncio.Future[bool]) -> None:
        if not target.done():
            target.set_result(done.result() if not done.cancelled() else False)

    source.add_done_callback(copy)


def _known_kind(kind: str) -> FailureKind:
    return cast(FailureKind, kind) if kind in FAILURE_KINDS else "exited"


def _process_gone(attempt: _Attempt) -> bool:
    if attempt.process.exited.done():
        return True
    try:
        return psutil.Process(attempt.process.pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
