"""How a worker process is started from its profile (command line, environment, memory limit), or why it
must not be."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tray_app.engine import simulated
from tray_app.engine.argv import llama_server_argv, worker_env
from tray_app.engine.profile import WorkerProfile
from tray_app.supervisor import load_check
from tray_app.supervisor.process import WorkerProcess


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    memory_limit: int | None  # RLIMIT_AS of a worker on a simulated device


def prepare(engine_path: Path, profile: WorkerProfile, port: int, key: str) -> Launch | str:
    """The launch of `profile`'s worker on `port`, or the reason (for the user) it is refused."""
    refusal = load_check.refusal_before_start(profile, engine_path)
    if refusal is not None:
        return refusal
    # Level 4 ("trace"): the load log then has the buffer sizes, what the simulated check reads.
    argv = [*llama_server_argv(engine_path, profile, port), "--log-verbosity", "4"]
    limit = None
    if profile.simulated_vram_bytes is not None:
        # The process holds the simulated VRAM's share and what its plan keeps in RAM (a split's layers or
        # experts): a real GPU worker holds those in host memory too.
        held = profile.simulated_vram_bytes + load_check.ram_weights_bytes(profile)
        limit = simulated.address_space_limit(held, load_fault=profile.fault_load_oom)
    # The key in the environment, not on the command line that `ps` shows.
    env = {"LLAMA_API_KEY": key, **worker_env(profile)}
    return Launch(argv, env, limit)


def start(launch: Launch, log_file: Path, log_requests: bool) -> WorkerProcess:
    """Start the process (OSError when it cannot be)."""
    limit = launch.memory_limit
    return WorkerProcess.spawn(
        launch.argv,
        log_file,
        env=launch.env,
        preexec=simulated.limit_in_child(limit) if limit is not None else None,
        log_requests=log_requests,
    )
