"""One service per journal.

A service that starts takes the unfinished jobs its journal holds for its own and carries them through
(`Service.resume_unfinished`). A second service started on the same data directory, say `failsoft serve
--port 8751` beside the tray's, would take the first one's running jobs that way and run them a second time.
So the journal's owner holds an exclusive lock on a file beside it for as long as it runs, and a second
service is refused before it reads anything. The lock is the kernel's (`flock`): it ends with the process
however the process ends, so a crash leaves no stale lock behind.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

OWNER_SUFFIX = ".owner"


class JournalInUse(RuntimeError):
    """Another live process owns this journal."""


class JournalOwner:
    """The held lock; `release` (or the process's end) gives it up."""

    def __init__(self, descriptor: int) -> None:
        self._descriptor = descriptor

    @classmethod
    def claim(cls, journal: Path) -> JournalOwner:
        """Own `journal`, or raise JournalInUse naming the process that does."""
        path = journal.with_name(journal.name + OWNER_SUFFIX)
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if sys.platform == "win32":  # no flock there: the guard is for the platforms Failsoft supports
            return cls(descriptor)
        import fcntl

        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(descriptor)
            os.close(descriptor)
            raise JournalInUse(
                f"another Failsoft service{holder} uses the journal {journal}: a second service on it would "
                "take the first one's unfinished jobs for its own and run them again. Stop that service, "
                "or give this one its own data directory (FAILSOFT_DATA_DIR)."
            ) from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)  # for the message a second service gives
        return cls(descriptor)

    def release(self) -> None:
        if self._descriptor >= 0:
            os.close(self._descriptor)  # closing the file ends the lock
            self._descriptor = -1

    def __del__(self) -> None:  # a service that failed to start after its journal opened owns nothing
        self.release()


def _holder(descriptor: int) -> str:
    """ " (pid N)" from the owner's file, or "" when it has not written its pid yet."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int(os.pread(descriptor, 32, 0).split()[0])
        return f" (pid {pid})"
    return ""
