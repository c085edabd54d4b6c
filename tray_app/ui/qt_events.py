"""The one adapter from service events (plain dicts from /failsoft/events) to Qt signals.

Every event arrives as the dict `tray_app.contract.events.Event.to_dict()` produced on the service side;
widgets connect to the typed signal they care about and never parse the stream themselves.
"""

from __future__ import annotations

import logging
from typing import Any

from PySide6.QtCore import QObject, Signal

log = logging.getLogger(__name__)


class QtEventBridge(QObject):
    any_event = Signal(dict)
    worker_state = Signal(dict)
    worker_unhealthy = Signal(dict)
    worker_restarted = Signal(dict)
    budget = Signal(dict)
    route_decided = Signal(dict)
    job_state = Signal(dict)
    queue = Signal(dict)
    fallback_started = Signal(dict)
    fallback_completed = Signal(dict)
    fallback_refused = Signal(dict)
    approval_needed = Signal(dict)

    # event type on the wire -> signal attribute; new event types only reach any_event until added here.
    _SIGNALS = (
        "worker_state",
        "worker_unhealthy",
        "worker_restarted",
        "budget",
        "route_decided",
        "job_state",
        "queue",
        "fallback_started",
        "fallback_completed",
        "fallback_refused",
        "approval_needed",
    )

    def dispatch(self, event: dict[str, Any]) -> None:
        """Emit `any_event` and the signal named by the event's type."""
        event_type = str(event.get("type") or "")
        self.any_event.emit(event)
        if event_type in self._SIGNALS:
            getattr(self, event_type).emit(event)
        else:
            log.debug("event type %r has no dedicated signal", event_type)
