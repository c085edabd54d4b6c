"""The simulated GPU's memory as a small JSON file that separate processes take from and give back to.

A service run with a simulated GPU creates the ledger; a drill, a test or `failsoft hog` takes memory under
its own pid and a label, the way ComfyUI would take VRAM on a real card. Every change happens under an
exclusive `flock` on a lock file beside the ledger and lands with a rename, so a reader never sees half a
file and needs no lock. A holding whose process has died is dropped when read, as a real driver frees the
memory of a process that was killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tray_app import paths
from tray_app.contract.sizes import format_size

LEDGER_FILE = "simulated-gpu.json"
FORMAT = 1
# psutil derives a start time from boot time and clock ticks: the same figure on every read, up to rounding.
_START_TOLERANCE_S = 0.05


class NoSimulatedDevice(LookupError):
    """No simulated GPU is running: no ledger file, or the service that made it is gone."""


class LedgerBusy(RuntimeError):
    """Another running process already owns the ledger at this path: the message names it (pid and command)
    and says what to do, in one line."""

    def __init__(self, path: Path, owner_pid: int) -> None:
        self.path = path
        self.owner_pid = owner_pid
        super().__init__(
            f"the simulated GPU ({path}) is held by process {owner_pid} ({command_of(owner_pid)}); "
            "stop that process, or set FAILSOFT_RUNTIME_DIR to another folder to run a second one"
        )


@dataclass(frozen=True)
class Holding:
    pid: int
    label: str
    num_bytes: int
    since: float  # wall clock when it was taken
    started: float | None  # the holder's start time: tells a reused pid from the process that took it


@dataclass(frozen=True)
class LedgerState:
    name: str
    total_bytes: int
    owner_pid: int
    holdings: tuple[Holding, ...]

    @property
    def used_bytes(self) -> int:
        return sum(h.num_bytes for h in self.holdings)

    @property
    def free_bytes(self) -> int:
        return self.total_bytes - self.used_bytes

    def held_by(self, pid: int) -> dict[str, int]:
        return {h.label: h.num_bytes for h in self.holdings if h.pid == pid}


def default_ledger_path() -> Path:
    return paths.runtime_dir() / LEDGER_FILE


def process_start(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def command_of(pid: int, limit: int = 160) -> str:
    """`pid`'s command line as a person would type it (the program by its file name), cut to `limit`."""
    try:
        argv = psutil.Process(pid).cmdline()
    except psutil.Error:
        argv = []
    if not argv:
        return "command unknown"
    command = shlex.join([Path(argv[0]).name, *argv[1:]])
    return command if len(command) <= limit else command[: limit - 1] + "…"


def is_alive(pid: int, started: float | None) -> bool:
    """Whether `pid` is still the process that `started` then. A zombie counts as dead: its memory is
    freed at exit, before its parent reaps it."""
    if pid <= 0:
        return False  # 0 and negatives name no process psutil should be asked about
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(process.create_time() - started) <= _START_TOLERANCE_S
    except psutil.NoSuchProcess:  # ZombieProcess is one too
        return False
    except psutil.AccessDenied:
        return True  # another user's process, alive


def simulated_name(name: str) -> str:
    """A simulated device is never mistaken for a real one: its name says so."""
    return name if "simulated" in name.lower() else f"simulated {name}"


