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

    # Each signal below is named after the event type it carries: `dispatch` finds it by that name, so a new
    # event type reaches only any_event until a signal named after it is declared here.
    # A worker's life:
    worker_state = Signal(dict)
    worker_unhealthy = Signal(dict)
    worker_restarted = Signal(dict)
    # The budget and the jobs' way through it:
    budget = Signal(dict)
    route_decided = Signal(dict)
    job_state = Signal(dict)
    queue = Signal(dict)
    # Falling back to the CPU, and asking the user first:
    fallback_started = Signal(dict)
    fallback_completed = Signal(dict)
    fallback_refused = Signal(dict)
    approval_needed = Signal(dict)

    def dispatch(self, event: dict[str, Any]) -> None:
        """Emit `any_event` and the signal named by the event's type."""
        event_type = str(event.get("type") or "")
        self.any_event.emit(event)
        if event_type in _EVENT_SIGNALS:
            getattr(self, event_type).emit(event)
        else:
            log.debug("event type %r has no dedicated signal", event_type)


# The names of the signals above but any_event; read from the class so the names are written once.
_EVENT_SIGNALS = frozenset(
    name for name, value in vars(QtEventBridge).items() if isinstance(value, Signal) and name != "any_event"
)
