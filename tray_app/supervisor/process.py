"""One spawned worker process: its own process group, its output in a rotating log file and an in-memory tail.

The process is started in a new session (so it leads its own process group) and stopped by signalling the
whole group: anything it started dies with it. A watcher thread reaps it and reports the exit to the asyncio
loop only after the output pipe is drained, so the classification sees the worker's last words.

The output is copied in blocks, not line by line: llama-server prints about 30 lines per request, and
handling each in Python (in the service's process, beside the router) cost the router about 2 ms of CPU per
request. Only the load log, up to "model loaded", is split into lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import psutil

LOG_MAX_BYTES = 5 * 1024 * 1024
LOG_BACKUPS = 3
TAIL_LINES = 200
TAIL_BYTES = 64 * 1024  # the last output kept in memory, for messages (about TAIL_LINES lines)
READ_BYTES = 64 * 1024
LOAD_LINES = 4000  # the load log is kept whole (llama.cpp prints its buffer sizes there), up to this many
LOADED_MARKER = "model loaded"  # llama-server's line once loading ended; later lines may quote requests
_DRAIN_TIMEOUT = 2.0  # seconds to wait for the pipe to close after the process ended
# After loading, the pump reads at most this often. llama-server prints about 30 lines per request, a write
# each; read one by one, each would wake this process on a machine busy with that very request. The worker's
# exit cuts the wait short, so its last words are still read at once.
OUTPUT_BATCH_SECONDS = 0.02


def worker_log_path(log_dir: Path, role: str) -> Path:
    return log_dir / f"{role}-worker.log"


class RotatingLog:
    """Bytes appended to a file that rotates by size (`name.1` ... `name.N`). Thread-safe: the output pump
    and the supervisor's own lines share it."""

    def __init__(self, path: Path, max_bytes: int = LOG_MAX_BYTES, backups: int = LOG_BACKUPS) -> None:
        self._path = path
        self._max_bytes = max_bytes
        self._backups = backups
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = path.open("ab")
        self._size = path.stat().st_size

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._file is None:
                return
            if self._size and self._size + len(data) > self._max_bytes:
                self._rotate()
            assert self._file is not None
            self._file.write(data)
            self._file.flush()
            self._size += len(data)

    def line(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self.write(f"--- {stamp} {text}\n".encode("utf-8", errors="replace"))

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _rotate(self) -> None:
        assert self._file is not None
        self._file.close()
        for number in range(self._backups - 1, 0, -1):
            older = self._path.with_name(f"{self._path.name}.{number}")
            if older.exists():
                older.replace(self._path.with_name(f"{self._path.name}.{number + 1}"))
        if self._backups:
            self._path.replace(self._path.with_name(f"{self._path.name}.1"))
        else:
            self._path.unlink(missing_ok=True)
        self._file = self._path.open("ab")
        self._size = 0


class WorkerProcess:
    """A running (or ended) worker subprocess. Create it with `spawn` from inside a running asyncio loop."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        log_file: Path,
        loop: asyncio.AbstractEventLoop,
        log_requests: bool = True,
    ) -> None:
        self._popen = popen
        self._log_requests = log_requests
        # The last output, at least TAIL_BYTES of it when there is that much: whole reads, the oldest
        # dropped once the rest still holds TAIL_BYTES. Work per read in proportion to the read, as this
        # thread holds the interpreter lock while it works (copying the whole tail each time cost it 64 KiB).
        self._recent: deque[bytes] = deque()
        self._recent_bytes = 0
        self._load_lines: list[str] = []
        self._loaded = False
        self._tail_lock = threading.Lock()
        self._ended = threading.Event()  # the process exited: the pump reads on without waiting
        self._log = RotatingLog(log_file)
        self.exited: asyncio.Future[int] = loop.create_future()
        self._loop = loop
        self._pump = threading.Thread(
            target=self._pump_output, name=f"worker-output-{popen.pid}", daemon=True
        )
        self._pump.start()
        threading.Thread(target=self._watch_exit, name=f"worker-exit-{popen.pid}", daemon=True).start()

    @classmethod
    def spawn(
        cls,
        argv: Sequence[str],
        log_file: Path,
        *,
        env: dict[str, str] | None = None,
        preexec: Callable[[], None] | None = None,
        log_requests: bool = True,
    ) -> WorkerProcess:
        """Start `argv`; `env` is added to this process's environment, `preexec` runs in the child. Without
        `log_requests`, the log file keeps the whole load log and after it only warnings and errors."""
        loop = asyncio.get_running_loop()
        log_file.parent.mkdir(parents=True, exist_ok=True)

        def in_child() -> None:
            die_with_parent()
            if preexec is not None:
                preexec()

        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # its own process group: stop signals the group, grandchildren included
            preexec_fn=in_child,
        )
        process = cls(popen, log_file, loop, log_requests)
        process.log_line(f"worker started, pid {popen.pid}: {' '.join(argv)}")
        return process

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    def tail(self) -> list[str]:
        """The last lines the worker printed (at most TAIL_LINES)."""
        with self._tail_lock:
            recent = b"".join(self._recent)[-TAIL_BYTES:]
        lines = recent.decode("utf-8", errors="replace").splitlines()
        return lines[-TAIL_LINES:]

    def load_log(self) -> list[str]:
        """What the worker printed while loading (up to llama-server's "model loaded"), nothing after it."""
        with self._tail_lock:
            return list(self._load_lines)

    def dead(self) -> bool:
        """Exited, or a zombie not reaped yet (the kernel closed its sockets before the watcher saw it)."""
        if self.exited.done():
            return True
        try:
            return psutil.Process(self.pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    @property
    def loaded(self) -> bool:
        with self._tail_lock:
            return self._loaded

    def log_line(self, text: str) -> None:
        """A line of the supervisor's own in the worker's log file (not in the tail it is classified by)."""
        self._log.line(text)

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
                self.log_line(f"no exit {grace:.1f} s after SIGTERM: SIGKILL to the process group")
        return await self.kill()

    async def kill(self) -> int:
        """SIGKILL the group at once and wait for the exit to be reported."""
        self.signal_group(signal.SIGKILL)
        return await asyncio.shield(self.exited)

    def _pump_output(self) -> None:
        stream: IO[bytes] | None = self._popen.stdout
        if stream is None:
            return
        pending = b""  # a load-log line not ended yet
        try:
            fd = stream.fileno()
            while chunk := os.read(fd, READ_BYTES):
                with self._tail_lock:
                    self._keep_recent(chunk)
                    loaded = self._loaded
                if not loaded:
                    self._log.write(chunk)
                    *lines, pending = (pending + chunk).split(b"\n")
                    self._take_load_lines(lines)
                    continue
                if self._log_requests:
                    self._log.write(chunk)
                elif kept := notable_lines(chunk):
                    self._log.write(kept)
                self._ended.wait(OUTPUT_BATCH_SECONDS)  # let the lines of a request gather

            if pending:
                self._take_load_lines([pending])  # the last words, without a line end
        finally:
            stream.close()

    def _keep_recent(self, chunk: bytes) -> None:
        self._recent.append(chunk)
        self._recent_bytes += len(chunk)
        while self._recent_bytes - len(self._recent[0]) >= TAIL_BYTES:
            self._recent_bytes -= len(self._recent.popleft())

    def _take_load_lines(self, lines: list[bytes]) -> None:
        with self._tail_lock:
            for raw in lines:
                if self._loaded or len(self._load_lines) >= LOAD_LINES:
                    return
                line = raw.decode("utf-8", errors="replace").rstrip("\r")
                self._load_lines.append(line)
                self._loaded = LOADED_MARKER in line

    def _watch_exit(self) -> None:
        returncode = self._popen.wait()
        self._ended.set()
        self._pump.join(_DRAIN_TIMEOUT)
        self.log_line(f"worker {self._popen.pid} ended with status {returncode}")
        self._log.close()
        # The loop is gone only when its owner stopped caring about this process (interpreter shutdown).
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._report_exit, returncode)

    def _report_exit(self, returncode: int) -> None:
        if not self.exited.done():
            self.exited.set_result(returncode)


# llama.cpp's log prefix (elapsed time, then the level letter): the levels kept when requests are not logged.
_NOTABLE = re.compile(rb"^\d+\.\d+\.\d+\.\d+ [WE] |^[^\s\d]", re.MULTILINE)


def notable_lines(chunk: bytes) -> bytes:
    """The warnings and errors of a block of llama.cpp's output, and lines it printed without its prefix
    (an abort's message); not the per-request lines (about 30 of them for each request)."""
    if _NOTABLE.search(chunk) is None:
        return b""  # the usual block: request lines only, looked through once in C
    return b"".join(line for line in chunk.splitlines(keepends=True) if _NOTABLE.match(line))


def die_with_parent() -> None:
    """In the child: SIGKILL when the process that started it dies (Linux), so no worker outlives a crashed
    service."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_PR_SET_PDEATHSIG = 1
