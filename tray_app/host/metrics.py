"""Prometheus metrics in their own registry (several services in one process, e.g. tests, never collide)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tray_app.contract.events import DeviceChanged, Event, GpuPathChanged, WorkerRestarted

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

        self.gpu_memory = Gauge(
            "failsoft_gpu_memory_bytes",
            "The GPU's memory as the device watcher last told it: total, free, own (Failsoft's workers), "
            "others (everything else in use)",
            ["kind"],
            registry=self.registry,
        )
        self.gpu_process = Gauge(
            "failsoft_gpu_process_bytes",
            "Device memory held per process on the GPU (own: one of Failsoft's workers)",
            ["pid", "name", "label", "own"],
            registry=self.registry,
        )
        self.gpu_path = Gauge(
            "failsoft_gpu_path",
            "The GPU path's state: 1 for the current one",
            ["state"],
            registry=self.registry,
        )
        for state in ("normal", "squeezed", "yielded", "lost"):
            self.gpu_path.labels(state=state).set(1 if state == "normal" else 0)

    def on_event(self, event: Event) -> None:
        if isinstance(event, WorkerRestarted):
            self.worker_restarts.labels(role=event.role).inc()
        elif isinstance(event, DeviceChanged):
            self._device(event)
        elif isinstance(event, GpuPathChanged):
            for state in ("normal", "squeezed", "yielded", "lost"):
                self.gpu_path.labels(state=state).set(1 if state == event.state else 0)

    def _device(self, event: DeviceChanged) -> None:
        figures = {
            "total": event.total_bytes,
            "free": event.free_bytes,
            "own": event.own_bytes,
            "others": event.others_bytes,
        }
        for kind, value in figures.items():
            self.gpu_memory.labels(kind=kind).set(value)
        # One series per process on the card now: those that left are dropped with the old reading.
        self.gpu_process.clear()
        for process in event.processes:
            self.gpu_process.labels(
                pid=str(process.get("pid")),
                name=str(process.get("name") or "?"),
                label=str(process.get("label") or ""),
                own="true" if process.get("own") else "false",
            ).set(float(process.get("used_bytes") or 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)
