"""What the worker knows about itself; /health reads it without touching the model or its lock."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

import psutil
from starlette.types import ASGIApp

from tray_app.llama_log import BufferSizes
from tray_app.worker.args import WorkerArgs
from tray_app.worker.faults import FaultInjector
from tray_app.worker.memory_limit import MemoryLimit

Phase = Literal["loading", "ready", "failed"]


@dataclass
class WorkerState:
    args: WorkerArgs
    faults: FaultInjector | None
    phase: Phase = "loading"
    error: str = ""
    buffers: BufferSizes = field(default_factory=BufferSizes)
    chat_format: str = ""
    load_seconds: float | None = None
    memory_limit: MemoryLimit | None = None
    extra_buffers_disabled: bool = False
    model_app: ASGIApp | None = None  # llama-cpp-python's FastAPI app, once the model is loaded
    exit_code: int = 0
    _process: psutil.Process = field(default_factory=psutil.Process)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def mark_ready(self, model_app: ASGIApp) -> None:
        with self._lock:
            self.model_app = model_app
            self.phase = "ready"

    def mark_failed(self, error: str) -> None:
        with self._lock:
            self.phase = "failed"
            self.error = error
            self.exit_code = 1

    def health(self) -> dict[str, Any]:
        args = self.args
        with self._lock:
            phase, error = self.phase, self.error
        armed = self.faults.armed() if self.faults else None
        return {
            "state": phase,
            "error": error,
            "role": args.role,
            "pid": os.getpid(),
            "model_path": str(args.model),
            "n_ctx": args.n_ctx,
            "n_gpu_layers": args.n_gpu_layers,
            "n_threads": args.threads,
            "n_parallel": args.n_parallel,
            "chat_format": self.chat_format,
            "rss_bytes": self._process.memory_info().rss,
            "simulated": args.simulated,
            "simulated_vram_bytes": args.simulated_vram_bytes,
            "memory_limit": self.memory_limit.to_dict() if self.memory_limit else None,
            "faults_enabled": args.enable_faults,
            "armed_fault": {"kind": armed.kind, "after_tokens": armed.after_tokens} if armed else None,
            "buffers": self.buffers.to_dict(),
            "load_seconds": self.load_seconds,
            "extra_buffers_disabled": self.extra_buffers_disabled,
        }
