"""Tray messages for what a person should know about: a job moved to the CPU (or to a peer, another
machine's GPU), a fallback refused, a job waiting for approval, a worker restarted. A burst (a chaos test, a
flapping GPU) gives one message, not twenty: events are gathered for a moment, and messages keep a minimum
distance from each other.

Besides the service's events, the tray adds one of its own: `service_restarted` (the service itself restarted
after a crash: view/service_run.py says when and how, once per crash)."""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from tray_app.view.reasons import (
    GPU_PATH_TITLES,
    REASON_WORDS,
    fallback_place,
    fallback_target,
    fallback_to,
    moves_to_peer,
    reason_text,
)

SERVICE_RESTARTED = "service_restarted"  # the tray's own event: {"type", "at", "pid", "line"}
NOTIFIED_TYPES = (
    SERVICE_RESTARTED,
    "journal_failed",
    "gpu_path",
    "approval_needed",
    "fallback_refused",
    "fallback_started",
    "worker_restarted",
)
GATHER_MS = 800
COOLDOWN_MS = 4_000
STALE_AFTER_S = 60.0  # an event replayed after a reconnect is history, not news


@dataclass(frozen=True)
class Notice:
    title: str
    body: str
    level: str  # information, warning or critical
    opens_approvals: bool


def _gpu_path(event: dict[str, Any]) -> Notice:
    """Another program cut into the reserve or the plan (or the GPU came back): who, and what Failsoft
    does about it."""
    state = str(event.get("state") or "")
    reason = str(event.get("reason") or "").strip()
    action = str(event.get("action") or "").strip()
    body = ". ".join(part[:1].upper() + part[1:] for part in (reason, action) if part) + "."
    level = {"lost": "critical", "squeezed": "warning"}.get(state, "information")
    return Notice(GPU_PATH_TITLES.get(state, "GPU path changed"), body, level, False)


def _single(event: dict[str, Any]) -> Notice:
    kind = event["type"]
    if kind == "gpu_path":
        return _gpu_path(event)
    job = str(event.get("job_id") or "")[:12]
    if kind == SERVICE_RESTARTED:
        return Notice(
            "Failsoft service restarted", f"{event.get('line') or 'The service restarted'}.", "warning", False
        )
    if kind == "journal_failed":
        body = (
            f"Background jobs are refused until Failsoft restarts: {event.get('reason') or 'a write failed'}"
        )
        return Notice("Failsoft cannot store jobs", body, "critical", False)
    if kind == "approval_needed":
        seconds = float(event.get("estimated_seconds") or 0)
        # The event carries no prompt text (any API client may read events): its model and size instead.
        model, tokens = str(event.get("model") or ""), int(event.get("prompt_tokens") or 0)
        body = f"Job {job} needs about {seconds:.0f} s on the CPU. Click to review."
        if model or tokens:
            body += f"\n{model}" + (f", a prompt of {tokens:,} tokens" if tokens else "")
        return Notice("Approval needed", body, "information", True)
    if kind == "fallback_refused":
        body = f"Job {job} was not moved to the CPU: {reason_text(str(event.get('reason') or ''))}."
        return Notice("Fallback refused", body, "critical", False)
    if kind == "fallback_started":
        to = fallback_to(event)
        body = f"Job {job} continues on {fallback_place(to)}: {reason_text(str(event.get('reason') or ''))}."
        return Notice(f"Moved to {fallback_target(to)}", body, "warning", False)
    role = str(event.get("role") or "worker").upper()
    body = (
        f"Restarted after: {reason_text(str(event.get('reason') or ''))} (attempt {event.get('attempt', 1)})."
    )
    return Notice(f"{role} worker restarted", body, "warning", False)


def _plural(count: int, one: str, many: str) -> str:
    return one if count == 1 else many.format(count)


