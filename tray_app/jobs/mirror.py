"""The CPU mirror: while a job runs on the GPU, the CPU worker reads the same prompt in the background, so
that llama-server's prompt cache holds it when the job fails over. The replay then reads only what the
mirror had not read, and the pause before its next token is a step or two instead of the whole prompt.

What is read is what a replay sends (jobs.replay): the prompt as token ids, in pieces (each a
`/v1/completions` request for one token; llama-server keeps a prompt after its slot is reused, `--cache-ram`,
and finds it again from any slot), then, for a chat, the job's own request for one token, so that the prompt
as the worker renders it is cached too. A stream's answer so far is added every `cpu.mirror_every_tokens`
tokens or `cpu.mirror_every_seconds` (a resume sends the prompt plus that text), and a finished answer once
more: the conversation's next turn starts with it, so the mirror then reads only the new part.

The work never competes with real work: one owner task (`run`) starts every read, on at most
`cpu.mirror_slots` of the CPU worker's router slots, taken only while that worker has no real work in flight
or waiting (SlotPool.try_acquire_background, never queued), and cancelled at once when real work asks for a
slot there (a failover, a CPU route, an approved job). llama-server has no per-request priority (its
`--prio` is the whole process's, real work included): the slot cap, the pre-emption and pieces of about half
a second of reading are the levers. The newest conversation is read first; the oldest are given up when too
many wait, and so is a read the CPU could not finish in minutes (policy.mirror_order).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from array import array
from collections.abc import Awaitable, Callable
from contextlib import aclosing, suppress
from dataclasses import dataclass, field
from typing import Any

from tray_app.config import CpuConfig
from tray_app.contract.status import MirrorStatus
from tray_app.jobs import policy
from tray_app.jobs.assemble import Assembler
from tray_app.jobs.attempt import AttemptListener
from tray_app.jobs.context import JobsContext
from tray_app.jobs.cpu_speed_meter import CpuSpeedMeter
from tray_app.jobs.outcomes import Piece
from tray_app.jobs.progress import Progress, constrained_output, continues_chat
from tray_app.jobs.registry import Job, worker_fields
from tray_app.jobs.relay import UpstreamError
from tray_app.jobs.replay import (
    COMPLETION_PATH,
    completion_prompt,
    completion_text,
    continued_chat_request,
    first_path,
)
from tray_app.jobs.worker_port import CpuSpeed, Prompts, Worker

log = logging.getLogger(__name__)

QUEUE_LIMIT = 8  # conversations waiting to be read; older ones are given up
KEPT = 32  # per CPU worker: the token sequences it was last given to read, and jobs remembered
WAKE_SECONDS = 5.0  # the owner looks again this often even when nothing woke it (a worker became ready)
PIECE_TIMEOUT = 120.0  # one piece's answer; a worker that takes longer is not worth waiting for
SETTLE_SECONDS = 3.0  # a replay waits at most this long for the piece of its own prompt being read
# Fields of a job's own request that would make its one-token answer cost more than the reading.
_NOT_FOR_ONE_TOKEN = ("logprobs", "top_logprobs", "n_probs", "max_completion_tokens", "n_predict")


@dataclass(frozen=True)
class MirrorSettings:
    enabled: bool = True
    slots: int = 1  # the CPU worker's router slots it may hold at once
    min_ms: float = 1000.0  # a prompt the CPU reads faster than this is not worth it (unless a stream...)
    every_tokens: int = 64  # a stream's answer goes to the mirror every this many tokens...
    every_seconds: float = 2.0  # ...or this often, whichever comes first (0 turns one off)


def common_prefix(a: array[int], b: array[int]) -> int:
    """The length of the longest common prefix (slices compare in C: fast for thousands of tokens)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        middle = (low + high) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle
    return low


