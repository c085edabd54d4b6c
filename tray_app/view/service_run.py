"""The service's own restarts in the tray's words: "The service restarted after a crash at 14:02 (signal 11)".

Two sources tell of one: `/failsoft/status`'s `service.restarted_after_crash` (whoever restarted it: the tray,
systemd), and the tray's own child while it is down ("The service stopped (signal 9); restarting…") and once
it is back (for a service that does not report the field yet). Each crash is told once, keyed by the pid of
the run that came after it. No Qt here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tray_app.contract.status import CrashNote, ServiceStatus


@dataclass(frozen=True)
class Restart:
    """A crash to tell about: the line, and the pid of the service run that followed it."""

    pid: int
    line: str


def how_it_ended(signal: int | None, exit_code: int | None) -> str:
    """ "signal 11", "exit status 3", or "" when nothing is known."""
    if signal:
        return f"signal {signal}"
    if exit_code:
        return f"exit status {exit_code}"
    return ""


def returncode_words(returncode: int) -> str:
    """A Popen.returncode (-9: killed by signal 9) in the same words."""
    return how_it_ended(-returncode if returncode < 0 else None, returncode if returncode > 0 else None)


def clock(at: float) -> str:
    return time.strftime("%H:%M", time.localtime(at))


def restarted_line(at: float, ended: str) -> str:
    return f"The service restarted after a crash at {clock(at)}" + (f" ({ended})" if ended else "")


def crash_line(note: CrashNote) -> str:
    """ "The service restarted after a crash at 14:02 (signal 11)"."""
    return restarted_line(
        float(note.get("at") or time.time()), how_it_ended(note.get("signal"), note.get("exit_code"))
    )


def down_line(returncode: int, restart_in: float | None = None) -> str:
    """What the tray says while its service is down: "The service stopped (signal 9); restarting…"."""
    ended = returncode_words(returncode)
    words = f"The service stopped ({ended})" if ended else "The service stopped"
    if restart_in is None:
        return words
    return f"{words}; restarting…" if restart_in <= 5 else f"{words}; restarting in {restart_in:.0f} s…"


def restart_in_status(status: ServiceStatus | None) -> Restart | None:
    """The crash before this service run, as the service reports it (None without one, or from a service
    that does not report its runs)."""
    run = status.get("service") if status is not None else None
    if not isinstance(run, dict):
        return None
    note = run.get("restarted_after_crash")
    pid = run.get("pid")
    if not isinstance(note, dict) or not isinstance(pid, int):
        return None
    return Restart(pid, crash_line(note))


class RestartWatch:
    """The tray's one line about the service's restarts, and which crashes it has told of already."""

    def __init__(self) -> None:
        self.line = ""
        self._told: set[int] = set()
        self._down: tuple[float, int] | None = None  # when its own child ended, and how

    def child_down(self, returncode: int, restart_in: float | None, at: float) -> None:
        self._down = (at, returncode)
        self.line = down_line(returncode, restart_in)

    def child_up(self, pid: int, status: ServiceStatus | None = None) -> Restart | None:
        """The tray's child answers again (pid): the crash to tell, unless the service tells it itself."""
        if self._down is None:
            return None
        at, returncode = self._down
        self._down = None
        reported = restart_in_status(status)
        if reported is not None and reported.pid == pid:
            return self._tell(reported)
        return self._tell(Restart(pid, restarted_line(at, returncode_words(returncode))))

    def status(self, status: ServiceStatus | None) -> Restart | None:
        """A status came: a crash the service reports that was not told yet."""
        reported = restart_in_status(status)
        if reported is None:
            return None
        if reported.pid in self._told:
            if self._down is None:
                self.line = reported.line  # the service's own words (its crash time) win
            return None
        if self._down is not None:
            return None  # a status of the run that has just ended, or of the next one before it is up
        return self._tell(reported)

    def _tell(self, restart: Restart) -> Restart | None:
        self.line = restart.line
        if restart.pid in self._told:
            return None
        self._told.add(restart.pid)
        return restart
