"""`failsoft serve` as the tray's child process: started in a process group of its own, watched, started again
after a crash with a pause that grows while it keeps crashing, and stopped with SIGTERM, then SIGKILL.

A crash of the service's native code (llama.cpp in a tokenizer, a template, a grammar) then ends that process
only: the tray stays, says so, and starts the service again, telling it how the run before ended
(FAILSOFT_PREVIOUS_EXIT, FAILSOFT_RESTARTED_BY: read by host/crash_record.py). No Qt here: the tray adapts the
changes to Qt signals (ui/service_child_qt.py).

One thread owns the process (spawn, readiness, exit, the pause before a restart); `stop()` only asks it to
end and signals the group. The changes reach the caller through `on_change`, on that thread.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

from tray_app.host.crash_record import PREVIOUS_EXIT_ENV, RESTARTED_BY_ENV

log = logging.getLogger(__name__)

RESTARTED_BY = "tray"  # told to the next run in RESTARTED_BY_ENV, with the last run's returncode

STOP_GRACE_S = 10.0  # after SIGTERM: the service drains its requests and stops its workers
READY_POLL_S = 0.1
LOG_ROTATE_BYTES = 10 * 1024 * 1024
LOG_NAME = "service.log"
TAIL_BYTES = 4096


class Start(enum.Enum):
    OK = "ok"
    ALREADY_RUNNING = "already running"
    FAILED = "failed"  # the process could not be spawned at all (the reason is logged)


class Stop(enum.Enum):
    OK = "ok"  # it ended after SIGTERM
    KILLED = "killed"  # it needed SIGKILL
    NOT_RUNNING = "not running"


class Change(enum.Enum):
    STARTED = "started"  # a process was spawned (pid)
    READY = "ready"  # it answers at its address
    CRASHED = "crashed"  # it ended unasked (returncode); it starts again after `restart_in` seconds
    FAILED = (
        "failed"  # it ended with a status before it ever answered (`message`: its last words); not restarted
    )
    ENDED = "ended"  # it ended unasked with status 0 (someone stopped it cleanly); not restarted
    STOPPED = "stopped"  # it ended because stop() asked


@dataclass(frozen=True)
class ChildChange:
    change: Change
    pid: int
    returncode: int | None = None
    restart_in: float | None = None
    message: str = ""
    at: float = field(default_factory=time.time)


@dataclass
class Backoff:
    """The pause before a restart: `first`, doubled after each crash up to `cap`; a run that lasted
    `stable_after` seconds starts the count again."""

    first: float = 1.0
    cap: float = 30.0
    stable_after: float = 60.0
    _next: float = 0.0

    def after_exit(self, ran_for: float) -> float:
        if self._next <= 0 or ran_for >= self.stable_after:
            self._next = self.first
        delay = self._next
        self._next = min(self._next * 2, self.cap)
        return delay


def exit_words(returncode: int) -> str:
    """ "signal 11 (SIGSEGV)" or "exit status 2"."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
        return f"signal {-returncode} ({name})"
    return f"exit status {returncode}"


def health_answers(base_url: str) -> Callable[[], bool]:
    """A readiness check: anything answers `GET /health` at `base_url` (200, or 503 while workers load)."""

    def answers() -> bool:
        try:
            with httpx.Client(trust_env=False, timeout=httpx.Timeout(2.0, connect=1.0)) as client:
                client.get(f"{base_url}/health")
        except httpx.HTTPError:
            return False
        return True

    return answers


