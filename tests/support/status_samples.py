"""`GET /failsoft/status` answers in the contract's shape (`ServiceStatus`), for the tests of what the tray
and the terminal make of them (sizes in bytes)."""

from __future__ import annotations

from typing import Any

from tray_app.contract.status import ServiceStatus

MiB = 1024**2


def make_status(
    gpu: str = "ready",
    cpu: str = "ready",
    simulated: bool = True,
    pending: int = 0,
    depth: int = 0,
) -> ServiceStatus:
    """A /failsoft/status answer of a service with no model library, sizes in bytes."""
    total = 4096 * MiB
    plan: dict[str, Any] = {
        "verdict": "gpu",
        "reason": "all 31 layers fit with 8192 tokens of context",
        "fits": True,
        "n_gpu_layers": 31,
        "n_layers": 31,
        "n_ctx": 8192,
        "n_parallel": 2,
        "n_ctx_per_seq": 4096,
        "weights_bytes": 98 * MiB,
        "kv_bytes": 180 * MiB,
        "compute_bytes": 66 * MiB,
        "output_bytes": 1 * MiB,
        "reserve_bytes": 410 * MiB,
        "other_bytes": 1024 * MiB,
        "free_bytes": total - (98 + 180 + 66 + 410 + 1024) * MiB,
        "total_bytes": total,
        "simulated": simulated,
        "device_name": "simulated GPU",
    }
    return {
        "version": "0.0.0",
        "simulated": simulated,
        "faults_enabled": False,
        "model": {"id": "qwen3-0.6b", "path": "/models/qwen3-0.6b.gguf"},
        "engine": {},
        "journal": {"ok": True, "failure": None},
        "device": {
            "name": "simulated GPU",
            "kind": "simulated",
            "total_bytes": total,
            "simulated": simulated,
        },
        "target": {},
        "plan": plan,
        "cpu_plan": {**plan, "verdict": "cpu"},
        "embeddings_plan": None,
        "caps": {"n_ctx": 8192, "n_ctx_per_seq": 4096, "n_parallel": 2, "cpu_n_ctx": 8192},
        "workers": {
            "gpu": {
                "state": gpu,
                "pid": 4242,
                "rss_bytes": 180 * MiB,
                "cpu_percent": 3.0,
                "restarts": 1,
                "last_failure": None,
            },
            "cpu": {
                "state": cpu,
                "pid": 4243,
                "rss_bytes": 170 * MiB,
                "cpu_percent": 1.0,
                "restarts": 0,
                "last_failure": None,
                "in_flight": 1,
                "slots": 4,
            },
        },
        "models": [],
        "library_workers": {},
        "embedding_workers": {},
        "queue": {"depth": depth, "limit": 32},
        "approvals": {"pending": pending},
        "counters": {},
        "policy": {"fallback": "auto"},
        "mirror": {
            "enabled": True,
            "slots": 1,
            "following": 1,
            "covered": 1,
            "tokens_behind": 0,
            "reading": 0,
            "queued": 0,
            "read_tokens": 1208,
            "preempted": 0,
            "skipped": 0,
            "prompt_tokens_per_second": 120.0,
        },
        "uptime_seconds": 0.0,
    }


def make_library_status(gemma_in_flight: int = 0) -> ServiceStatus:
    """`make_status` with a model library: the main model on the GPU and the CPU, gemma3-270m loaded on the
    GPU with its keep-alive running, phi-4-mini not loaded."""
    status = make_status()
    plan = status["plan"]
    main_vram = plan["weights_bytes"] + plan["kv_bytes"] + plan["compute_bytes"]
    gemma_plan = {"weights_bytes": 200 * MiB, "kv_bytes": 60 * MiB, "compute_bytes": 40 * MiB, "fits": True}
    status["models"] = [
        {
            "name": "qwen3-0.6b",
            "aliases": ["default"],
            "path": "/models/qwen3-0.6b.gguf",
            "main": True,
            "devices": ["gpu", "cpu"],
            "stand_in": "gemma3-270m",
            "where": "gpu+cpu",
            "workers": {"gpu": "gpu", "cpu": "cpu"},
            "vram_bytes": main_vram,
            "plan": plan,
            "keep_alive": -1,
            "idle_seconds": None,
            "unload_in": None,
            "in_flight": 1,
        },
        {
            "name": "gemma3-270m",
            "aliases": [],
            "path": "/models/gemma3-270m.gguf",
            "main": False,
            "devices": ["gpu", "cpu"],
            "stand_in": None,
            "where": "gpu",
            "workers": {"gpu": "gpu@gemma3-270m", "cpu": "cpu@gemma3-270m"},
            "vram_bytes": 300 * MiB,
            "plan": gemma_plan,
            "keep_alive": 300.0,
            "idle_seconds": None if gemma_in_flight else 258.0,
            "unload_in": None if gemma_in_flight else 42.0,
            "in_flight": gemma_in_flight,
        },
        {
            "name": "phi-4-mini",
            "aliases": ["phi"],
            "path": "/models/phi-4-mini.gguf",
            "main": False,
            "devices": ["cpu"],
            "stand_in": None,
            "where": "not loaded",
            "workers": {"cpu": "cpu@phi-4-mini"},
            "vram_bytes": 0,
            "plan": None,
            "keep_alive": 600.0,
            "idle_seconds": None,
            "unload_in": None,
            "in_flight": 0,
        },
    ]
    status["library_workers"] = {
        "gpu@gemma3-270m": {"state": "ready", "pid": 5001, "rss_bytes": 210 * MiB, "restarts": 0},
        "cpu@gemma3-270m": {"state": "stopped", "pid": None, "rss_bytes": None, "restarts": 0},
    }
    return status


# Two [[peers]] as the status shows them: one ready with its GPU, one down.
GAMING_PC: dict[str, Any] = {
    "name": "gaming-pc",
    "url": "http://192.168.1.20:8750",
    "state": "ready",
    "gpu_ready": True,
    "priority": 0,
    "slots": 2,
    "models": ["qwen3-8b"],
    "last_failure": None,
    "next_probe_in": 28.5,
}
NAS: dict[str, Any] = {
    "name": "nas",
    "url": "http://192.168.1.30:8080",
    "state": "down",
    "gpu_ready": None,
    "priority": 1,
    "slots": 1,
    "models": [],
    "last_failure": {"kind": "unreachable", "message": "GET /health: ConnectError: refused", "at": 1.0},
    "next_probe_in": 12.0,
}


def with_peers(*peers: dict[str, Any]) -> ServiceStatus:
    """A status with these peers (status samples as make_status makes them)."""
    status = make_status()
    status["peers"] = list(peers)
    return status