def coalesce(events: list[dict[str, Any]]) -> Notice | None:
    """One notice for a batch of events (oldest first), led by the most important kind."""
    events = [e for e in events if e.get("type") in NOTIFIED_TYPES]
    if not events:
        return None
    if len(events) == 1:
        return _single(events[0])
    counts = Counter(e["type"] for e in events)
    lines = [str(e.get("line") or "the service restarted") for e in events if e["type"] == SERVICE_RESTARTED]
    if counts["journal_failed"]:
        lines.append("the journal cannot store jobs: background jobs are refused")
    if counts["gpu_path"]:
        last = [e for e in events if e["type"] == "gpu_path"][-1]
        words = REASON_WORDS.get(str(last.get("state")))
        lines.append(
            f"GPU: {words.long if words else last.get('state')}: {last.get('reason') or ''}".rstrip(": ")
        )
    if counts["approval_needed"]:
        lines.append(
            _plural(counts["approval_needed"], "1 job waits for approval", "{} jobs wait for approval")
            + " — click to review"
        )
    if counts["fallback_refused"]:
        reasons = sorted({str(e.get("reason")) for e in events if e["type"] == "fallback_refused"})
        lines.append(
            _plural(counts["fallback_refused"], "1 fallback refused", "{} fallbacks refused")
            + f" ({', '.join(reasons)})"
        )
    # Moves to a peer are counted apart: "moved to the CPU" is never said of another machine's GPU.
    to_peer = sum(1 for e in events if moves_to_peer(e))
    to_cpu = counts["fallback_started"] - to_peer
    if to_cpu:
        lines.append(_plural(to_cpu, "1 job moved to the CPU", "{} jobs moved to the CPU"))
    if to_peer:
        lines.append(_plural(to_peer, "1 job moved to another machine", "{} jobs moved to another machine"))
    if counts["worker_restarted"]:
        roles = sorted({str(e.get("role")).upper() for e in events if e["type"] == "worker_restarted"})
        lines.append(
            _plural(counts["worker_restarted"], "1 worker restart", "{} worker restarts")
            + f" ({', '.join(roles)})"
        )
    for kind in NOTIFIED_TYPES:  # the title is the most important thing that happened
        if counts[kind]:
            lead = _single(next(e for e in events if e["type"] == kind))
            break
    critical = counts["fallback_refused"] or counts["journal_failed"] or lead.level == "critical"
    level = "critical" if critical else lead.level
    return Notice(lead.title, "\n".join(lines), level, bool(counts["approval_needed"]))


class NotificationCenter(QObject):
    """Gathers notable events and hands out coalesced notices through `show`."""

    approvals_requested = Signal()

    def __init__(
        self,
        show: Callable[[Notice], None],
        gather_ms: int = GATHER_MS,
        cooldown_ms: int = COOLDOWN_MS,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._show = show
        self._gather_ms = gather_ms
        self._cooldown_ms = cooldown_ms
        self._pending: list[dict[str, Any]] = []
        self._seen: deque[tuple[Any, ...]] = deque(maxlen=500)
        self._last_shown = float("-inf")
        self.last_notice: Notice | None = None
        self.shown: list[Notice] = []
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self.flush)

    def add(self, event: dict[str, Any]) -> None:
        if event.get("type") not in NOTIFIED_TYPES:
            return
        key = (event.get("type"), event.get("at"), event.get("job_id"), event.get("role"), event.get("pid"))
        at = event.get("at")
        if key in self._seen or (isinstance(at, int | float) and time.time() - at > STALE_AFTER_S):
            return
        self._seen.append(key)
        self._pending.append(event)
        if not self._timer.isActive():
            since_last_ms = (time.monotonic() - self._last_shown) * 1000
            self._timer.start(int(max(self._gather_ms, self._cooldown_ms - since_last_ms)))

    def flush(self) -> None:
        self._timer.stop()
        notice = coalesce(self._pending)
        self._pending = []
        if notice is None:
            return
        self._last_shown = time.monotonic()
        self.last_notice = notice
        self.shown.append(notice)
        del self.shown[:-50]
        self._show(notice)

    def message_clicked(self) -> None:
        """The user clicked the last message: an approval message opens the approvals window."""
        if self.last_notice is not None and self.last_notice.opens_approvals:
            self.approvals_requested.emit()
