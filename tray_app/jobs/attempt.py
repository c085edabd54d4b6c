"""One attempt: a job's one try on one worker, from the slot to the attempt's end in the registry.

`Attempt.run` takes a slot (unless the job holds one), readies the worker, starts the attempt in the
registry, sends the job's first request (or takes up the one `Executor.dispatch` wrote) or a resumed one,
relays the worker's stream, holds pieces with no output back until the first token, stamps the stream's
path, ends the attempt (completed, failed, cancelled) and gives the slot back. It yields the `Piece`s a
streamed client gets and raises `UpstreamError` when the worker fails: what follows a failure (a replay,
a refusal) is the executor's decision, not the attempt's.

Whatever else watches an attempt (the CPU mirror, the CPU speed meter, the effects-delivered note) is an
`AttemptListener`, told at fixed points of the attempt; none of it is the attempt's own concern.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from tray_app.contract.roles import PEER_ROLE_PREFIX
from tray_app.jobs.admission import QueueTimeout, SlotPool
from tray_app.jobs.assemble import chat_chunk
from tray_app.jobs.continuation import EchoedPrefix
from tray_app.jobs.outcomes import Piece
from tray_app.jobs.progress import Progress, continues_chat, delivered_tokens
from tray_app.jobs.registry import Job, JobRegistry, upstream_stream, worker_fields
from tray_app.jobs.relay import Chunk, Relay, Sent, UpstreamError
from tray_app.jobs.replay import first_path, resume_request
from tray_app.jobs.worker_port import ExecutorSettings, Prompts, Worker
from tray_app.tokenizer.wire import TokenizerFailed


class AttemptListener:
    """Watches one attempt, told at fixed points of it. Every method does nothing here: a listener overrides
    the ones it needs. One listener object serves one attempt, so it may keep that attempt's state."""

    async def before_slot(self, job: Job, on_cpu: bool) -> None:
        """The attempt is about to ask for a slot (an attempt with a slot already held skips this).
        `on_cpu`: it runs on the job's CPU worker."""

    def started(self, job: Job, worker_role: str, on_cpu: bool) -> None:
        """The registry started the attempt on `worker_role`; its request is not sent yet."""

    def chunk(self, job: Job, obj: dict[str, Any]) -> None:
        """A chunk came from the worker, as the worker sent it (before a resumed chat's is reshaped)."""

    def piece_made(self, job: Job, progress: Progress, piece: Piece) -> None:
        """A streamed client is to get `piece`, now or with the first token: it has not left yet."""

    def delivered(self, job: Job, progress: Progress, piece: Piece) -> None:
        """`piece` left for the client (with any held pieces it carries)."""

    def completed(self, job: Job, progress: Progress) -> None:
        """The worker's answer ended well, and the registry recorded the attempt completed."""


class EffectsDeliveredNote(AttemptListener):
    """A tool call that reaches the client may have effects: the job says so (journaled) before the piece
    leaves, so that a crash right after cannot lose the fact. A job that holds its tool calls back until the
    answer is whole (`job.holds_tool_calls`) sends none mid-stream."""

    def __init__(self, registry: JobRegistry) -> None:
        self._registry = registry

    def piece_made(self, job: Job, progress: Progress, piece: Piece) -> None:
        if progress.tool_call_delivered and not job.holds_tool_calls:
            self._registry.note_effects_delivered(job)


@dataclass(frozen=True)
class _Dispatch:
    """A job's first request, written to its worker by the handler that admitted it (Executor.dispatch)."""

    worker_role: str
    url: str
    sent: Sent


class DispatchedRequests:
    """First requests written before their job's task started, by job id, until an attempt takes one up."""

    def __init__(self) -> None:
        self._by_job: dict[str, _Dispatch] = {}

    def put(self, job: Job, worker_role: str, url: str, sent: Sent) -> None:
        self._by_job[job.id] = _Dispatch(worker_role, url, sent)

    def take(self, job: Job, worker_role: str, url: str, resume: bool) -> Sent | None:
        """The job's dispatched request, if this attempt is the one it was written for (else dropped)."""
        dispatched = self._by_job.pop(job.id, None)
        if dispatched is None:
            return None
        if resume or (dispatched.worker_role, dispatched.url) != (worker_role, url):
            dispatched.sent.abort()
            return None
        return dispatched.sent

    def drop(self, job: Job) -> None:
        dispatched = self._by_job.pop(job.id, None)
        if dispatched is not None:
            dispatched.sent.abort()  # the job ended before an attempt took it up


