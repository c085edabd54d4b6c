"""The one writer of the measured CPU speed (`worker_port.CpuSpeed`, which the policy and the mirror read).

Three things measure the CPU worker, and all of them write through `CpuSpeedMeter`: a CPU attempt (its own
tokens over its own generation time, and llama-server's account of its prompt read: `CpuAttemptMeter`, an
attempt listener), the CPU mirror's reads (their timings) and the host's first measurement at start.
"""

from __future__ import annotations

import time
from typing import Any

from tray_app.jobs.attempt import AttemptListener
from tray_app.jobs.progress import Progress
from tray_app.jobs.registry import Job, JobRegistry
from tray_app.jobs.worker_port import CpuSpeed


class CpuSpeedMeter:
    """Writes one `CpuSpeed`. It keeps nothing of its own, so each user may wrap the shared `CpuSpeed` in a
    meter of its own: the writes are this module's either way."""

    def __init__(self, speed: CpuSpeed) -> None:
        self.speed = speed

    def generated(self, tokens: int, seconds: float) -> None:
        """The CPU worker generated `tokens` in `seconds`."""
        self.speed.record(tokens, seconds)

    def prompt_read(self, timings: Any) -> int | None:
        """llama-server's `timings` of a request to the CPU worker: the prompt tokens it read, and how fast,
        recorded; those tokens (None when the timings do not say)."""
        read, seconds = timings.get("prompt_n"), timings.get("prompt_ms")
        if not (isinstance(read, int) and isinstance(seconds, int | float)):
            return None
        self.speed.record_prompt(read, seconds / 1000.0)
        return read

    def first_measurement(self, timings: Any, tokens: int, started: float) -> None:
        """The host's short generation at start (`started`: time.monotonic() as it was sent): the worker's own
        clock when its `timings` say (the prompt's read apart), else the `tokens` chunks over the time the
        router saw."""
        self.prompt_read(timings)
        made, made_ms = timings.get("predicted_n"), timings.get("predicted_ms")
        if isinstance(made, int) and isinstance(made_ms, int | float):
            self.generated(made, made_ms / 1000.0)
        else:
            self.generated(tokens, time.monotonic() - started)


class CpuAttemptMeter(AttemptListener):
    """One attempt's part in the CPU speed: what llama-server says of a CPU attempt's prompt (how much its
    cache held: the answer's failsoft object says so; how fast it read the rest), and, on the main model's CPU
    worker, the generation speed the policy estimates with."""

    def __init__(self, meter: CpuSpeedMeter, registry: JobRegistry) -> None:
        self._meter = meter
        self._registry = registry
        self._on_cpu = False
        self._main_cpu = False
        # The sample: this attempt's own chunks over its own generation time, not a cold start, the prompt
        # read before the first token, or a resumed answer's part that the GPU wrote.
        self._first_chunk_at: float | None = None
        self._chunks = 0

    def started(self, job: Job, worker_role: str, on_cpu: bool) -> None:
        self._on_cpu = on_cpu
        self._main_cpu = worker_role == "cpu"

    def chunk(self, job: Job, obj: dict[str, Any]) -> None:
        if self._on_cpu and "timings" in obj:
            self._note_read(job, obj["timings"])
        self._chunks += 1
        if self._first_chunk_at is None:
            self._first_chunk_at = time.monotonic()

    def completed(self, job: Job, progress: Progress) -> None:
        if self._main_cpu and self._first_chunk_at is not None:
            self._meter.generated(self._chunks - 1, time.monotonic() - self._first_chunk_at)

    def _note_read(self, job: Job, timings: Any) -> None:
        cached = timings.get("cache_n")
        if isinstance(cached, int):
            self._registry.note_cpu_cache(job, cached)
        self._meter.prompt_read(timings)
