"""The shapes of the service's answers that its clients read field by field: a worker's status, the
service's status (`GET /failsoft/status`) and a job's summary (`/v1/jobs/{id}`, `/failsoft/jobs`). The
service builds them with these types and the tray, the drill and the tests read them with the same ones,
so a renamed field is a type error on both sides, not a key that silently goes missing."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


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


class ModelStatus(TypedDict):
    """One model of the library (`GET /failsoft/status` "models", `GET /v1/models` "failsoft")."""

    name: str  # what a request's `model` names (aliases also work)
    aliases: list[str]
    path: str
    main: bool  # the config's [model]: its GPU and CPU workers are the "gpu" and "cpu" ones, always kept
    devices: list[str]  # where it may run: "gpu", "cpu"
    stand_in: str | None  # the smaller model that may answer on the GPU when this one cannot
    where: str  # "gpu", "cpu", "gpu+cpu", "loading", "unloading" or "not loaded"
    workers: dict[str, str]  # device -> worker role ("gpu", "cpu" for the main model; "gpu@name", ...)
    vram_bytes: int  # the planned GPU share of its GPU worker while loaded (weights + KV + compute), else 0
    plan: dict[str, Any] | None  # its GPU plan (budget split) when it may use the GPU and one fits
    keep_alive: float  # seconds it stays loaded after its last request; -1: always
    idle_seconds: float | None  # since its last request ended; None while one runs or never used
    unload_in: float | None  # seconds until its keep-alive ends; None: not loaded, busy or kept
    in_flight: int  # requests on its workers now


class MirrorStatus(TypedDict):
    """The CPU mirror (jobs.mirror): the CPU worker reading GPU jobs' prompts ahead of a failover."""

    enabled: bool  # cpu.mirror
    slots: int  # cpu.mirror_slots: the CPU worker's router slots it may hold at once
    following: int  # unfinished jobs it mirrors
    covered: int  # of those, jobs whose whole prompt the CPU worker holds
    tokens_behind: int  # tokens still to read, over all the jobs it keeps
    reading: int  # its requests on the CPU worker now
    queued: int  # jobs waiting for a read
    read_tokens: int  # prompt tokens the CPU read for it since the start
    preempted: int  # reads cancelled because real work wanted the CPU worker
    skipped: int  # reads given up (too many waiting, too far behind, the worker refused)
    prompt_tokens_per_second: float  # the CPU worker's reading speed it plans with


class CrashNote(TypedDict):
    """How the service's previous run ended when it did not stop cleanly (host.crash_record)."""

    at: float  # when the crashed run was last known alive, or when its end was seen (Unix time)
    signal: int | None  # the fatal signal (11 for SIGSEGV, 9 for SIGKILL), when known
    exit_code: int | None  # the exit status, when it exited non-zero rather than by a signal
    pid: int | None  # the crashed run's process id
    stack_log: (
        str | None
    )  # the file holding the Python stack of the crash (faulthandler), when one was written
    restarted_by: str | None  # "tray", "systemd" or None (started again by hand)


class ServiceRun(TypedDict):
    """This run of the service: who it is, and how the run before it ended."""

    pid: int
    started_at: float  # Unix time
    restarted_after_crash: CrashNote | None


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
    workers: dict[str, WorkerStatus]  # gpu, cpu (the main model's)
    models: list[ModelStatus]  # the main model first, then the library's
    library_workers: dict[str, WorkerStatus]  # gpu@name, cpu@name of the library's other models
    embedding_workers: dict[str, WorkerStatus]  # gpu-embed, cpu-embed
    queue: dict[str, int]
    approvals: dict[str, int]
    counters: dict[str, int]
    policy: dict[str, Any]
    mirror: MirrorStatus
    uptime_seconds: float
    service: NotRequired[ServiceRun]
    tokenizer: NotRequired[dict[str, Any]]  # the tokenizer helper process: pid, restarts, last_exit
    # The device watcher's latest reading: total/free/used, state, and the processes on the card, each with
    # pid, name, label, used_bytes, own and describe ("comfyui (python3, pid 4242)").
    device_now: NotRequired[dict[str, Any]]
    # The GPU path: state (normal, squeezed, yielded, lost), reason, action, held_back, the yield.
    gpu_path: NotRequired[dict[str, Any]]
    # Each [[notify]] channel: name, kind, where (its host only), events, quiet_hours, sent, failed, dropped,
    # pending, last_sent_at, last_error, last_error_at.
    notify: NotRequired[list[dict[str, Any]]]
    # Each [[peers]] entry (another machine's server, a tier between this GPU and this CPU): name, url
    # (scheme://host:port), state (unknown, ready, down), gpu_ready, priority, slots, models, last_failure
    # ({kind, message, at} or None), next_probe_in (seconds, or None).
    peers: NotRequired[list[dict[str, Any]]]
    rpc: NotRequired[
        dict[str, Any]
    ]  # other machines' devices the GPU worker spans (llama.cpp RPC): boxes, remote


class JobSummary(TypedDict):
    id: str
    request_id: str
    kind: str  # chat, completion, embedding
    state: str  # a JobState
    route: str
    worker: str | None
    model: str  # the model that answered (or answers) on its route
    stand_in_for: str | None  # the model the client asked for, when a stand-in answered
    stand_in_offer: str | None  # awaiting approval: a smaller model the user may pick (GPU, now)
    attempts: int
    fallback_reason: str | None
    estimated_seconds: float | None
    created_at: float
    background: bool
    seed: int | None
    preview: str
    error: dict[str, Any] | None
    result: dict[str, Any] | None
    attempt_log: NotRequired[list[dict[str, Any]]]  # one job's read (GET /v1/jobs/{id}): each attempt


class PathTiming(TypedDict):
    """`GET /failsoft/timing`: the router's own time on the recent streams' way to their first token
    (jobs.path_timing), in milliseconds; the medians are None before any stream."""

    recorded: int  # streams recorded since the service started (the recent ones are the last of them)
    recent_ms: list[list[float]]  # [request to worker, worker's first output to client], oldest first
    requests: int  # how many pairs the medians are of
    to_worker_ms: float | None
    to_client_ms: float | None
    total_ms: float | None
