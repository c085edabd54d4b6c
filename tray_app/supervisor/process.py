"""One spawned worker process: its own process group, its output in a rotating log file and an in-memory tail.

The process is started in a new session (so it leads its own process group) and stopped by signalling the
whole group: anything it started dies with it. A watcher thread reaps it and reports the exit to the asyncio
loop only after the output pipe is drained, so the classification sees the worker's last words.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Sequence
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import IO

LOG_MAX_BYTES = 5 * 1024 * 1024
LOG_BACKUPS = 3
TAIL_LINES = 200
_DRAIN_TIMEOUT = 2.0  # seconds to wait for the pipe to close after the process ended


def worker_log_path(log_dir: Path, role: str) -> Path:
    return log_dir / f"{role}-worker.log"


class WorkerProcess:
    """A running (or ended) worker subprocess. Create it with `spawn` from inside a running asyncio loop."""

    def __init__(
        self, popen: subprocess.Popen[bytes], log_file: Path, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._popen = popen
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._tail_lock = threading.Lock()
        self._handler = RotatingFileHandler(log_file, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS)
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        # A private logger (not registered by name): one per process, closed when its output ends.
        self._logger = logging.Logger(f"failsoft.worker.{popen.pid}")
        self._logger.addHandler(self._handler)
        self._logger.propagate = False
        self.exited: asyncio.Future[int] = loop.create_future()
        self._loop = loop
        self._pump = threading.Thread(
            target=self._pump_output, name=f"worker-output-{popen.pid}", daemon=True
        )
        self._pump.start()
        threading.Thread(target=self._watch_exit, name=f"worker-exit-{popen.pid}", daemon=True).start()

    @classmethod
    def spawn(cls, argv: Sequence[str], log_file: Path) -> WorkerProcess:
        loop = asyncio.get_running_loop()
        log_file.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: stop signals the group, grandchildren included
        )
        process = cls(popen, log_file, loop)
        process._logger.info("--- worker started, pid %d: %s", popen.pid, " ".join(argv))
        return process

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    def tail(self) -> list[str]:
        with self._tail_lock:
            return list(self._tail)

    def signal_group(self, sig: int) -> None:
        """Send `sig` to the worker's process group (a no-op when the group is gone)."""
        try:
            os.killpg(self._popen.pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            # The group id was taken by something that is not ours: only the leader is ours to signal.
            if self._popen.poll() is None:
                self._popen.send_signal(sig)

    async def stop(self, grace: float) -> int:
        """SIGTERM to the group (and SIGCONT, so a stopped process can act on it); SIGKILL after `grace`."""
        if not self.exited.done():
            self.signal_group(signal.SIGTERM)
            self.signal_group(signal.SIGCONT)
            try:
                await asyncio.wait_for(asyncio.shield(self.exited), timeout=grace)
            except TimeoutError:
                self._logger.info("--- no exit %.1f s after SIGTERM: SIGKILL to the process group", grace)
        return await self.kill()

    async def kill(self) -> int:
        """SIGKILL the group at once and wait for the exit to be reported."""
        self.signal_group(signal.SIGKILL)
        return await asyncio.shield(self.exited)

    def _pump_output(self) -> None:
        stream: IO[bytes] | None = self._popen.stdout
        if stream is None:
            return
        try:
            for raw in stream:
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                with self._tail_lock:
                    self._tail.append(line)
                self._logger.info("%s", line)
        finally:
            stream.close()

    def _watch_exit(self) -> None:
        returncode = self._popen.wait()
        self._pump.join(_DRAIN_TIMEOUT)
        self._logger.info("--- worker %d ended with status %d", self._popen.pid, returncode)
        self._handler.close()
        # The loop is gone only when its owner stopped caring about this process (interpreter shutdown).
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._report_exit, returncode)

    def _report_exit(self, returncode: int) -> None:
        if not self.exited.done():
            self.exited.set_result(returncode)


def python_module_argv(module: str, args: Sequence[str]) -> list[str]:
    """`python -m module args...` with this interpreter (the same virtualenv as the service)."""
    return [sys.executable, "-m", module, *args]
