"""The service's side of the tokenizer helper: starts it, sends it requests, and starts it again when it
dies. The one owner of the helper process and its connection.

A request the helper was reading when it died is sent once more to the new helper; if that one dies on it
too, the request fails with `TokenizerFailed` (the caller answers it with a clear error) and the next
request finds a fresh helper. Quick deaths in a row back off, so a helper that cannot start (a broken
binding) does not spin.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tray_app.tokenizer import wire
from tray_app.tokenizer.wire import TokenizerFailed

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 120.0  # a 4 MiB prompt is counted in seconds even on a busy 2-core machine
QUICK_DEATH_S = 10.0  # a helper that dies this soon after its start counts towards the backoff
MAX_BACKOFF_S = 10.0
# Every GPU hidden: the helper reads vocabularies and grammars, and a CUDA build of the binding would
# otherwise initialise the driver (and a context) for nothing.
HIDDEN_GPUS = {
    "CUDA_VISIBLE_DEVICES": "",
    "HIP_VISIBLE_DEVICES": "",
    "ROCR_VISIBLE_DEVICES": "",
    "GGML_VK_VISIBLE_DEVICES": "",
}


class _Died(Exception):
    def __init__(self, returncode: int | None) -> None:
        super().__init__(describe_exit(returncode))
        self.returncode = returncode


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "it stopped answering"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "a signal"
        return f"it was killed by {name} (signal {-returncode})"
    return f"it exited with status {returncode}"


@dataclass
class _Run:
    """One helper process and its connection."""

    process: subprocess.Popen[bytes]
    started_at: float
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    listener: asyncio.Task[None] | None = None
    ended: _Died | None = None


class TokenizerProcess:
    def __init__(
        self,
        log_file: Path,
        *,
        preload: Sequence[tuple[Path, str]] = (),
        faults: bool = False,
        python: str = sys.executable,
    ) -> None:
        self.log_file = log_file
        self._preload = list(preload)
        self._faults = faults
        self._python = python
        self._run: _Run | None = None
        self._own_end: socket.socket | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._lock: asyncio.Lock | None = None
        self._quick_deaths = 0
        self._not_before = 0.0
        self.restarts = 0
        self._restart: asyncio.Task[None] | None = None
        self.last_exit: dict[str, Any] | None = None
        self._closed = False

    # ------------------------------------------------------------------------------------ the process
    def start(self) -> None:
        """Start the helper now (it loads the preloaded models while the service goes on starting)."""
        if self._run is None or self._run.ended is not None:
            self._spawn()

    def _spawn(self) -> None:
        if self._own_end is not None and (self._run is None or self._run.writer is None):
            self._own_end.close()  # a helper that died before its first request: its socket was never taken
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = [self._python, "-m", "tray_app.tokenizer.helper", "--fd", str(theirs.fileno())]
        for path, chat_format in self._preload:
            argv += ["--preload", f"{path}::{chat_format}"]
        env = {**os.environ, **HIDDEN_GPUS, "PYTHONFAULTHANDLER": "1"}
        env["FAILSOFT_TOKENIZER_FAULTS"] = "1" if self._faults else ""
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with theirs, open(self.log_file, "ab") as log_out:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_out,
                stderr=log_out,
                pass_fds=(theirs.fileno(),),
                env=env,
                close_fds=True,
            )
        self._own_end = ours
        self._run = _Run(process, time.monotonic())
        log.info("tokenizer helper started (pid %d)", process.pid)

    @property
    def pid(self) -> int | None:
        run = self._run
        return run.process.pid if run is not None and run.ended is None else None

    def status(self) -> dict[str, Any]:
        return {"pid": self.pid, "restarts": self.restarts, "last_exit": self.last_exit}

    async def _live(self) -> _Run:
        """The running helper with its connection made, started again if it died (after its backoff)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._closed:
                raise TokenizerFailed("the service is stopping", "crashed")
            while (run := self._run) is None or run.ended is not None:
                wait = self._not_before - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)  # the restart `_ended` scheduled may come first
                    continue
                if run is not None:
                    self.restarts += 1
                self._spawn()
            if run.writer is None:
                assert self._own_end is not None
                run.reader, run.writer = await asyncio.open_unix_connection(sock=self._own_end)
                run.listener = asyncio.create_task(self._listen(run), name="tokenizer-answers")
            return run

    async def _listen(self, run: _Run) -> None:
        assert run.reader is not None
        try:
            while True:
                header = await run.reader.readexactly(wire.HEADER.size)
                message = wire.decode(await run.reader.readexactly(wire.frame_length(header)))
                future = self._pending.pop(int(message.get("id") or 0), None)
                if future is not None and not future.done():
                    future.set_result(message)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError, wire.WireError):
            pass
        await self._ended(run)

    async def _ended(self, run: _Run, *, kill: bool = False) -> None:
        """The helper is gone (or `kill`: made to go): every request it held is told, once."""
        if run.ended is not None:
            return
        if kill:
            with contextlib.suppress(ProcessLookupError):
                run.process.kill()
        try:
            returncode = await asyncio.to_thread(run.process.wait, 5)
        except subprocess.TimeoutExpired:
            run.process.kill()
            returncode = None
        died = run.ended = _Died(returncode)
        if run.writer is not None:
            run.writer.close()
        lived = time.monotonic() - run.started_at
        self._quick_deaths = self._quick_deaths + 1 if lived < QUICK_DEATH_S else 0
        self._not_before = time.monotonic() + (
            min(0.25 * 2 ** (self._quick_deaths - 1), MAX_BACKOFF_S) if self._quick_deaths else 0.0
        )
        if not self._closed:
            signum = -returncode if returncode is not None and returncode < 0 else None
            self.last_exit = {"at": time.time(), "returncode": returncode, "signal": signum}
            log.warning("tokenizer helper (pid %d) ended: %s", run.process.pid, died)
        if not self._closed:  # started again now, not at the next request: it loads its models first
            self._restart = asyncio.get_running_loop().create_task(self._restart_if_gone(run))
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(died)

    async def _restart_if_gone(self, gone: _Run) -> None:
        """A successor for `gone`, connected so that its own end is noticed too (after the backoff)."""
        await asyncio.sleep(max(0.0, self._not_before - time.monotonic()))
        if self._closed or self._run is not gone:  # stopping, or a request started one already
            return
        with contextlib.suppress(TokenizerFailed, OSError):
            await self._live()

    # ------------------------------------------------------------------------------------ requests
    async def request(
        self, model: tuple[str, str], op: str, args: dict[str, Any], *, timeout: float = REQUEST_TIMEOUT_S
    ) -> Any:
        """The helper's answer to `op` on `model` (its file and chat format); TokenizerFailed if none."""
        died: _Died | None = None
        for _ in range(2):  # the request a helper died on is sent once more, to its successor
            run = await self._live()
            ident = next(self._ids)
            future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            self._pending[ident] = future
            assert run.writer is not None
            run.writer.write(wire.encode({"id": ident, "model": list(model), "op": op, "args": args}))
            try:
                answer = await asyncio.wait_for(future, timeout)
            except _Died as error:
                died = error
                continue
            except TimeoutError:
                self._pending.pop(ident, None)
                await self._ended(run, kill=True)  # wedged: its other requests get their second try
                raise TokenizerFailed(
                    f"the tokenizer did not answer within {timeout:.0f} s; it was restarted", "timeout"
                ) from None
            finally:
                self._pending.pop(ident, None)
            if "error" in answer:
                raise TokenizerFailed(str(answer["error"]), str(answer.get("kind") or "internal"))
            return answer.get("ok")
        raise TokenizerFailed(
            f"the tokenizer stopped while reading this request, twice ({died}); it was restarted",
            "crashed",
        )

    async def aclose(self) -> None:
        self._closed = True
        if self._restart is not None:
            self._restart.cancel()
        run = self._run
        if run is None:
            return
        if run.writer is not None:
            run.writer.close()  # the helper reads the end of its input and exits
        if run.listener is not None:
            run.listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run.listener
        self.close()

    def close(self) -> None:
        """Stop the helper (from any thread; the service's shutdown)."""
        self._closed = True
        run = self._run
        if run is None:
            return
        if self._own_end is not None:
            with contextlib.suppress(OSError):
                self._own_end.shutdown(socket.SHUT_RDWR)
        try:
            run.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            run.process.kill()
            run.process.wait(timeout=5)
