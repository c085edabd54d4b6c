"""Admission control: count a request's tokens with the model's own tokenizer, and bound how many requests
run on each worker and how many wait (FIFO, with known positions; a full queue answers at once)."""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tray_app.engine.llama_log import capture_llama_log
from tray_app.engine.tools import workers_template
from tray_app.jobs import grammar_check
from tray_app.jobs.count_cache import CountCache, text_bytes

DEFAULT_CHAT_TEMPLATE_STOP = "<|im_end|>"
# What the cached counts' keys may hold: messages' texts, and role shapes with tool lists (an agent sends the
# same few again and again). Bounded by bytes: a key is as long as the text it counts.
CONTENT_CACHE_BYTES = 32 * 1024 * 1024
FRAMING_CACHE_BYTES = 4 * 1024 * 1024


class TokenCounter:
    """The model's tokenizer and its workers' chat template, loaded once (vocab only: no weights, fast to
    load). The template is the one the workers render (`chat_format` as configured, see
    engine.tools.template_for): a prompt counted or continued here is the prompt the worker saw. A built-in
    llama.cpp template named in the config has no Jinja text here: the model's own stands in for it."""

    def __init__(self, model_path: Path, chat_format: str = "") -> None:
        # Imported here so the pure parts of this module load without the native library.
        import llama_cpp
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        # Captured, not printed: a vocab-only load warns that its 512-token context exceeds the model's
        # training context (unknown without the weights: 0); a load that fails says why in the error.
        with capture_llama_log() as load_log:
            try:
                self._llama = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)
            except ValueError as error:
                said = " ".join(load_log.text.split())[-400:]
                raise ValueError(f"{error}: {said}" if said else str(error)) from None
        self._llama_cpp = llama_cpp
        self._vocab = self._llama._model.vocab
        self._framing_cache: CountCache[tuple[tuple[str, ...], str]] = CountCache(
            FRAMING_CACHE_BYTES, _framing_bytes
        )
        self._content_cache: CountCache[str] = CountCache(CONTENT_CACHE_BYTES, text_bytes)
        metadata: dict[str, str] = self._llama.metadata
        template = workers_template(metadata.get("tokenizer.chat_template") or "", chat_format)
        self._formatter: Jinja2ChatFormatter | None = None
        if template:
            vocab = self._llama
            eos = vocab._model.token_get_text(vocab.token_eos()) if vocab.token_eos() != -1 else ""
            bos = vocab._model.token_get_text(vocab.token_bos()) if vocab.token_bos() != -1 else ""
            self._formatter = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)

    def grammar_error(self, grammar: str) -> str | None:
        """None when llama.cpp's parser accepts this GBNF grammar; otherwise what it said."""
        return grammar_check.grammar_error(self._vocab, grammar)

    def count_text(self, text: str, *, special: bool = True, add_bos: bool = True) -> int:
        data = text.encode("utf-8")
        capacity = len(data) + 8  # never more tokens than bytes, plus BOS/EOS
        buffer = (self._llama_cpp.llama_token * capacity)()
        count = self._llama_cpp.llama_tokenize(
            self._vocab, data, len(data), buffer, capacity, add_bos, special
        )
        return abs(int(count))

    def tokenize(self, text: str) -> list[int]:
        """`text`'s tokens as llama-server makes them of a prompt string (start token, special tokens
        parsed): a prefix of them sent as token ids shares its cache with the string sent later."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buffer = (self._llama_cpp.llama_token * capacity)()
        count = self._llama_cpp.llama_tokenize(self._vocab, data, len(data), buffer, capacity, True, True)
        return list(buffer[: max(int(count), 0)])

    def _framing(self, roles: tuple[str, ...], tools: Any = None) -> int:
        """Tokens the chat template adds around messages with these roles, and the tools it renders
        (cached: the same few shapes and tool lists recur), counted by rendering it once with empty
        messages."""
        key = (roles, json.dumps(tools) if tools else "")
        cached = self._framing_cache.get(key)
        if cached is None:
            empty = [{"role": role, "content": ""} for role in roles]
            prompt, _ = self.chat_prompt(empty, tools)
            cached = self.count_text(prompt)
            if tools and prompt == self.chat_prompt(empty)[0]:
                # A template that does not write tools: llama-server describes them itself, in JSON.
                cached += self._content_tokens(json.dumps(tools))
            self._framing_cache.put(key, cached)
        return cached

    def _content_tokens(self, text: str) -> int:
        """Tokens of one message's text; cached, since a conversation resends its earlier turns."""
        cached = self._content_cache.get(text)
        if cached is None:
            cached = self.count_text(text, special=False, add_bos=False)
            self._content_cache.put(text, cached)
        return cached

    def chat_prompt(self, messages: list[dict[str, Any]], tools: Any = None) -> tuple[str, list[str]]:
        """The prompt the worker's template makes of these messages (and `tools`, where the template
        renders them), ready for the answer, and its stops."""
        if self._formatter is None:
            text = "".join(f"<|im_start|>{m.get('role')}\n{_text(m)}<|im_end|>\n" for m in messages)
            return text + "<|im_start|>assistant\n", [DEFAULT_CHAT_TEMPLATE_STOP]
        plain: Any = [{**m, "content": _text(m)} for m in messages]
        result = self._formatter(messages=plain, tools=tools or None)
        stops = result.stop if isinstance(result.stop, list) else [result.stop] if result.stop else []
        return result.prompt, stops

    def count_chat(self, body: dict[str, Any]) -> int:
        """The prompt's tokens: the template's framing for these roles and tools plus each message's own
        tokens. Counting the pieces (cached) instead of the rendered whole keeps admission well under a
        millisecond; a merge across a piece boundary can make it differ from the exact count by a token."""
        messages = body["messages"]
        tools = body.get("tools")
        total = self._framing(tuple(str(m.get("role")) for m in messages), tools if self._formatter else None)
        total += sum(self._content_tokens(_text(m)) for m in messages)
        # What the template does not render: the tools without a template here, a forced tool choice (its
        # call's opening, see engine.tools), old-style functions. Their JSON size is a fair token estimate.
        # A response format becomes a grammar, not prompt text.
        rendered = ("tools",) if self._formatter else ()
        for name in ("tools", "functions", "tool_choice"):
            if body.get(name) is not None and name not in rendered:
                total += self._content_tokens(json.dumps(body[name]))
        return total

    @property
    def cached_bytes(self) -> int:
        """What the cached counts' keys hold, in bytes (at most CONTENT_CACHE_BYTES + FRAMING_CACHE_BYTES)."""
        return self._content_cache.held_bytes + self._framing_cache.held_bytes

    def count_completion(self, body: dict[str, Any]) -> int:
        prompt = body["prompt"]
        return self.count_text(prompt if isinstance(prompt, str) else "".join(prompt))


