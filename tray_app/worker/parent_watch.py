"""A worker must never outlive the service that started it.

Two guards, because each alone has a gap:
- Linux's parent-death signal (prctl PR_SET_PDEATHSIG): the kernel sends SIGKILL the moment the parent goes,
  even when the parent itself was SIGKILLed and could run no clean-up. It fires when the *thread* that spawned
  the worker ends, so the supervisor spawns from its event-loop thread, which lives as long as the service.
- A watcher thread that polls the parent pid: covers other platforms and the window before prctl ran.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import threading

_PR_SET_PDEATHSIG = 1
_POLL_SECONDS = 0.5

log = logging.getLogger(__name__)


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` when the parent dies; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        return False
    return True


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _parent_alive(parent_pid: int, direct: bool) -> bool:
    # A direct child is re-parented (to init or a subreaper) once its parent is gone: getppid changes, and
    # unlike a pid check this cannot be fooled by pid reuse.
    return os.getppid() == parent_pid if direct else _pid_exists(parent_pid)


def _watch(parent_pid: int, direct: bool) -> None:
    stop = threading.Event()
    while not stop.wait(_POLL_SECONDS):
        if not _parent_alive(parent_pid, direct):
            # No clean-up can be trusted here (the parent may have died mid-request): leave at once.
            os._exit(0)


def guard_parent(parent_pid: int | None) -> None:
    """Install both guards for `parent_pid` (the supervisor's pid); exits now if it is already gone."""
    if parent_pid is None:
        return
    direct = os.getppid() == parent_pid
    if direct:
        # The death signal follows the direct parent only; through a wrapper the pid watch does the job.
        set_parent_death_signal()
    if not _parent_alive(parent_pid, direct):
        os._exit(0)
    threading.Thread(target=_watch, args=(parent_pid, direct), name="parent-watch", daemon=True).start()
