"""Prometheus metrics in their own registry (several services in one process, e.g. tests, never collide)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tray_app.contract.events import Event, WorkerRestarted

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "failsoft_requests",
            "Requests answered, by route and outcome",
            ["route", "outcome"],
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "failsoft_queue_depth", "Requests waiting for a worker slot", registry=self.registry
        )
        self.worker_restarts = Counter(
            "failsoft_worker_restarts", "Worker restarts, by role", ["role"], registry=self.registry
        )
        self.fallbacks = Counter(
            "failsoft_fallbacks", "GPU-to-CPU fallbacks, by outcome", ["outcome"], registry=self.registry
        )
        self.approvals_pending = Gauge(
            "failsoft_approvals_pending", "Jobs waiting for the user's approval", registry=self.registry
        )

    def on_event(self, event: Event) -> None:
        if isinstance(event, WorkerRestarted):
            self.worker_restarts.labels(role=event.role).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