def _framing_bytes(key: tuple[tuple[str, ...], str]) -> int:
    roles, tools = key
    return sys.getsizeof(roles) + sum(sys.getsizeof(role) for role in roles) + sys.getsizeof(tools)


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    if content is None and message.get("tool_calls"):
        return json.dumps(message["tool_calls"])
    return content or ""


def requested_tokens(prompt_tokens: int, max_tokens: int | None, n_ctx_per_seq: int) -> int:
    """The generation budget a request claims: its max_tokens, else whatever the context leaves."""
    if max_tokens is not None:
        return max_tokens
    return max(n_ctx_per_seq - prompt_tokens, 1)


class QueueFull(Exception):
    def __init__(self, depth: int, retry_after: int) -> None:
        super().__init__(f"the wait queue is full ({depth} waiting)")
        self.depth = depth
        self.retry_after = retry_after


class QueueTimeout(Exception):
    def __init__(self, waited: float, retry_after: int) -> None:
        super().__init__(f"waited {waited:.1f}s for a free slot")
        self.retry_after = retry_after


@dataclass
class _Waiter:
    job_id: str
    future: asyncio.Future[None]
    accepted: bool = False  # accepted work (a replay, a background job): not counted against the limit


@dataclass
class _Worker:
    capacity: int
    in_flight: int = 0
    background: int = 0  # of in_flight: held by background work (the CPU mirror), which real work pre-empts
    waiters: deque[_Waiter] = field(default_factory=deque)
    seconds_per_job: float = 1.0  # moving average, for Retry-After

    @property
    def real_work(self) -> bool:
        """Requests in flight or waiting that are not background work."""
        return self.in_flight > self.background or bool(self.waiters)


# listener(role, wanted): True when real work asks for a slot on `role` (background work there steps aside
# at once), False when a slot on `role` was given back.
SlotListener = Callable[[str, bool], None]