@dataclass(frozen=True)
class AttemptTools:
    """What an attempt uses of the executor's world."""

    settings: Callable[[], ExecutorSettings]  # read as the attempt goes: a config reload takes effect
    workers: Callable[[str], Worker | None]
    slots: SlotPool
    relay: Relay
    registry: JobRegistry
    prompts: Callable[[str], Prompts]  # by model name: the models may change
    prompt_rate: Callable[[str], float]  # a worker's prompt tokens per second, for the first token's deadline
    dispatched: DispatchedRequests


def request_headers(job: Job, worker: Worker, worker_role: str, body: bytes) -> dict[str, str]:
    """The headers of a request to `worker`. A peer (another machine's server) also gets the job's request
    id and an Idempotency-Key: the same request sent again (after a lost connection, or by this service
    started again) finds the answer the peer made, or its run, instead of a second run; a resumed request,
    another body, is another key."""
    if not is_peer(worker_role):
        return worker.request_headers
    key = f"{job.id}-{hashlib.sha256(body).hexdigest()[:16]}"
    return {**worker.request_headers, "Idempotency-Key": key, "X-Request-Id": job.request_id}


def first_request(job: Job, worker: Worker, worker_role: str) -> tuple[str, bytes]:
    """The job's own request to `worker`: its URL and body."""
    url = (worker.base_url or "") + first_path(job)
    if is_peer(worker_role):
        body = {**worker_fields(job.kind, job.body), **stream_fields(worker_role, 0)}
        return url, json.dumps(body).encode()
    return url, job.upstream_body()


def is_peer(worker_role: str) -> bool:
    return worker_role.startswith(PEER_ROLE_PREFIX)


def stream_fields(worker_role: str, prompt_tokens: int) -> dict[str, bool]:
    """How an attempt asks for a streamed answer: a local llama-server with its prompt-progress events
    (registry.upstream_stream); a peer, another server that takes requests as clients send them, with none
    of llama-server's own fields (a Failsoft peer refuses them)."""
    return {"stream": True} if is_peer(worker_role) else upstream_stream(prompt_tokens)


@dataclass(frozen=True)
class AttemptWay:
    """How one attempt goes: on the worker of `role`; `resume`: the client already has part of the answer
    (the run's progress), and the worker continues it; `deliver`: a client reads the stream; `listeners`:
    told of its steps, in this order."""

    role: str
    resume: bool = False
    deliver: bool = False
    listeners: tuple[AttemptListener, ...] = ()


