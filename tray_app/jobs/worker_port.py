"""What the executor needs of the world around it, and the settings it runs with: a worker (its supervisor's
face), a model's prompts, a stand-in that can answer now, the measured CPU speed."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from tray_app.jobs import policy


def retry_after_seconds(estimate: float | None) -> int:
    """A Retry-After for a job waiting on a CPU run of `estimate` seconds (unknown: a minute)."""
    if estimate is None or not math.isfinite(estimate):
        return 60
    return max(int(estimate), 1)


class Worker(Protocol):
    """What the executor needs of a supervisor."""

    @property
    def state(self) -> str: ...

    @property
    def base_url(self) -> str | None: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def last_failure(self) -> dict[str, Any] | None: ...

    @property
    def request_headers(self) -> dict[str, str]: ...

    async def ensure_ready(self, timeout: float) -> bool: ...

    def mark_unhealthy(self, reason: str, kind: str, *, pid: int | None = None) -> None: ...

    async def failure_of(self, pid: int, timeout: float) -> dict[str, Any] | None: ...

    def note_tokens(self, count: int) -> None: ...


class Prompts(Protocol):
    """What the executor needs of a model's tokenizer and its workers' chat template (a resumed answer's
    prompt and the tokens the client already has; the mirror's prompt, with its tools, as token ids):
    tokenizer.model_tokens.ModelTokens, whose every call is a request to the tokenizer helper process (it
    raises TokenizerFailed when the helper cannot answer)."""

    async def count(self, kind: str, body: dict[str, Any]) -> int: ...

    async def grammar_error(self, grammar: str) -> str | None: ...

    async def count_texts(self, texts: list[str]) -> list[int]: ...

    async def chat_prompt(
        self, messages: list[dict[str, Any]], tools: Any = None
    ) -> tuple[str, list[str]]: ...

    async def count_text(self, text: str, *, special: bool = True, add_bos: bool = True) -> int: ...

    async def tokenize(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class StandIn:
    """A stand-in that can answer a job on the GPU now: its name, its GPU worker, the prompt in its
    tokens and its context per slot."""

    model: str
    gpu_role: str
    prompt_tokens: int
    n_ctx_per_seq: int


@dataclass
class ExecutorSettings:
    policy: policy.Settings
    stall_seconds: float  # no chunk for this long: the worker is hung
    queue_timeout: float
    cpu_tokens_per_second: float  # fixed estimate from the config; 0: measured
    worker_ready_wait: float = 30.0
    model_id: str = ""  # the name clients know the model by (workers report their file path instead)
    max_pending_approvals: int = 32  # awaiting the user's approval, or approved and waiting for the CPU


@dataclass
class CpuSpeed:
    """Measured CPU generation speed (tokens per second), a moving average over successful CPU attempts;
    and its prompt-reading speed, from llama-server's own timings (the mirror's reads, CPU attempts). Read by
    anyone; recorded only through its meter (jobs.cpu_speed_meter), the one writer."""

    tokens_per_second: float = 0.0
    samples: int = 0
    prompt_tokens_per_second: float = 0.0
    prompt_samples: int = 0

    def record_prompt(self, tokens: int, seconds: float) -> None:
        if tokens < 16 or seconds <= 0:  # a few tokens' time is mostly the step's fixed cost
            return
        measured = tokens / seconds
        self.prompt_samples += 1
        weight = 1.0 if self.prompt_samples == 1 else 0.3
        self.prompt_tokens_per_second = (1 - weight) * self.prompt_tokens_per_second + weight * measured

    def record(self, tokens: int, seconds: float) -> None:
        if tokens < 4 or seconds <= 0:
            return
        measured = tokens / seconds
        self.samples += 1
        weight = 1.0 if self.samples == 1 else 0.3
        self.tokens_per_second = (1 - weight) * self.tokens_per_second + weight * measured