class SlotPool:
    """At most `capacity` requests in flight per worker; the rest wait in FIFO order, up to `queue_limit`
    waiting in all. Replays of accepted work (`accepted=True`) are never turned away by the limit.
    Background work (`try_acquire_background`) only takes a slot of a worker with no real work, and its
    listeners hear when real work wants one."""

    def __init__(
        self,
        capacities: dict[str, int],
        queue_limit: int,
        on_change: Callable[[int], None] | None = None,
    ) -> None:
        self._workers = {role: _Worker(max(capacity, 1)) for role, capacity in capacities.items()}
        self.queue_limit = queue_limit
        self._on_change = on_change
        self._listeners: list[SlotListener] = []

    def listen(self, listener: SlotListener) -> None:
        self._listeners.append(listener)

    def _tell(self, role: str, wanted: bool) -> None:
        for listener in self._listeners:
            listener(role, wanted)

    @property
    def depth(self) -> int:
        return sum(len(worker.waiters) for worker in self._workers.values())

    @property
    def interactive_depth(self) -> int:
        """Waiting requests the limit counts: accepted work waits too, but never crowds out new requests."""
        return sum(not w.accepted for worker in self._workers.values() for w in worker.waiters)

    def in_flight(self, role: str) -> int:
        return self._workers[role].in_flight

    def capacity(self, role: str) -> int:
        return self._workers[role].capacity

    @property
    def roles(self) -> frozenset[str]:
        return frozenset(self._workers)

    def position(self, job_id: str) -> int | None:
        """1-based place in its worker's line, or None when not waiting."""
        for worker in self._workers.values():
            for index, waiter in enumerate(worker.waiters):
                if waiter.job_id == job_id:
                    return index + 1
        return None

    def retry_after(self, role: str) -> int:
        worker = self._workers[role]
        waiting = len(worker.waiters) + worker.in_flight
        return max(1, math.ceil(waiting * worker.seconds_per_job / worker.capacity))

    def try_acquire(self, role: str) -> float | None:
        """A slot on `role` if one is free and nobody waits for it (the acquisition time, for `release`);
        None otherwise. Background work on `role` is told to step aside either way."""
        self._tell(role, True)
        worker = self._workers[role]
        if worker.in_flight < worker.capacity and not worker.waiters:
            worker.in_flight += 1
            return time.monotonic()
        return None

    def try_acquire_background(self, role: str, most: int) -> float | None:
        """A slot on `role` for background work: only while the worker has no real work in flight or
        waiting, a slot is free, and background work holds fewer than `most`; never queued."""
        worker = self._workers.get(role)
        if worker is None or worker.real_work or worker.background >= most:
            return None
        if worker.in_flight >= worker.capacity:
            return None
        worker.in_flight += 1
        worker.background += 1
        return time.monotonic()

    def release_background(self, role: str, acquired_at: float) -> None:
        worker = self._workers[role]
        worker.background = max(worker.background - 1, 0)
        self.release(role, acquired_at, record=False)  # its time says nothing of a request's

    def idle_for_background(self, role: str) -> bool:
        """Whether `role` has no real work in flight or waiting."""
        worker = self._workers.get(role)
        return worker is not None and not worker.real_work

    async def acquire(self, role: str, job_id: str, timeout: float, *, accepted: bool = False) -> float:
        """Wait for a slot on `role`; returns the acquisition time (pass it to `release`)."""
        worker = self._workers[role]
        held = self.try_acquire(role)
        if held is not None:
            return held
        if not accepted and self.interactive_depth >= self.queue_limit:
            raise QueueFull(self.interactive_depth, self.retry_after(role))
        waiter = _Waiter(job_id, asyncio.get_running_loop().create_future(), accepted)
        worker.waiters.append(waiter)
        self._changed()
        started = time.monotonic()
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), timeout)
        except (TimeoutError, asyncio.CancelledError) as error:
            if waiter in worker.waiters:
                worker.waiters.remove(waiter)
                self._changed()
            elif waiter.future.done():
                # The slot was handed over just as we gave up: pass it on.
                self.release(role, time.monotonic(), record=False)
            if isinstance(error, TimeoutError):
                raise QueueTimeout(time.monotonic() - started, self.retry_after(role)) from None
            raise
        return time.monotonic()

    def resize(self, role: str, capacity: int) -> None:
        """The worker `role` now serves `capacity` requests at once (it restarted with another plan): more
        room goes to those waiting at once; less takes effect as requests in flight finish."""
        worker = self._workers.get(role)
        if worker is None:
            return
        worker.capacity = max(capacity, 1)
        while worker.in_flight < worker.capacity and worker.waiters:
            waiter = worker.waiters.popleft()
            if not waiter.future.done():
                worker.in_flight += 1
                waiter.future.set_result(None)
        self._changed()

    def release(self, role: str, acquired_at: float, *, record: bool = True) -> None:
        worker = self._workers[role]
        if record:
            elapsed = time.monotonic() - acquired_at
            worker.seconds_per_job = 0.8 * worker.seconds_per_job + 0.2 * elapsed
        while worker.waiters and worker.in_flight <= worker.capacity:
            waiter = worker.waiters.popleft()
            if not waiter.future.done():
                waiter.future.set_result(None)  # the slot passes straight to the next in line
                self._changed()
                return
        worker.in_flight -= 1
        self._changed()
        self._tell(role, False)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.depth)
