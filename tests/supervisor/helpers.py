"""Small helpers for the worker tests: an openai client on a worker, condition polling, process checks."""

from __future__ import annotations

import openai
import psutil

from tray_app.supervisor import WorkerSupervisor


def client_for(supervisor: WorkerSupervisor, timeout: float = 30.0) -> openai.AsyncOpenAI:
    """The real openai client on the worker; no retries, so a one-shot fault is seen as it happened."""
    assert supervisor.base_url is not None, f"{supervisor.role} worker has no URL ({supervisor.state})"
    key = supervisor.request_headers["Authorization"].removeprefix("Bearer ")
    return openai.AsyncOpenAI(
        base_url=supervisor.base_url + "/v1", api_key=key, max_retries=0, timeout=timeout
    )


def process_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


HELLO = [{"role": "user", "content": "Say hello."}]