class Attempt:
    """One try of `job` (module doc), the way `way` says, adding to the run's `progress`."""

    def __init__(self, tools: AttemptTools, job: Job, progress: Progress, way: AttemptWay) -> None:
        self._tools = tools
        self.job = job
        self.role = way.role
        self.progress = progress
        self.resume = resume = way.resume
        self.deliver = way.deliver
        self._listeners = way.listeners
        self._number = 0  # the attempt's number in the registry, once started
        self._url = ""
        # A resumed chat's chunks come back as completion chunks, or (a thinking model's, continued by
        # llama-server) as chat chunks that repeat the answer so far: either way they leave as the chunks of
        # the stream the client already reads.
        self._convert = resume and job.kind == "chat"
        self._echoed: EchoedPrefix | None = None
        # Pieces with no output before the first that has some (the role announcement): they travel with
        # that first token, one trip to the client instead of two.
        self._held: list[Piece] = []
        self._first_token_sent = False

    async def run(self, slot: float | None) -> AsyncGenerator[Piece, None]:
        """The attempt's pieces for a streamed client; `slot`: one the job already holds on the worker."""
        job = self.job
        worker_role = job.worker_role(self.role)
        if worker_role is None:
            raise UpstreamError("unavailable", f"{job.model} may not run on the {self.role.upper()}")
        on_cpu = worker_role == job.worker_role("cpu")
        if slot is None:
            for listener in self._listeners:
                await listener.before_slot(job, on_cpu)  # the mirror settles before the slot is asked for
            slot = await self._take_slot(worker_role)
        try:
            worker = await self._ready_worker(worker_role)
            self.progress.worker_pid = worker.pid
            self._number = self._tools.registry.start_attempt(job, worker_role)
            if not self._number:
                return  # the job ended (cancelled) while it waited for a slot or a worker: no late start
            for listener in self._listeners:
                listener.started(job, worker_role, on_cpu)
            stream = await self._open(worker, worker_role)
            async with aclosing(stream) as chunks:
                async for chunk in chunks:
                    if job.final:
                        return  # cancelled meanwhile: whatever this attempt still says is dropped
                    piece = self._take_in(chunk, worker)
                    if piece is not None:
                        yield piece
                        self._sent(piece)
            for piece in self._held:  # an answer with no output at all
                yield piece
                self._sent(piece)
            self._end("completed")
            for listener in self._listeners:
                listener.completed(job, self.progress)
        except UpstreamError as failure:
            self._end("failed", f"{failure.kind}: {failure.message}")
            for piece in self._held:  # announced as delivered (progress): it goes out ahead of what follows
                yield piece
                self._sent(piece)
            raise
        except (asyncio.CancelledError, GeneratorExit):
            self._end("cancelled")
            raise
        finally:
            self._tools.slots.release(worker_role, slot)

    def _end(self, outcome: str, error: str | None = None) -> None:
        """The attempt's end in the registry (none for an attempt that never started)."""
        if self._number:
            self._tools.registry.end_attempt(self.job, self._number, outcome, error)

    async def _take_slot(self, worker_role: str) -> float:
        wait = min(self._tools.settings().queue_timeout, max(self.job.time_left(), 1.0))
        try:
            return await self._tools.slots.acquire(worker_role, self.job.id, wait, accepted=True)
        except QueueTimeout as timeout:
            raise UpstreamError("queue_timeout", f"no free {worker_role} slot: {timeout}") from None

    async def _ready_worker(self, worker_role: str) -> Worker:
        worker = self._tools.workers(worker_role)
        if worker is None:
            raise UpstreamError("unavailable", f"there is no {worker_role} worker")
        if worker.state == "ready" and worker.base_url:
            return worker
        first_start = worker.state == "starting" and worker.last_failure is None
        if self.role == "gpu" and not first_start:
            # Not waiting here: a GPU that is restarting is a failure the policy answers (often: the CPU).
            raise UpstreamError("unavailable", f"the GPU worker is {worker.state}")
        # A worker loading for the first time (the service just started) is waited for, as a model loaded
        # on demand is: the GPU answers in a second or two, where the CPU would answer slower.
        wait = min(self._tools.settings().worker_ready_wait, max(self.job.time_left(), 1.0))
        if await worker.ensure_ready(wait) and worker.base_url:
            return worker
        raise UpstreamError("unavailable", f"the {self.role} worker is {worker.state}")

    async def _open(self, worker: Worker, worker_role: str) -> AsyncGenerator[Chunk, None]:
        """The worker's stream of this attempt's answer: its request built, or the dispatched one taken up."""
        job, progress, tools = self.job, self.progress, self._tools
        self._url, body = await self._request(worker, worker_role)
        stall = tools.settings().stall_seconds
        first_timeout = stall + job.prompt_tokens / tools.prompt_rate(worker_role)
        if self._convert and continues_chat(job, progress):
            self._echoed = EchoedPrefix(progress.delivered_reasoning, progress.delivered_text)
        progress.assembler.begin_attempt(resumed=self.resume)
        sent = tools.dispatched.take(job, worker_role, self._url, self.resume)
        if sent is None:
            worker.note_tokens(0)  # a drill's fault armed for "before any token" fires here
        headers = request_headers(job, worker, worker_role, body)
        return tools.relay.stream(self._url, body, headers, first_timeout, stall, sent)

    async def _request(self, worker: Worker, worker_role: str) -> tuple[str, bytes]:
        """The URL and body to send: the job's own request, or a resumed one that continues the answer."""
        job, progress = self.job, self.progress
        if not self.resume:
            return first_request(job, worker, worker_role)
        prompts = self._tools.prompts(job.model)
        delivered = await delivered_tokens(progress, prompts)
        try:
            path, body = await resume_request(
                job,
                prompts,
                progress.delivered_reasoning,
                progress.delivered_text,
                max(job.max_tokens - delivered, 1),
                continues_chat(job, progress),
            )
        except TokenizerFailed as error:  # not the worker's fault: no unhealthy mark
            raise UpstreamError("unavailable", f"the resumed prompt could not be rendered: {error}") from None
        body.update(stream_fields(worker_role, job.prompt_tokens + delivered))
        return (worker.base_url or "") + path, json.dumps(body).encode()

    def _take_in(self, chunk: Chunk, worker: Worker) -> Piece | None:
        """One chunk from the worker: into the answer and to the listeners; the piece to send now, if any."""
        job, progress = self.job, self.progress
        obj = resumed_chat_chunk(progress, chunk.obj, self._echoed) if self._convert else chunk.obj
        progress.assembler.feed(obj)
        worker.note_tokens(1)
        for listener in self._listeners:
            listener.chunk(job, chunk.obj)
        if not self.deliver:
            return None
        piece = deliverable(progress, obj, chunk.raw if not self._convert else None)
        if piece is None:
            return None
        for listener in self._listeners:
            listener.piece_made(job, progress, piece)
        return self._hold_back(piece, chunk)

    def _hold_back(self, piece: Piece, chunk: Chunk) -> Piece | None:
        """Until the first token, a piece with no output waits to travel with it; the first token carries
        them, and the first attempt's first token stamps the stream's path (jobs.path_timing)."""
        if not self._first_token_sent and not piece.output:
            self._held.append(piece)
            return None
        if self._held:
            piece = Piece(piece.obj, piece.raw, piece.output, tuple(self._held))
            self._held.clear()
        job = self.job
        if piece.output and not self._first_token_sent and self._number == 1 and job.path is not None:
            job.path.to_worker = chunk.sent_at
            job.path.from_worker = chunk.received_at
        return piece

    def _sent(self, piece: Piece) -> None:
        if piece.output and not self._first_token_sent:
            self._tools.relay.prepare_next(self._url)  # the client has its first token
            self._first_token_sent = True
        for listener in self._listeners:
            listener.delivered(self.job, self.progress, piece)


