"""The tray's service child (host/service_child.py) as Qt signals: its changes come from its watcher thread
and reach the tray on the GUI thread (queued: the receivers live there).

A first start that ends before the service ever answered is not a crash: the port may have been taken by a
Failsoft service started beside the tray (both at login), which the tray then shows (`found_running`), or
the service said why it cannot start (`failed`)."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from tray_app.host.service_child import Change, ChildChange, ServiceChild, Start, Stop, exit_words
from tray_app.host.service_probe import Probe


class QtServiceChild(QObject):
    changed = Signal(object)  # a ChildChange
    failed = Signal(str)  # the service could not start: why, in its own words
    found_running = Signal(str)  # a Failsoft service holds the address: what answered, in words

    def __init__(
        self, child: ServiceChild, probe: Callable[[], Probe], parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self.child = child
        self._probe = probe
        child.on_change = self._on_change

    def start(self) -> Start:
        return self.child.start()

    def stop(self) -> Stop:
        return self.child.stop()

    def _on_change(self, change: ChildChange) -> None:
        """On the child's watcher thread: the probe may wait there, never on the GUI thread."""
        if change.change is Change.FAILED and not self.child.ever_ready:
            probe = self._probe()
            if probe.found == "failsoft":
                self.found_running.emit(probe.detail)
            else:
                ended = exit_words(change.returncode) if change.returncode is not None else "no status"
                words = change.message or f"it ended before it answered ({ended})"
                self.failed.emit(words)
            return
        self.changed.emit(change)