@dataclass
class _Target:
    """What one job's replay would send, as the CPU worker should hold it. Once the job is final it is kept
    (among the KEPT newest) only for its tokens, the conversation's next turn: `job` and `exact` (a body as
    large as the request) are let go (`let_go`), so the kept targets hold token arrays, not requests."""

    key: str  # the job's id
    job: Job | None  # None once the job is final
    role: str  # the CPU worker
    tokens: array[int]  # the replay's prompt, as token ids
    prompt_tokens: int  # of `tokens`, the request's prompt (the rest is answer)
    exact: tuple[str, bytes] | None  # the replay's own request, read after the tokens (the worker renders it)
    updated_at: float = field(default_factory=time.monotonic)
    done: int = 0  # of `tokens`, what the CPU worker holds as far as the mirror knows
    exact_done: bool = False
    version: int = 0  # of its answer so far: a text tokenized on a thread is applied only if still the newest

    @property
    def behind(self) -> int:
        exact = 1 if self.exact is not None and not self.exact_done else 0
        return max(len(self.tokens) - self.done, 0) + exact

    def let_go(self) -> None:
        """Its job is final: no replay will send its request, and its body and result are not ours to keep."""
        self.job = None
        self.exact = None


def mirror_settings(cpu: CpuConfig) -> MirrorSettings:
    """The mirror's settings from the config's [cpu] section (off with the CPU worker)."""
    return MirrorSettings(
        enabled=cpu.enabled and cpu.mirror,
        slots=cpu.mirror_slots,
        min_ms=cpu.mirror_min_ms,
        every_tokens=cpu.mirror_every_tokens,
        every_seconds=cpu.mirror_every_seconds,
    )


class Following:
    """One GPU attempt of a mirrored job: hands the mirror its answer as it grows (a stream's), and whole."""

    def __init__(self, mirror: Mirror, target: _Target, prompts: Prompts, extend: bool) -> None:
        assert target.job is not None  # a job being attempted is not final: its target holds it
        self._mirror = mirror
        self._target = target
        self._job = target.job  # the attempt's own: the target lets go of it once the job is final
        self._prompts = prompts
        self._extend = extend  # a stream that a resume could continue: its answer so far is worth reading
        self._new = 0
        self._since: float | None = None  # from the first chunk: the prompt's read is not the answer's time
        self._settings = mirror.settings()

    def grew(self, progress: Progress) -> None:
        """One more chunk reached the client (on every chunk: cheap until an extension is due)."""
        if not self._extend:
            return
        self._new += 1
        now = time.monotonic()
        if self._since is None:
            self._since = now
        settings = self._settings
        if not policy.extend_due(self._new, now - self._since, settings.every_tokens, settings.every_seconds):
            return
        self._new, self._since = 0, now
        job = self._job
        self._mirror.extend(
            self._target, job, self._prompts, progress.delivered_reasoning, progress.delivered_text,
            continues_chat(job, progress),
        )  # fmt: skip

    def finished(self, assembler: Assembler) -> None:
        """The answer is complete: a conversation's next turn starts with it (a plain text answer; a
        template renders reasoning and tool calls of earlier turns its own way)."""
        plain = assembler.text and not assembler.reasoning and not assembler.has_tool_calls
        if self._job.kind == "chat" and plain:
            self._mirror.answered(self._target, self._job, self._prompts, assembler.text)


class MirrorListener(AttemptListener):
    """The mirror's part in one attempt of a job: a CPU attempt settles the mirror's read of the job before
    it asks for a slot (asking stops the mirror's reads at once) and takes the job from the mirror as it
    starts; a GPU attempt is followed (`Following`), its answer handed over as it grows and whole."""

    def __init__(self, mirror: Mirror, prompts: Callable[[str], Prompts], deliver: bool) -> None:
        self._mirror = mirror
        self._prompts = prompts  # by model name: a stand-in's are not the main model's
        self._deliver = deliver
        self._following: Following | None = None

    async def before_slot(self, job: Job, on_cpu: bool) -> None:
        if on_cpu:
            await self._mirror.settle(job)

    def started(self, job: Job, worker_role: str, on_cpu: bool) -> None:
        if on_cpu:
            self._mirror.taken(job)
        else:
            self._following = self._mirror.follow(job, self._prompts(job.model), self._deliver)

    def delivered(self, job: Job, progress: Progress, piece: Piece) -> None:
        if self._following is not None and piece.output:
            self._following.grew(progress)

    def completed(self, job: Job, progress: Progress) -> None:
        if self._following is not None:
            self._following.finished(progress.assembler)  # a conversation's next turn starts with it


