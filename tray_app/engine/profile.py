"""A worker's profile: what one llama-server process is started with (every number from the plans).

Derived from the plans by tray_app.supervisor.profile; read by the command line (tray_app.engine.argv), the
supervisor that owns the process, and the host.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class WorkerProfile:
    role: str  # a Role for the main model's workers; "gpu@name" and "cpu@name" for a library model's
    model_path: Path
    n_ctx: int
    n_gpu_layers: int
    n_threads: int
    n_cpu_moe: int = 0  # a MoE model's expert split: the routed experts of the first N blocks stay in RAM
    cpu_expert_tensors: tuple[str, ...] = ()  # and these expert tensors of block N ("ffn_down_exps")
    n_parallel: int = 1
    n_ubatch: int = 512
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: bool = False
    chat_format: str = ""  # empty: the model's own template (llama-server --jinja)
    simulated_vram_bytes: int | None = None  # free VRAM of the simulated device; None on a real one
    enable_faults: bool = False
    fault_load_oom: bool = False  # drills: the load fails in a real allocation (a memory limit too small)
    log_requests: bool = False  # llama-server's ~30 lines per request in the worker log (else errors only)
    warm: bool = True  # start with the service; False: start on first use
    warm_reason: str = ""  # why it is (not) started with the service, in words
    pooling: str = ""  # an embeddings worker (llama-server --embeddings --pooling P); empty: a chat worker
    model_name: str = ""  # what clients call the model: the worker names it so in every answer (--alias)
    cache_ram_mib: int | None = None  # llama-server's prompt cache (--cache-ram); None: its own default
    # Other machines' devices (llama.cpp RPC, budget.remote) in --rpc order, and the layers each holds.
    rpc: tuple[str, ...] = ()
    rpc_layers: tuple[int, ...] = ()

    @property
    def embeddings(self) -> bool:
        return bool(self.pooling)

    @property
    def on_gpu(self) -> bool:
        return self.n_gpu_layers != 0

    def with_faults(self, *, load_oom: bool = False) -> WorkerProfile:
        return replace(self, enable_faults=True, fault_load_oom=load_oom)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["model_path"] = str(self.model_path)
        return data


@dataclass(frozen=True)
class WorkerProfiles:
    gpu: WorkerProfile | None  # None: no GPU (real or simulated) to run one on
    cpu: WorkerProfile | None  # None: the CPU worker is disabled in the config
    notes: tuple[str, ...] = ()  # what the service should tell the user about these choices

    embeddings: tuple[WorkerProfile, ...] = ()  # gpu-embed (when the plan leaves room), cpu-embed

    def by_role(self) -> dict[str, WorkerProfile]:
        """Every worker's profile by role: the chat workers, then the embeddings workers."""
        chat: dict[str, WorkerProfile] = {p.role: p for p in (self.gpu, self.cpu) if p is not None}
        return {**chat, **{profile.role: profile for profile in self.embeddings}}
