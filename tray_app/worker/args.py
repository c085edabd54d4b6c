"""Command-line arguments of the worker process (the contract in docs/architecture.md)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

CACHE_TYPES = ("f16", "q8_0", "q4_0")
ROLES = ("gpu", "cpu")


@dataclass(frozen=True)
class WorkerArgs:
    model: Path
    role: str
    host: str
    port: int
    n_ctx: int
    n_gpu_layers: int
    threads: int
    n_parallel: int
    n_ubatch: int
    cache_type_k: str
    cache_type_v: str
    flash_attn: bool
    chat_format: str
    log_requests: bool
    simulated_vram_bytes: int | None
    enable_faults: bool
    fault_load_oom: bool
    parent_pid: int | None

    @property
    def simulated(self) -> bool:
        return self.simulated_vram_bytes is not None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tray_app.worker",
        description="One llama.cpp worker: llama-cpp-python's OpenAI server, /health and fault injection.",
    )
    parser.add_argument("--model", type=Path, required=True, help="GGUF model file")
    parser.add_argument("--role", choices=ROLES, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=_non_negative, required=True)
    parser.add_argument("--n-ctx", type=_positive, default=2048, help="context length (total over sequences)")
    parser.add_argument("--n-gpu-layers", type=int, default=0, help="layers to offload (-1: all)")
    parser.add_argument("--threads", type=_positive, default=1)
    parser.add_argument("--n-parallel", type=_positive, default=1)
    parser.add_argument(
        "--n-ubatch", type=_positive, default=512, help="physical batch size (sizes the compute buffer)"
    )
    parser.add_argument("--cache-type-k", choices=CACHE_TYPES, default="f16")
    parser.add_argument("--cache-type-v", choices=CACHE_TYPES, default="f16")
    parser.add_argument("--flash-attn", action="store_true")
    parser.add_argument(
        "--chat-format", default="", help="llama-cpp-python chat format (default: the model's)"
    )
    parser.add_argument(
        "--log-requests",
        action="store_true",
        help="keep llama.cpp's per-request timings in the log (by default only the load log and errors)",
    )
    parser.add_argument(
        "--simulated-vram-bytes",
        type=_positive,
        default=None,
        help="run as a GPU worker on a simulated device with this much free VRAM",
    )
    parser.add_argument(
        "--enable-faults", action="store_true", help="allow fault injection (drills and tests)"
    )
    parser.add_argument(
        "--fault-load-oom", action="store_true", help="fail the allocation at load (needs --enable-faults)"
    )
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> WorkerArgs:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.fault_load_oom and not ns.enable_faults:
        parser.error("--fault-load-oom needs --enable-faults")
    if ns.cache_type_v != "f16" and not ns.flash_attn:
        parser.error("a quantised V cache (--cache-type-v) needs --flash-attn")
    return WorkerArgs(
        model=ns.model,
        role=ns.role,
        host=ns.host,
        port=ns.port,
        n_ctx=ns.n_ctx,
        n_gpu_layers=ns.n_gpu_layers,
        threads=ns.threads,
        n_parallel=ns.n_parallel,
        n_ubatch=ns.n_ubatch,
        cache_type_k=ns.cache_type_k,
        cache_type_v=ns.cache_type_v,
        flash_attn=ns.flash_attn,
        chat_format=ns.chat_format,
        log_requests=ns.log_requests,
        simulated_vram_bytes=ns.simulated_vram_bytes,
        enable_faults=ns.enable_faults,
        fault_load_oom=ns.fault_load_oom,
        parent_pid=ns.parent_pid,
    )