class Mirror:
    """The CPU mirror (module doc). `settings` is read at each decision: a config reload takes effect."""

    def __init__(self, ctx: JobsContext, settings: Callable[[], MirrorSettings], speed: CpuSpeed) -> None:
        self.settings = settings
        self._workers = ctx.workers
        self._slots = slots = ctx.slots
        self._relay = ctx.relay
        self.speed = speed  # the CPU worker's measured speeds, shared with the executor
        self._meter = CpuSpeedMeter(speed)  # the mirror's reads measure how fast the CPU reads a prompt
        self._targets: dict[str, _Target] = {}  # job id -> its target, oldest first
        self._reading: dict[str, tuple[str, asyncio.Task[None]]] = {}  # job id -> (CPU role, its read)
        self._held: dict[str, list[array[int]]] = {}  # CPU role -> sequences it was given, oldest first
        self._tokenizing: set[asyncio.Task[array[int] | None]] = set()  # texts the tokenizer helper reads
        self._first: dict[str, _Target] = {}  # job id -> its target while its prompt is being tokenized
        self._pids: dict[str, int | None] = {}  # CPU role -> the process those sequences went to
        self._wake = asyncio.Event()
        self.read_tokens = 0  # prompt tokens the CPU read for the mirror
        self.preempted = 0  # reads cancelled for real work
        self.skipped = 0  # reads given up (too many waiting, too far behind)
        slots.listen(self._on_slots)

    # ------------------------------------------------------------------------------ what there is to read
    def prompt_speed(self) -> float:
        return policy.cpu_prompt_speed(self.speed.prompt_tokens_per_second, self.speed.tokens_per_second)

    def follow(self, job: Job, prompts: Prompts, streaming: bool) -> Following | None:
        """A GPU attempt of `job` starts: mirror its prompt if the policy finds it worth it."""
        settings = self.settings()
        role = job.worker_role("cpu")
        if not settings.enabled or role is None or job.stand_in_for is not None:
            return None
        case = policy.MirrorCase(
            prompt_tokens=job.prompt_tokens,
            max_tokens=job.max_tokens,
            streaming=streaming,
            tools=bool(job.body.get("tools")),
            prompt_tokens_per_second=self.prompt_speed(),
            min_ms=settings.min_ms,
        )
        if not policy.mirror_reason(case):
            return None
        target = self._targets.get(job.id) or self._first.get(job.id)
        if target is None:
            try:
                target = self._new_target(job, role, prompts)
            except Exception as error:  # the mirror is an extra: a prompt it cannot render is not mirrored
                log.info("job %s not mirrored: its prompt did not render (%r)", job.id, error)
                return None
            if target is None:
                return None
        resumable = streaming and (job.kind != "chat" or not constrained_output(job.body))
        return Following(self, target, prompts, resumable)

    def _new_target(self, job: Job, role: str, prompts: Prompts) -> _Target | None:
        exact: tuple[str, bytes] | None = None
        if job.kind == "chat":
            exact = (first_path(job), self._one_token(worker_fields(job.kind, job.body)))
        elif completion_text(job) is None:
            return None  # a prompt of token ids: nothing the mirror can render
        # Its tokens come from the tokenizer helper: the target is read, and takes its answer, once they
        # are known.
        target = _Target(job.id, job, role, array("i"), 0, exact)
        self._first[job.id] = target
        self._tokenize(self._prompt_tokens(job, prompts), functools.partial(self._first_tokens, target))
        return target

    @staticmethod
    async def _prompt_tokens(job: Job, prompts: Prompts) -> array[int] | None:
        if job.kind == "chat":
            text: str | None = (await prompts.chat_prompt(job.body["messages"], job.body.get("tools")))[0]
        else:
            text = await completion_prompt(job, prompts)
        return None if text is None else array("i", await prompts.tokenize(text))

    def _tokenize(
        self, work: Awaitable[array[int] | None], done: Callable[[asyncio.Task[array[int] | None]], None]
    ) -> None:
        task = asyncio.ensure_future(work)
        self._tokenizing.add(task)
        task.add_done_callback(done)

    def _first_tokens(self, target: _Target, task: asyncio.Task[array[int] | None]) -> None:
        self._tokenizing.discard(task)
        if self._first.get(target.key) is not target:
            return  # the job went to the CPU meanwhile: that reads its prompt itself
        del self._first[target.key]
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.info("job %s not mirrored: its prompt did not tokenize (%r)", target.key, error)
            return
        tokens = task.result()
        if tokens is None:
            return
        target.tokens = tokens
        target.prompt_tokens = len(tokens)
        self._put(target)

    def extend(
        self, target: _Target, job: Job, prompts: Prompts, reasoning: str, text: str, continued_chat: bool
    ) -> None:
        """The job's answer so far (`reasoning`, `text`) goes to the mirror: a replay now would resume it."""
        if self._targets.get(target.key) is not target:
            return  # given up, or the job went to the CPU
        if continued_chat:
            # A thinking model's answer continues as a chat that the worker renders: that request itself.
            path, body = continued_chat_request(job, reasoning, text, 1)
            target.version += 1
            target.exact, target.exact_done = (path, self._one_token(body)), False
            target.updated_at = time.monotonic()
            self._put(target)
            return
        self._retokenize(target, prompts, _joined(completion_prompt(job, prompts), text))

    def answered(self, target: _Target, job: Job, prompts: Prompts, text: str) -> None:
        """The job's whole answer: the conversation as its next turn renders it, the answer as an assistant
        message of its own (the template closes it as it will then)."""
        if self._targets.get(target.key) is not target:
            return
        turn = [*job.body["messages"], {"role": "assistant", "content": text}]
        self._retokenize(target, prompts, _prompt_of(prompts.chat_prompt(turn, job.body.get("tools"))))

    def _retokenize(self, target: _Target, prompts: Prompts, text: Awaitable[str | None]) -> None:
        """The target's tokens anew, for its answer so far or whole (a resume is a completion of exactly
        these), from the tokenizer helper: of a job's texts only the newest is applied."""
        target.version += 1

        async def tokens() -> array[int] | None:
            whole = await text
            return None if whole is None else array("i", await prompts.tokenize(whole))

        self._tokenize(tokens(), functools.partial(self._tokenized, target, target.version))

    def _tokenized(self, target: _Target, version: int, task: asyncio.Task[array[int] | None]) -> None:
        self._tokenizing.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.info("mirror of job %s given up: its answer did not tokenize (%r)", target.key, error)
            self._give_up(target.key, target)
            return
        tokens = task.result()
        if tokens is not None:
            self._retokenized(target, version, tokens)

    def _retokenized(self, target: _Target, version: int, tokens: array[int]) -> None:
        if version != target.version or self._targets.get(target.key) is not target:
            return  # a newer text came meanwhile, or the mirror is done with the job
        target.tokens = tokens
        target.exact = None
        target.updated_at = time.monotonic()
        self._put(target)

    def _put(self, target: _Target) -> None:
        self._targets.pop(target.key, None)
        self._targets[target.key] = target  # newest last
        target.done = self._held_of(target)
        self._let_go_of_final_jobs()
        while len(self._targets) > KEPT:
            oldest = next(iter(self._targets))
            if oldest in self._reading:
                break
            del self._targets[oldest]
        self._wake.set()

    def _let_go_of_final_jobs(self) -> None:
        """Targets whose jobs are final keep only their tokens (_Target.let_go): looked at whenever a target
        comes or changes and at each of the owner's turns (WAKE_SECONDS at most)."""
        for target in self._targets.values():
            if target.job is not None and target.job.final:
                target.let_go()

    async def settle(self, job: Job) -> None:
        """The job is about to be replayed on its CPU worker: a read of it in progress finishes the piece it
        is on (llama-server keeps that in the slot that read it), and no more is read for it. Cancelled, the
        piece would keep that slot busy, and the replay, sent to another slot, would miss what it holds."""
        self._targets.pop(job.id, None)
        self._first.pop(job.id, None)
        reading = self._reading.get(job.id)
        if reading is not None:
            _, pending = await asyncio.wait({reading[1]}, timeout=SETTLE_SECONDS)
            for task in pending:
                task.cancel()

    def taken(self, job: Job) -> None:
        """The job runs on its CPU worker now: that reads its prompt itself."""
        self._targets.pop(job.id, None)
        self._first.pop(job.id, None)
        reading = self._reading.get(job.id)
        if reading is not None:
            reading[1].cancel()

    def held(self, job: Job) -> int:
        """Tokens of the job's prompt that its CPU worker holds, as far as the mirror knows, in the job's own
        count (admission's, which may differ from the rendered prompt's by a token or two)."""
        target = self._targets.get(job.id)
        if target is None:
            return 0
        held = self._held_of(target)
        return job.prompt_tokens if held >= target.prompt_tokens else min(held, job.prompt_tokens)

    @staticmethod
    def _one_token(body: dict[str, Any]) -> bytes:
        body = {k: v for k, v in body.items() if k not in _NOT_FOR_ONE_TOKEN}
        # llama-server still decodes one token for 0: the prompt's read, plus one step.
        body.update(max_tokens=0, stream=True, cache_prompt=True, return_progress=False)
        return json.dumps(body).encode()

    # ------------------------------------------------------------------------------ what the CPU holds
    def _held_of(self, target: _Target) -> int:
        worker = self._workers(target.role)
        pid = worker.pid if worker is not None else None
        if self._pids.get(target.role) != pid:
            self._pids[target.role] = pid
            self._held[target.role] = []  # a new process: its cache is empty
        return max((common_prefix(target.tokens, seen) for seen in self._held[target.role]), default=0)

    def _note_read(self, role: str, tokens: array[int]) -> None:
        held = [seen for seen in self._held.get(role, []) if common_prefix(seen, tokens) < len(seen)]
        held.append(tokens)
        self._held[role] = held[-KEPT:]

    # ------------------------------------------------------------------------------ the owner
    async def run(self) -> None:
        """The owner task: starts the reads that may run now, whenever something changed. Cancelled, it
        cancels the reads it started (none outlives the service)."""
        try:
            while True:
                # Not asyncio.wait_for: on Python 3.11 a cancel that lands as the wake is set is swallowed,
                # and the owner would outlive the service's shutdown.
                with suppress(TimeoutError):
                    async with asyncio.timeout(WAKE_SECONDS):
                        await self._wake.wait()
                self._wake.clear()
                try:
                    self._start_reads()
                except Exception:  # the mirror is an extra: a fault in it must not end it for good
                    log.exception("the CPU mirror failed to start its reads")
        finally:
            for _, task in list(self._reading.values()):
                task.cancel()
            for tokenizing in list(self._tokenizing):
                tokenizing.cancel()

    def _start_reads(self) -> None:
        settings = self.settings()
        if not settings.enabled:
            for _, task in self._reading.values():
                task.cancel()
            self._targets.clear()
            return
        self._let_go_of_final_jobs()
        waiting = [
            policy.MirrorWork(key, target.behind, target.updated_at)
            for key, target in self._targets.items()
            if key not in self._reading
        ]
        keep, drop = policy.mirror_order(waiting, QUEUE_LIMIT, self.prompt_speed())
        for key in drop:
            del self._targets[key]
            self.skipped += 1
        for key in keep:
            target = self._targets[key]
            worker = self._workers(target.role)
            if worker is None or worker.state != "ready" or not worker.base_url:
                continue
            slot = self._slots.try_acquire_background(target.role, settings.slots)
            if slot is None:
                continue
            task = asyncio.create_task(self._read(target, worker, slot), name=f"mirror-{key}")
            self._reading[key] = (target.role, task)
            # Released when the task ends however it ends: a task cancelled before it first ran (real
            # work wanted the slot at once) never runs its own `finally`.
            task.add_done_callback(functools.partial(self._read_ended, key, target.role, slot))

    def _on_slots(self, role: str, wanted: bool) -> None:
        """SlotPool: real work wants a slot on `role` (step aside at once), or a slot was given back."""
        if not wanted:
            self._wake.set()
            return
        for reading_role, task in list(self._reading.values()):
            if reading_role == role and not task.done():
                task.cancel()
                self.preempted += 1

    async def _read(self, target: _Target, worker: Worker, slot: float) -> None:
        key = target.key
        try:
            while self._targets.get(key) is target:
                target.done = self._held_of(target)
                if target.done < len(target.tokens):
                    end = min(
                        target.done + policy.mirror_piece_tokens(self.prompt_speed()), len(target.tokens)
                    )
                    piece = target.tokens[:end]
                    await self._send(worker, COMPLETION_PATH, self._one_token({"prompt": piece.tolist()}))
                    self._note_read(target.role, piece)
                elif target.exact is not None and not target.exact_done:
                    path, body = target.exact
                    await self._send(worker, path, body)
                    target.exact_done = True
                else:
                    return
        except UpstreamError as error:
            # The worker refused or went away: this read is given up (its supervisor sees to the worker).
            log.info("mirror read for job %s given up: %s", key, error)
            self._give_up(key, target)
        except Exception:  # the mirror is an extra: a fault in it is logged, never a job's failure
            log.exception("mirror read for job %s failed", key)
            self._give_up(key, target)

    def _read_ended(self, key: str, role: str, slot: float, task: asyncio.Task[None]) -> None:
        if self._reading.get(key, (None, None))[1] is task:
            del self._reading[key]
        self._slots.release_background(role, slot)
        self._wake.set()

    def _give_up(self, key: str, target: _Target) -> None:
        if self._targets.get(key) is target:
            del self._targets[key]
            self.skipped += 1

    async def _send(self, worker: Worker, path: str, body: bytes) -> None:
        url = (worker.base_url or "") + path
        timings: dict[str, Any] = {}
        stream = self._relay.stream(url, body, worker.request_headers, PIECE_TIMEOUT, PIECE_TIMEOUT)
        async with aclosing(stream) as chunks:
            async for chunk in chunks:
                timings = chunk.obj.get("timings") or timings
        read = self._meter.prompt_read(timings)
        if read is not None:
            self.read_tokens += read

    # ------------------------------------------------------------------------------ status
    def status(self) -> MirrorStatus:
        settings = self.settings()
        live = [
            target for target in self._targets.values() if target.job is not None and not target.job.final
        ]
        covered = sum(1 for target in live if min(target.done, target.prompt_tokens) >= target.prompt_tokens)
        return {
            "enabled": settings.enabled,
            "slots": settings.slots,
            "following": len(live),
            "covered": covered,
            "tokens_behind": sum(target.behind for target in self._targets.values()),
            "reading": len(self._reading),
            "queued": sum(1 for key, t in self._targets.items() if t.behind and key not in self._reading),
            "read_tokens": self.read_tokens,
            "preempted": self.preempted,
            "skipped": self.skipped,
            "prompt_tokens_per_second": round(self.prompt_speed(), 1),
        }


async def _joined(prefix: Awaitable[str | None], text: str) -> str | None:
    base = await prefix
    return None if base is None else base + text


async def _prompt_of(rendered: Awaitable[tuple[str, list[str]]]) -> str | None:
    return (await rendered)[0]
