"""The tray's picture of the service: the last /failsoft/status, kept live by events.

Events change the picture at once (a worker state, the budget, the queue), then a short debounced
`/failsoft/status` fetch reconciles it with the service's own view; a slow periodic fetch covers whatever
has no event (RSS, CPU use) and tells when the service stops answering.
"""

from __future__ import annotations

import copy
import time
from typing import Any, cast

from PySide6.QtCore import QObject, QTimer, Signal

from tray_app.contract.status import ServiceStatus
from tray_app.contract.vocabulary import FINAL_JOB_STATES
from tray_app.ui.api_client import ServiceClient
from tray_app.ui.qt_events import QtEventBridge
from tray_app.view.reasons import fallback_to, peer_name
from tray_app.view.state import TraySummary, summarize

RECONCILE_DELAY_MS = 250
POLL_INTERVAL_MS = 5_000


class StatusModel(QObject):
    changed = Signal()

    def __init__(self, client: ServiceClient, bridge: QtEventBridge, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self.status: ServiceStatus | None = None
        self.reachable = False
        self.starting = False  # the in-process service is still coming up: not reachable is expected
        self.last_error = ""
        self.active_fallbacks: set[str] = set()
        self.last_fallback_at: float | None = None
        self._in_flight = False
        self._again = False
        self._reconcile = QTimer(self)
        self._reconcile.setSingleShot(True)
        self._reconcile.setInterval(RECONCILE_DELAY_MS)
        self._reconcile.timeout.connect(self.refresh)
        self._poll = QTimer(self)
        self._poll.setInterval(POLL_INTERVAL_MS)
        self._poll.timeout.connect(self.refresh)
        bridge.any_event.connect(self.apply_event)

    def start(self) -> None:
        self.refresh()
        self._poll.start()

    def stop(self) -> None:
        self._poll.stop()
        self._reconcile.stop()

    def summary(self) -> TraySummary:
        return summarize(self.status, self.reachable, len(self.active_fallbacks), self.starting)

    def schedule_refresh(self) -> None:
        self._reconcile.start()

    def refresh(self) -> None:
        if self._in_flight:
            self._again = True  # one more fetch after this one, so the newest state always lands
            return
        self._in_flight = True
        call = self.client.status()
        call.succeeded.connect(self._on_status)
        call.failed.connect(self._on_error)

    def _on_status(self, data: object) -> None:
        self._in_flight = False
        if isinstance(data, dict):
            self.status = cast(ServiceStatus, data)  # the service's answer, read as the contract's type
            self.reachable = True
            self.starting = False
            self.last_error = ""
            self.changed.emit()
        self._fetch_again_if_asked()

    def _on_error(self, message: str) -> None:
        self._in_flight = False
        self.reachable = False
        self.last_error = message
        self.changed.emit()
        self._fetch_again_if_asked()

    def _fetch_again_if_asked(self) -> None:
        if self._again:
            self._again = False
            self.schedule_refresh()

    def apply_event(self, event: dict[str, Any]) -> None:
        """Fold one event into the picture now; the debounced fetch confirms it."""
        kind = event.get("type")
        self._track_fallbacks(kind, event)
        if self.status is not None:
            status = copy.deepcopy(self.status)
            if kind == "worker_state" and event.get("role"):
                # Another model's worker is in "library_workers"; the reconciling fetch places a new one.
                workers = status.get("library_workers") or {}
                if event["role"] not in workers:
                    workers = status.setdefault("workers", {})
                worker = workers.setdefault(event["role"], {})
                worker["state"] = str(event.get("new") or "unknown")
                if event.get("pid") is not None:
                    worker["pid"] = event["pid"]
            elif kind == "budget" and isinstance(event.get("plan"), dict):
                self._apply_budget(status, event["plan"])
            elif kind == "queue":
                status["queue"] = {"depth": event.get("depth", 0), "limit": event.get("limit", 0)}
            elif kind == "approval_needed":
                approvals = status.setdefault("approvals", {})
                approvals["pending"] = int(approvals.get("pending") or 0) + 1
            self.status = status
        self.changed.emit()
        self.schedule_refresh()

    @staticmethod
    def _apply_budget(status: ServiceStatus, plans: dict[str, Any]) -> None:
        """A `budget` event carries the whole plan set: device, gpu and cpu plans."""
        gpu = plans.get("gpu")
        if not isinstance(gpu, dict):
            return
        status["plan"] = gpu
        if isinstance(plans.get("cpu"), dict):
            status["cpu_plan"] = plans["cpu"]
        if isinstance(plans.get("device"), dict):
            status["device"] = plans["device"]
        caps = status.setdefault("caps", {})
        caps.update({key: gpu[key] for key in ("n_ctx", "n_ctx_per_seq", "n_parallel") if key in gpu})

    def _track_fallbacks(self, kind: object, event: dict[str, Any]) -> None:
        job_id = str(event.get("job_id") or "")
        if kind == "fallback_started" and job_id and peer_name(fallback_to(event)) is None:
            # A job moved to a peer runs on another machine's GPU: not a CPU fallback of this one.
            self.active_fallbacks.add(job_id)
            self.last_fallback_at = time.time()
        elif kind in ("fallback_completed", "fallback_refused") or (
            kind == "job_state" and event.get("state") in FINAL_JOB_STATES
        ):
            self.active_fallbacks.discard(job_id)