def serve_argv(
    python: str,
    *,
    config: Path | None = None,
    model: Path | None = None,
    simulate_vram: str | None = None,
    host: str | None = None,
    port: int | None = None,
    enable_faults: bool = False,
) -> list[str]:
    """`python -m tray_app [--config FILE] serve ...`: what the tray was started with that the service needs.
    Host and port pin the address the tray watches, whatever the config file says by the next restart."""
    argv = [python, "-m", "tray_app"]
    if config is not None:
        argv += ["--config", str(config)]
    argv.append("serve")
    if model is not None:
        argv += ["--model", str(model)]
    if simulate_vram:
        argv += ["--simulate-vram", simulate_vram]
    if host:
        argv += ["--host", host]
    if port is not None:
        argv += ["--port", str(port)]
    if enable_faults:
        argv.append("--enable-faults")
    return argv


class ServiceChild:
    """`argv` as a child process, started again after a crash until `stop()`.

    `ready` tells when the child answers at its address (polled while it lives); its output goes to
    `log_path` (appended to, rotated once it is large); `on_change` hears every change, on the watcher thread.
    """

    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        ready: Callable[[], bool],
        on_change: Callable[[ChildChange], None] = lambda _change: None,
        *,
        env: Mapping[str, str] | None = None,
        backoff: Backoff | None = None,
        stop_grace: float = STOP_GRACE_S,
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self._ready = ready
        self.on_change = on_change  # set before start(); called on the watcher thread
        self._env = dict(os.environ if env is None else env)
        self._backoff = backoff or Backoff()
        self._stop_grace = stop_grace
        self._lock = threading.Lock()  # guards _popen and _stopping: no spawn once stop() began
        self._stopping = threading.Event()
        self._popen: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._run_offset = 0  # where this run's output begins in the log file
        self.ever_ready = False
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        """The running child's pid (None between runs)."""
        with self._lock:
            popen = self._popen
        return popen.pid if popen is not None and popen.poll() is None else None

    def start(self) -> Start:
        """Spawn the child and watch it; READY or FAILED follows through `on_change`."""
        if self._thread is not None and self._thread.is_alive():
            return Start.ALREADY_RUNNING
        self._stopping.clear()
        try:
            popen = self._spawn(previous_exit=None)
        except OSError as error:
            log.error("could not start the service (%s): %s", " ".join(self.argv), error)
            return Start.FAILED
        if popen is None:
            return Start.FAILED
        self._thread = threading.Thread(target=self._watch, args=(popen,), name="failsoft-service-child")
        self._thread.daemon = True
        self._thread.start()
        return Start.OK

    def stop(self, grace: float | None = None) -> Stop:
        """SIGTERM to the child's group; SIGKILL after `grace` seconds (default: the constructor's)."""
        grace = self._stop_grace if grace is None else grace
        with self._lock:
            self._stopping.set()
            popen = self._popen
        result = Stop.NOT_RUNNING
        running = popen is not None and popen.poll() is None
        if popen is not None and running:
            _signal_group(popen, signal.SIGTERM)
            _signal_group(popen, signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
            try:
                popen.wait(timeout=grace)
                result = Stop.OK
            except subprocess.TimeoutExpired:
                log.warning("the service did not end %.0f s after SIGTERM: SIGKILL", grace)
                result = Stop.KILLED
        if popen is not None and running:
            _signal_group(popen, signal.SIGKILL)  # whatever it started that is still in its group
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=grace)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(grace)
        return result

    # the watcher thread
    def _watch(self, popen: subprocess.Popen[bytes]) -> None:
        while True:
            started = time.monotonic()
            offset = self._run_offset
            self._report(ChildChange(Change.STARTED, popen.pid))
            answered = self._wait_ready(popen)
            if answered:
                self.ever_ready = True
                self._report(ChildChange(Change.READY, popen.pid))
            returncode = popen.wait()
            _signal_group(popen, signal.SIGKILL)  # a crashed leader leaves nothing of its group behind
            if self._stopping.is_set():
                self._report(ChildChange(Change.STOPPED, popen.pid, returncode))
                return
            self._log_line(f"failsoft serve (pid {popen.pid}) ended unasked: {exit_words(returncode)}")
            if returncode == 0 or (not self.ever_ready and returncode > 0):
                # It said why and ended (a config error, a port taken, stopped cleanly): starting it again
                # would say the same.
                change = Change.ENDED if answered or self.ever_ready else Change.FAILED
                message = "" if change is Change.ENDED else self._last_words(offset)
                self._report(ChildChange(change, popen.pid, returncode, message=message))
                return
            delay = self._backoff.after_exit(time.monotonic() - started)
            self._report(ChildChange(Change.CRASHED, popen.pid, returncode, restart_in=delay))
            if self._stopping.wait(delay):
                return
            try:
                spawned = self._spawn(previous_exit=returncode)
            except OSError as error:
                self._log_line(f"could not start the service again: {error}")
                self._report(ChildChange(Change.FAILED, popen.pid, returncode, message=str(error)))
                return
            if spawned is None:  # stop() came first
                return
            popen = spawned
            self.restarts += 1

    def _wait_ready(self, popen: subprocess.Popen[bytes]) -> bool:
        """Poll `ready` while the child lives (and nobody asked it to stop): whether it answered."""
        while popen.poll() is None and not self._stopping.is_set():
            if self._ready() and popen.poll() is None:
                return True
            self._stopping.wait(READY_POLL_S)
        return False

    def _spawn(self, previous_exit: int | None) -> subprocess.Popen[bytes] | None:
        env = {k: v for k, v in self._env.items() if k not in (PREVIOUS_EXIT_ENV, RESTARTED_BY_ENV)}
        env["PYTHONUNBUFFERED"] = "1"  # its log file shows its last words before a crash
        if previous_exit is not None:
            env[PREVIOUS_EXIT_ENV] = str(previous_exit)
            env[RESTARTED_BY_ENV] = RESTARTED_BY
        output = self._open_log()
        with output, self._lock:
            if self._stopping.is_set():
                return None
            after = f" after {exit_words(previous_exit)}" if previous_exit is not None else ""
            self._write(output, f"starting{after}: {' '.join(self.argv)}")
            self._run_offset = output.tell()
            self._popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: a stop reaches its grandchildren too
            )
            self._write(output, f"started pid {self._popen.pid}")
            return self._popen

    # the log file
    @property
    def _log_offset(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def _open_log(self) -> IO[bytes]:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            if self.log_path.stat().st_size > LOG_ROTATE_BYTES:
                self.log_path.replace(self.log_path.with_name(self.log_path.name + ".1"))
        return self.log_path.open("ab")

    @staticmethod
    def _write(output: IO[bytes], text: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        output.write(f"{stamp} tray: {text}\n".encode())
        output.flush()

    def _log_line(self, text: str) -> None:
        with contextlib.suppress(OSError), self.log_path.open("ab") as output:
            self._write(output, text)

    def _last_words(self, offset: int) -> str:
        """The last line the child printed (from `offset` of the log on), without a `failsoft:` prefix."""
        try:
            with self.log_path.open("rb") as log_file:
                log_file.seek(max(offset, self._log_offset - TAIL_BYTES))
                text = log_file.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip() and " tray: " not in line]
        if not lines:
            return ""
        last = lines[-1]
        for prefix in ("failsoft serve: ", "failsoft: "):
            last = last.removeprefix(prefix)
        return last

    def _report(self, change: ChildChange) -> None:
        try:
            self.on_change(change)
        except Exception:  # a listener's fault must not end the watch over the child
            log.exception("a listener failed on %s", change)


def _signal_group(popen: subprocess.Popen[bytes], sig: int) -> None:
    """`sig` to the child's process group (it leads its own); a no-op when the group is gone."""
    try:
        os.killpg(popen.pid, sig)
    except ProcessLookupError:
        return
    except PermissionError:
        # The group id is someone else's by now: only the leader, if still ours, is signalled.
        if popen.poll() is None:
            popen.send_signal(sig)


def default_log_path(log_dir: Path) -> Path:
    return log_dir / LOG_NAME
