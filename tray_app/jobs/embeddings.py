"""Embeddings (`/v1/embeddings`, and Ollama's `/api/embed` through it) on the embeddings workers: the one
beside the GPU chat worker first, then the one beside the CPU chat worker.

An embedding has no effects and reaches the client only whole, so a failed attempt is always safe to
replay: once, on the CPU's embeddings worker, under the same job and request id, and the fallback is
announced like a chat's. What the journal keeps of an answer is its shape (count, dimensions, usage), not
the vectors."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tray_app.contract.events import FallbackCompleted, FallbackStarted
from tray_app.contract.roles import EMBED_ROLES
from tray_app.jobs import policy
from tray_app.jobs.admission import QueueFull, QueueTimeout
from tray_app.jobs.context import JobsContext
from tray_app.jobs.engine import CAUSE_WAIT_SECONDS
from tray_app.jobs.outcomes import JobError, JobFailed, cannot_serve
from tray_app.jobs.registry import Job
from tray_app.jobs.relay import UpstreamError
from tray_app.jobs.worker_port import ExecutorSettings, Prompts, Worker
from tray_app.tokenizer.wire import TokenizerFailed

log = logging.getLogger(__name__)

ORDER = (("gpu", EMBED_ROLES["gpu"]), ("cpu", EMBED_ROLES["cpu"]))  # (device, worker role), in order
# An answer's allowance before its worker counts as hung: this, plus its input tokens read at a fraction
# (SPEED_MARGIN) of the speed measured on that worker, or at SLOWEST_TOKENS_PER_SECOND until one is measured.
ANSWER_SECONDS = 120.0
SLOWEST_TOKENS_PER_SECOND = 5.0  # a large model on a few slow cores
SPEED_MARGIN = 4.0
MEASURED_FROM = 64  # tokens: a smaller batch's time is mostly a request's fixed cost, not reading speed


def answer_seconds(tokens: int, tokens_per_second: float) -> float:
    """How long an answer of `tokens` input tokens may take on a worker measured at `tokens_per_second`
    (0: not measured yet) before the worker counts as hung."""
    rate = tokens_per_second / SPEED_MARGIN if tokens_per_second > 0 else SLOWEST_TOKENS_PER_SECOND
    return ANSWER_SECONDS + tokens / rate


class InputTokens:
    """Embeddings inputs' tokens as the embeddings workers count them (start and special tokens in): with
    the chat model's tokenizer, or a separate embeddings model's (both in the tokenizer helper). A
    token-array input is as many tokens as it holds."""

    def __init__(self, chat_model: Callable[[], Prompts], model_file: Callable[[str], Prompts]) -> None:
        self._chat_model = chat_model
        self._model_file = model_file
        self._unreadable: set[str] = set()  # embeddings models whose tokenizer could not be read

    async def count(self, model_file: str, inputs: list[Any]) -> list[int]:
        """Each input's tokens; `model_file`: the embeddings model (`embeddings.model`, "" for the chat
        model). JobFailed (503) when the tokenizer helper cannot answer."""
        texts = [item for item in inputs if isinstance(item, str)]
        try:
            counted = iter(await self._prompts(model_file).count_texts(texts) if texts else [])
        except TokenizerFailed as error:
            if error.kind != "model" or not model_file:
                raise JobFailed(
                    JobError(
                        503,
                        "tokenizer_unavailable",
                        f"the inputs could not be counted: {error}",
                        retry_after=1,
                    )
                ) from None
            # Its worker cannot start with it either, and says why; the chat model's count stands in.
            log.warning(
                "embeddings model %s: no tokenizer (%s); counting with the chat model's", model_file, error
            )
            self._unreadable.add(model_file)
            return await self.count(model_file, inputs)
        return [next(counted) if isinstance(item, str) else len(item) for item in inputs]

    def _prompts(self, model_file: str) -> Prompts:
        if model_file and model_file not in self._unreadable:
            return self._model_file(str(Path(model_file).expanduser()))
        return self._chat_model()


def journal_summary(answer: dict[str, Any]) -> dict[str, Any]:
    """What the journal keeps of an answer: everything but the vectors."""
    data = answer.get("data") or []
    first = data[0].get("embedding") if data else None
    return {
        "object": "list",
        "model": answer.get("model"),
        "usage": answer.get("usage"),
        "count": len(data),
        "dimensions": len(first) if isinstance(first, list) else None,
        "failsoft": answer.get("failsoft"),
    }


class EmbeddingRunner:
    """Runs one embeddings job to its end: an answer (returned) or an ApiError (raised), the job's state
    changed through the registry at each step."""

    def __init__(self, ctx: JobsContext, settings: ExecutorSettings) -> None:
        self.ctx = ctx
        self.settings = settings
        self.speeds: dict[str, float] = {}  # role -> tokens per second, a moving average of its answers

    def answer_seconds(self, role: str, tokens: int) -> float:
        return answer_seconds(tokens, self.speeds.get(role, 0.0))

    def _record_speed(self, role: str, tokens: int, seconds: float) -> None:
        if tokens < MEASURED_FROM or seconds <= 0:
            return
        measured = tokens / seconds
        known = self.speeds.get(role)
        self.speeds[role] = measured if known is None else 0.7 * known + 0.3 * measured

    async def run(self, job: Job) -> dict[str, Any]:
        """The answer in OpenAI's shape, with the `failsoft` object; JobFailed (the job failed) else."""
        failure: UpstreamError | None = None
        fell_back_at: float | None = None
        for device, role in ORDER:
            worker: Worker | None = self.ctx.workers(role)
            if worker is None:
                continue
            if failure is not None and fell_back_at is None:
                fell_back_at = time.monotonic()
                self.ctx.registry.name_fallback(job, failure.kind)
                self.ctx.bus.publish(FallbackStarted(job_id=job.id, reason=failure.kind))
            try:
                answer = await self._attempt(job, role, device, worker, replay=failure is not None)
            except QueueFull as full:
                busy = JobError(
                    429,
                    "queue_full",
                    f"too many requests waiting ({full.depth}); try again later",
                    type="rate_limit_error",
                    retry_after=full.retry_after,
                )
                raise self._fail(job, busy) from None
            except UpstreamError as error:
                if error.client_error:
                    refused = JobError(400, "invalid_request", error.message, type="invalid_request_error")
                    raise self._fail(job, refused) from None
                failure = error
                continue
            answer["model"] = self.settings.model_id or answer.get("model")
            answer["failsoft"] = job.failsoft()
            if self.ctx.registry.complete(job, journal_summary(answer)) and fell_back_at is not None:
                seconds = time.monotonic() - fell_back_at
                self.ctx.bus.publish(
                    FallbackCompleted(job_id=job.id, reason=job.fallback_reason or "", seconds=seconds)
                )
            return answer
        reason = failure.message if failure else "embeddings are disabled ([embeddings] enabled = false)"
        raise self._fail(
            job,
            cannot_serve(
                f"no embeddings worker could answer: {reason}", "no_embeddings_worker", 5, job_id=job.id
            ),
        )

    async def _attempt(
        self, job: Job, role: str, device: str, worker: Worker, *, replay: bool
    ) -> dict[str, Any]:
        """One attempt on `worker`. A new request waits in the bounded queue (QueueFull when it is full);
        a replay of accepted work is never turned away by it."""
        wait = min(self.settings.queue_timeout, max(job.time_left(), 1.0))
        try:
            slot = await self.ctx.slots.acquire(role, job.id, wait, accepted=replay)
        except QueueTimeout as timeout:
            raise UpstreamError("queue_timeout", f"no free {role} slot: {timeout}") from None
        number = 0
        pid: int | None = None
        try:
            if worker.state != "ready" or not worker.base_url:
                # Started on the first request; a worker that keeps failing is passed over.
                ready_wait = min(self.settings.worker_ready_wait, max(job.time_left(), 1.0))
                if worker.state == "failed" or not await worker.ensure_ready(ready_wait):
                    raise UpstreamError("unavailable", f"the {role} worker is {worker.state}")
            pid = worker.pid
            number = self.ctx.registry.start_attempt(job, device)
            if not number:
                raise UpstreamError("unavailable", "the job ended meanwhile")
            worker.note_tokens(0)  # a drill's fault armed for "before any token" fires here
            headers = worker.request_headers
            url = f"{worker.base_url}/v1/embeddings"
            # Scaled with the tokens counted at admission: a large batch on a slow device is not a hang.
            allowance = self.answer_seconds(role, job.prompt_tokens)
            sent_at = time.monotonic()
            data = await self.ctx.relay.post(url, json.dumps(job.body).encode(), headers, allowance)
            answer: dict[str, Any] = json.loads(data)
            self._record_speed(role, job.prompt_tokens, time.monotonic() - sent_at)
            self.ctx.registry.end_attempt(job, number, "completed")
            return answer
        except UpstreamError as error:
            if error.kind == "exited" and pid is not None:
                # A dropped connection only says the worker went away; its supervisor names how it ended.
                ended = await worker.failure_of(pid, CAUSE_WAIT_SECONDS)
                if ended and ended.get("kind") not in (None, "exited"):
                    error.kind = str(ended["kind"])
            if number:
                self.ctx.registry.end_attempt(job, number, "failed", f"{error.kind}: {error.message}")
            worker_fault = not error.client_error and error.kind not in policy.NOT_WORKER_FAULTS
            if worker_fault and worker.state == "ready" and worker.pid == pid:
                worker.mark_unhealthy(error.message, error.kind, pid=pid)  # its supervisor restarts it
            raise
        finally:
            self.ctx.slots.release(role, slot)

    def _fail(self, job: Job, error: JobError) -> JobFailed:
        self.ctx.registry.fail(job, "failed", error.record(), error.code)
        return JobFailed(error)
