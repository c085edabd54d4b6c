"""One tray per service address and user.

Starting Failsoft again from the desktop while its tray runs must not put a second icon in the panel, nor
try to start a second service: the second start asks the running tray to open its chat window and exits.
The first tray holds a lock file (QLockFile: a crashed tray's lock is taken over, found by its dead pid)
and listens on a local socket for such requests.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

from PySide6.QtCore import QLockFile, QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

from tray_app.paths import private_dir

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_MS = 2000
SOCKET_PATH_MAX = 100  # AF_UNIX paths are cut at 104 to 108 bytes


def instance_dir() -> Path:
    """The user's own runtime folder (XDG_RUNTIME_DIR), else a private folder in the temp dir."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and Path(runtime).is_dir():
        return Path(runtime)
    return private_dir(Path(tempfile.gettempdir()) / f"failsoft-{os.getuid()}")


class TrayInstance(QObject):
    """`claim()` once at start: True for the first tray for `base_url`, which then emits `activated`
    whenever another start asks it to show itself; False for a second one, which calls `activate_running()`
    and exits."""

    activated = Signal()

    def __init__(self, base_url: str, folder: Path | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        folder = folder or instance_dir()
        name = "failsoft-tray-" + hashlib.sha256(base_url.encode()).hexdigest()[:16]
        self.lock = QLockFile(str(folder / f"{name}.lock"))
        self.lock.setStaleLockTime(0)  # a tray runs for days: only a dead owner makes its lock stale
        self.socket_name = str(folder / name)
        if len(self.socket_name) > SOCKET_PATH_MAX:
            self.socket_name = f"{name}-{os.getuid()}"  # Qt puts a bare name in the temp dir
        self._server: QLocalServer | None = None

    def claim(self) -> bool:
        if folder_owner_differs(Path(self.lock.fileName()).parent):
            log.warning("the tray lock's folder belongs to another user: no single-instance check")
            return True
        if not self.lock.tryLock(0):
            return False
        QLocalServer.removeServer(self.socket_name)  # left by a tray that crashed
        server = QLocalServer(self)
        server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        if not server.listen(self.socket_name):
            log.warning("a second start cannot reach this tray: %s", server.errorString())
            return True
        server.newConnection.connect(self._asked)
        self._server = server
        return True

    def activate_running(self) -> bool:
        """Ask the tray that holds the lock to open its chat window; False if it did not answer."""
        socket = QLocalSocket()
        socket.connectToServer(self.socket_name)
        if not socket.waitForConnected(CONNECT_TIMEOUT_MS):
            return False
        # The connection itself is the request (the running tray accepts it, shows the window, hangs up).
        socket.disconnectFromServer()
        return True

    def release(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self.lock.unlock()

    def _asked(self) -> None:
        assert self._server is not None
        while (connection := self._server.nextPendingConnection()) is not None:
            connection.disconnected.connect(connection.deleteLater)
            connection.disconnectFromServer()
            self.activated.emit()


def folder_owner_differs(folder: Path) -> bool:
    try:
        return folder.stat().st_uid != os.getuid()
    except OSError:
        return False