class Ledger:
    """One ledger file. Cheap to construct; every call reads or writes the file."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else default_ledger_path()
        self._lock_path = self.path.with_name(self.path.name + ".lock")

    def exists(self) -> bool:
        try:
            self.read()
        except NoSimulatedDevice:
            return False
        return True

    def create(
        self, total_bytes: int, name: str = "simulated GPU", *, owner_pid: int | None = None
    ) -> LedgerState:
        """Start the simulated device (or resize it, for its owner): live holdings are kept. LedgerBusy when
        another live process owns a ledger here."""
        if total_bytes <= 0:
            raise ValueError(f"a simulated GPU needs a positive size, got {total_bytes}")
        owner = os.getpid() if owner_pid is None else owner_pid
        with self._locked():
            raw = self._load_raw()
            holdings: tuple[Holding, ...] = ()
            if raw is not None:
                current_owner, current_started = _owner(raw)
                if current_owner != owner and is_alive(current_owner, current_started):
                    raise LedgerBusy(self.path, current_owner)
                if current_owner == owner:
                    holdings = self._live(raw)
            state = LedgerState(simulated_name(name), total_bytes, owner, holdings)
            self._write(state, process_start(owner))
            return state

    def remove(self, owner_pid: int | None = None) -> bool:
        """The simulated device goes away (its service stops); only its owner removes it."""
        owner = os.getpid() if owner_pid is None else owner_pid
        with self._locked():
            raw = self._load_raw()
            if raw is None or _owner(raw)[0] != owner:
                return False
            self.path.unlink(missing_ok=True)
            return True

    def read(self) -> LedgerState:
        """The device and its live holdings; NoSimulatedDevice when none runs."""
        return self._read()[0]

    def _read(self) -> tuple[LedgerState, float | None]:
        raw = self._load_raw()
        if raw is None:
            raise NoSimulatedDevice(f"no simulated GPU is running (no ledger at {self.path})")
        owner, started = _owner(raw)
        if not is_alive(owner, started):
            raise NoSimulatedDevice(f"no simulated GPU is running (the process {owner} that ran it is gone)")
        return LedgerState(str(raw["name"]), int(raw["total_bytes"]), owner, self._live(raw)), started

    def take(self, label: str, num_bytes: int, *, pid: int | None = None) -> LedgerState:
        """`label` of `pid` (default: this process) now holds `num_bytes`, replacing what it held.
        MemoryError when that is more than is free; NoSimulatedDevice when none runs."""
        if num_bytes < 0:
            raise ValueError(f"cannot take a negative size ({num_bytes})")
        holder = os.getpid() if pid is None else pid
        with self._locked():
            state, owner_started = self._read()
            kept = tuple(h for h in state.holdings if (h.pid, h.label) != (holder, label))
            others = sum(h.num_bytes for h in kept)
            if others + num_bytes > state.total_bytes:
                raise MemoryError(
                    f"{state.name}: cannot take {format_size(num_bytes)} for {label!r}, "
                    f"only {format_size(state.total_bytes - others)} free"
                )
            previous = next((h for h in state.holdings if (h.pid, h.label) == (holder, label)), None)
            holding = Holding(
                pid=holder,
                label=label,
                num_bytes=num_bytes,
                since=previous.since if previous else time.time(),
                started=previous.started if previous else process_start(holder),
            )
            new = LedgerState(state.name, state.total_bytes, state.owner_pid, (*kept, holding))
            self._write(new, owner_started)
            return new

    def release(self, label: str, *, pid: int | None = None) -> int:
        """Give back what `label` of `pid` (default: this process) held; its bytes, 0 if none."""
        holder = os.getpid() if pid is None else pid
        return self._drop(lambda h: (h.pid, h.label) == (holder, label))

    def release_all(self, pid: int) -> int:
        """Give back everything `pid` held (a worker that stopped)."""
        return self._drop(lambda h: h.pid == pid)

    def _drop(self, matches: Callable[[Holding], bool]) -> int:
        with self._locked():
            try:
                state, owner_started = self._read()
            except NoSimulatedDevice:
                return 0  # the device is gone, and what was held with it
            dropped = sum(h.num_bytes for h in state.holdings if matches(h))
            kept = tuple(h for h in state.holdings if not matches(h))
            self._write(LedgerState(state.name, state.total_bytes, state.owner_pid, kept), owner_started)
            return dropped

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # A separate lock file: the ledger itself is replaced by rename, so a lock on it would guard an
        # inode that the next writer has already swapped out.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the last descriptor releases the lock

    def _load_raw(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            raise NoSimulatedDevice(f"the ledger at {self.path} cannot be read: {error}") from error
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise NoSimulatedDevice(f"the ledger at {self.path} is not a Failsoft ledger of format {FORMAT}")
        return data

    def _live(self, raw: dict[str, Any]) -> tuple[Holding, ...]:
        holdings = (
            Holding(
                pid=int(h["pid"]),
                label=str(h["label"]),
                num_bytes=int(h["bytes"]),
                since=float(h["since"]),
                started=None if h.get("started") is None else float(h["started"]),
            )
            for h in raw.get("holdings", [])
        )
        return tuple(h for h in holdings if is_alive(h.pid, h.started))

    def _write(self, state: LedgerState, owner_started: float | None) -> None:
        data = {
            "format": FORMAT,
            "simulated": True,
            "name": state.name,
            "total_bytes": state.total_bytes,
            "owner": {"pid": state.owner_pid, "started": owner_started},
            "holdings": [
                {"pid": h.pid, "label": h.label, "bytes": h.num_bytes, "since": h.since, "started": h.started}
                for h in state.holdings
            ],
        }
        fd, temp = tempfile.mkstemp(prefix=".ledger-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(data, out)
            os.replace(temp, self.path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise


def _owner(raw: dict[str, Any]) -> tuple[int, float | None]:
    owner = raw.get("owner") or {}
    started = owner.get("started")
    return int(owner.get("pid", 0)), None if started is None else float(started)
