"""The shapes of the service's answers that its clients read field by field: a worker's status, the
service's status (`GET /failsoft/status`) and a job's summary (`/v1/jobs/{id}`, `/failsoft/jobs`). The
service builds them with these types and the tray, the drill and the tests read them with the same ones,
so a renamed field is a type error on both sides, not a key that silently goes missing."""

from __future__ import annotations

from typing import Any, TypedDict


class WorkerStatus(TypedDict, total=False):
    """One worker (an absent one has only state "absent" and empty figures)."""

    role: str
    state: str  # a WorkerState, or "absent"
    reason: str
    pid: int | None
    base_url: str | None
    rss_bytes: int | None
    cpu_percent: float | None
    restarts: int
    last_failure: dict[str, Any] | None  # kind, message, pid, at
    next_retry_at: float | None
    warm: bool
    warm_reason: str
    log_file: str
    profile: dict[str, Any]
    engine: dict[str, Any] | None
    health: dict[str, Any]  # llama-server's /health, the load's buffers, runs_on, offload
    in_flight: int  # requests on it now (the service adds these two)
    slots: int


class ServiceStatus(TypedDict):
    version: str
    simulated: bool
    faults_enabled: bool
    model: dict[str, Any]
    engine: dict[str, Any]
    journal: dict[str, Any]  # ok, failure
    device: dict[str, Any]
    target: dict[str, Any]
    plan: dict[str, Any]
    cpu_plan: dict[str, Any]
    embeddings_plan: dict[str, Any] | None
    caps: dict[str, int]
    workers: dict[str, WorkerStatus]  # gpu, cpu
    embedding_workers: dict[str, WorkerStatus]  # gpu-embed, cpu-embed
    queue: dict[str, int]
    approvals: dict[str, int]
    counters: dict[str, int]
    policy: dict[str, Any]
    uptime_seconds: float


class JobSummary(TypedDict):
    id: str
    request_id: str
    kind: str  # chat, completion, embedding
    state: str  # a JobState
    route: str
    worker: str | None
    attempts: int
    fallback_reason: str | None
    estimated_seconds: float | None
    created_at: float
    background: bool
    seed: int | None
    preview: str
    error: dict[str, Any] | None
    result: dict[str, Any] | None