def resumed_chat_chunk(
    progress: Progress, obj: dict[str, Any], echoed: EchoedPrefix | None
) -> dict[str, Any]:
    """A chunk of a resumed chat (a completion chunk, or a continued chat's with `echoed`), shaped as the chat
    chunk the client's stream expects."""
    choice = (obj.get("choices") or [{}])[0]
    if echoed is not None:
        delta = echoed.cut({k: v for k, v in (choice.get("delta") or {}).items() if k != "role"})
    else:
        text = choice.get("text") or ""
        delta = {"content": text} if text else {}
    return chat_chunk(progress.chunk_id, progress.created, progress.model, delta, choice.get("finish_reason"))


def deliverable(progress: Progress, obj: dict[str, Any], raw: str | None) -> Piece | None:
    """The piece to send for this chunk, recording what the client now has; None to skip it (a second role
    announcement after a replay)."""
    if not progress.chunk_id:
        progress.chunk_id = str(obj.get("id", ""))
        progress.created = int(obj.get("created") or time.time())
        progress.model = str(obj.get("model", ""))
    has_effect = output = False
    for choice in obj.get("choices") or []:
        delta = choice.get("delta")
        text = choice.get("text") if delta is None else delta.get("content")
        if text:
            progress.delivered_text += text
            progress.delivered_tokens += 1
            has_effect = output = True
        reasoning = delta.get("reasoning_content") if delta else None
        if reasoning:
            progress.delivered_reasoning += reasoning
            progress.delivered_tokens += 1
            has_effect = output = True
        if delta and delta.get("tool_calls"):
            progress.tool_call_delivered = True
            has_effect = output = True
        if choice.get("finish_reason"):
            has_effect = True
        if delta and delta.get("role") and not progress.role_sent:
            progress.role_sent = True
            has_effect = True
    if not has_effect:
        return None
    return Piece(obj, raw, output)
