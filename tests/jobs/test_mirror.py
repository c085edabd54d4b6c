"""The CPU mirror over stand-ins for its effects (fast tier): a scripted relay that answers each mirror
request as llama-server does (one token and its timings), stand-in workers, the real slot pool. What it reads
and in what order, the slot cap, pre-emption by real work, the bounded queue and a stream's answer growing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.jobs.test_executor_effects import StandInWorker
from tests.support.engine_parts import engine_context
from tray_app.contract.events import EventBus
from tray_app.contract.vocabulary import JobState
from tray_app.jobs import mirror as mirror_module
from tray_app.jobs.admission import SlotPool
from tray_app.jobs.assemble import Assembler
from tray_app.jobs.journal import Journal
from tray_app.jobs.mirror import Mirror, MirrorSettings
from tray_app.jobs.progress import Progress
from tray_app.jobs.registry import Job, JobRegistry, new_id
from tray_app.jobs.relay import Chunk, UpstreamError
from tray_app.jobs.worker_port import CpuSpeed

PIECE = 64  # policy.mirror_piece_tokens at the speed these tests record (its least: see SPEED)
SPEED = 64.0  # prompt tokens per second: half a second is 32 tokens, under the least piece


class ChatPrompts:
    """A template that writes each message as <role>content and ends ready for the answer; one token per
    character, so a prefix of the text is a prefix of its tokens, as with a real tokenizer."""

    @staticmethod
    def render(messages: list[dict[str, Any]]) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    @staticmethod
    def ids(text: str) -> list[int]:
        return [ord(character) for character in text]

    async def chat_prompt(self, messages: list[dict[str, Any]], tools: Any = None) -> tuple[str, list[str]]:
        return self.render(messages), []

    async def count_text(self, text: str, *, special: bool = True, add_bos: bool = True) -> int:
        return len(text)

    async def tokenize(self, text: str) -> list[int]:
        return self.ids(text)


@dataclass
class MirrorRelay:
    """Answers each request with one chunk carrying llama-server's timings; `gate`, while set, holds every
    answer until it opens (a piece being read)."""

    sent: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    gate: asyncio.Event | None = None
    open_streams: int = 0
    most_open: int = 0
    closed_early: int = 0
    fail: bool = False

    async def stream(
        self, url: str, body: bytes, headers: dict[str, str], first: float, every: float, sent: Any = None
    ) -> AsyncGenerator[Chunk, None]:
        obj = json.loads(body)
        self.sent.append((url, obj))
        self.open_streams += 1
        self.most_open = max(self.most_open, self.open_streams)
        finished = False
        try:
            if self.fail:
                raise UpstreamError("exited", "the worker went away")
            if self.gate is not None:
                await self.gate.wait()
            read = len(obj["prompt"]) if "prompt" in obj else 1
            timings = {"cache_n": 0, "prompt_n": read, "prompt_ms": read * 1000.0 / SPEED}
            yield Chunk("", {"choices": [{"text": "x", "finish_reason": "length"}], "timings": timings}, 0, 0)
            finished = True
        finally:
            self.open_streams -= 1
            self.closed_early += 0 if finished else 1


def job_for(content: str, *, messages: list[dict[str, Any]] | None = None, **body: Any) -> Job:
    return Job(
        id=new_id("job"),
        request_id="req",
        kind="chat",
        body={"messages": messages or [{"role": "user", "content": content}], "max_tokens": 16, **body},
        stream=True,
        background=False,
        body_hash="",
        idempotency_key=None,
        prompt_tokens=100,
        max_tokens=16,
        deadline=1e12,
    )


@dataclass
class Rig:
    mirror: Mirror
    relay: MirrorRelay
    slots: SlotPool
    workers: dict[str, StandInWorker]
    settings: dict[str, Any]

    def pieces(self) -> list[list[int]]:
        return [body["prompt"] for url, body in self.relay.sent if url.endswith("/v1/completions")]

    def chats(self) -> list[dict[str, Any]]:
        return [body for url, body in self.relay.sent if url.endswith("/v1/chat/completions")]


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    settings: dict[str, Any] = {"min_ms": 0.0}  # every prompt is worth it, unless a test says otherwise
    relay = MirrorRelay()
    slots = SlotPool({"gpu": 2, "cpu": 2}, queue_limit=8)
    workers = {"gpu": StandInWorker("gpu"), "cpu": StandInWorker("cpu", pid=4343)}
    speed = CpuSpeed(prompt_tokens_per_second=SPEED, prompt_samples=1)
    journal = Journal(tmp_path / "journal.sqlite3")
    context = engine_context(JobRegistry(journal, EventBus()), slots, relay, workers.get)
    mirror = Mirror(context, lambda: MirrorSettings(**settings), speed)
    owner = asyncio.create_task(mirror.run())
    yield Rig(mirror, relay, slots, workers, settings)
    owner.cancel()
    await asyncio.gather(owner, return_exceptions=True)
    journal.close()


async def settle(done: Callable[[], bool], what: str) -> None:
    for _ in range(400):
        if done():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_prompt_is_read_in_pieces_then_as_the_replay_sends_it(rig: Rig) -> None:
    job = job_for("x" * 80)
    prompt = ChatPrompts.render(job.body["messages"])
    assert rig.mirror.follow(job, ChatPrompts(), streaming=False) is not None
    await settle(lambda: len(rig.chats()) == 1, "the replay's own request")
    tokens = ChatPrompts.ids(prompt)
    expected = [tokens[:end] for end in range(PIECE, len(tokens), PIECE)] + [tokens]
    assert rig.pieces() == expected  # each piece a prefix one step longer: the cache holds the rest
    chat = rig.chats()[0]
    assert chat["messages"] == job.body["messages"] and chat["max_tokens"] == 0  # one token, the prompt read
    assert rig.mirror.held(job) == job.prompt_tokens  # (capped at the job's own count of its prompt)
    status = rig.mirror.status()
    assert (status["following"], status["covered"], status["tokens_behind"]) == (1, 1, 0)
    assert rig.slots.in_flight("cpu") == 0  # its slot is back


async def test_a_follow_up_turn_reads_only_the_new_part(rig: Rig) -> None:
    first = [{"role": "user", "content": "y" * 120}]
    rig.mirror.follow(job_for("", messages=first), ChatPrompts(), streaming=False)
    await settle(lambda: len(rig.chats()) == 1, "the first turn")
    before = len(rig.pieces())
    follow_up = [*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and?"}]
    rig.mirror.follow(job_for("", messages=follow_up), ChatPrompts(), streaming=False)
    await settle(lambda: len(rig.chats()) == 2, "the follow-up")
    shared = len("<user>" + "y" * 120)
    new_pieces = rig.pieces()[before:]
    assert len(new_pieces) == 1 and len(new_pieces[0]) == len(ChatPrompts.render(follow_up))
    assert rig.relay.sent[-2][1]["prompt"][:shared] == ChatPrompts.ids("<user>" + "y" * 120)


async def test_a_short_prompt_is_not_mirrored_and_the_switch_turns_it_off(rig: Rig) -> None:
    rig.settings["min_ms"] = 10_000.0
    assert rig.mirror.follow(job_for("short"), ChatPrompts(), streaming=False) is None
    rig.settings.update(min_ms=0.0, enabled=False)
    assert rig.mirror.follow(job_for("x" * 500), ChatPrompts(), streaming=False) is None
    await asyncio.sleep(0.02)
    assert rig.relay.sent == []


async def test_real_work_pre_empts_the_mirror_at_once_and_it_resumes_after(rig: Rig) -> None:
    rig.relay.gate = asyncio.Event()
    job = job_for("z" * 200)
    rig.mirror.follow(job, ChatPrompts(), streaming=False)
    await settle(lambda: rig.relay.open_streams == 1, "a piece being read")
    held = await rig.slots.acquire("cpu", "real-job", 1.0)  # a failover's replay wants the CPU worker
    await settle(lambda: rig.relay.open_streams == 0, "the piece to be dropped")
    assert rig.relay.closed_early == 1 and rig.mirror.status()["preempted"] == 1
    rig.relay.gate.set()
    await asyncio.sleep(0.05)
    assert len(rig.relay.sent) == 1  # nothing new while real work holds the worker
    rig.slots.release("cpu", held)
    await settle(lambda: len(rig.chats()) == 1, "the read to finish once the worker is free")


async def test_the_mirror_takes_at_most_its_slots_and_only_a_free_one(rig: Rig) -> None:
    rig.relay.gate = asyncio.Event()
    for letter in "abc":
        rig.mirror.follow(job_for(letter * 100), ChatPrompts(), streaming=False)
    await settle(lambda: rig.relay.open_streams == 1, "one read")
    await asyncio.sleep(0.05)
    assert rig.relay.most_open == 1 and rig.slots.in_flight("cpu") == 1  # cpu.mirror_slots = 1 of 2
    rig.relay.gate.set()
    await settle(lambda: len(rig.chats()) == 3, "all three reads, one at a time")
    assert rig.relay.most_open == 1


async def test_the_newest_conversation_goes_first_and_the_oldest_are_given_up(rig: Rig) -> None:
    rig.relay.gate = asyncio.Event()
    jobs = [job_for(chr(ord("a") + n) * 40) for n in range(mirror_module.QUEUE_LIMIT + 3)]
    rig.mirror.follow(jobs[0], ChatPrompts(), streaming=False)  # read first: nothing else waits yet
    await settle(lambda: rig.relay.open_streams == 1, "the first read")
    for job in jobs[1:]:
        rig.mirror.follow(job, ChatPrompts(), streaming=False)
    rig.relay.gate.set()
    await settle(lambda: rig.mirror.status()["tokens_behind"] == 0, "the queue to empty")
    order = [chat["messages"][0]["content"][0] for chat in rig.chats()]
    newest = [job.body["messages"][0]["content"][0] for job in reversed(jobs[1:])]
    assert order[0] == "a" and order[1:] == newest[: mirror_module.QUEUE_LIMIT]
    assert rig.mirror.status()["skipped"] == 2  # the two oldest never got their turn


async def stream_two_words(rig: Rig, prompts: ChatPrompts) -> Job:
    """A streamed job followed by the mirror, its prompt read, then "The" and " sea" delivered."""
    job = job_for("w" * 40)
    following = rig.mirror.follow(job, prompts, streaming=True)
    assert following is not None
    await settle(lambda: len(rig.chats()) == 1, "the prompt")
    progress = Progress(Assembler("chat"))
    for word in ("The", " sea"):
        progress.delivered_text += word
        following.grew(progress)
    return job


async def test_a_streams_answer_is_read_as_it_grows(rig: Rig) -> None:
    rig.settings.update(every_tokens=2, every_seconds=0.0)
    job = await stream_two_words(rig, ChatPrompts())
    prompt = ChatPrompts.render(job.body["messages"])
    await settle(lambda: rig.pieces()[-1] == ChatPrompts.ids(prompt + "The sea"), "the answer so far")
    assert len(rig.chats()) == 1  # a resume is a completion of exactly those tokens: nothing else to send


class SlowFirstPrompts(ChatPrompts):
    """Counts its tokenizations; the first extension's is answered only once `slow_first` is set (as a
    helper busy with a long text answers later than the short ones after it)."""

    def __init__(self) -> None:
        self.calls = 0
        self.slow_first = asyncio.Event()

    async def tokenize(self, text: str) -> list[int]:
        self.calls += 1
        if self.calls == 2:  # the first extension: still tokenizing when the second is done
            await asyncio.wait_for(self.slow_first.wait(), 5)
        return await super().tokenize(text)


async def test_answers_are_tokenized_asynchronously_and_the_newest_wins(rig: Rig) -> None:
    rig.settings.update(every_tokens=1, every_seconds=0.0)
    prompts = SlowFirstPrompts()
    job = await stream_two_words(rig, prompts)
    prompt = ChatPrompts.render(job.body["messages"])
    newest = ChatPrompts.ids(prompt + "The sea")
    await settle(lambda: rig.pieces()[-1] == newest, "the newest answer")
    prompts.slow_first.set()  # the older text's tokens arrive now: too late, and dropped
    await asyncio.sleep(0.1)
    assert rig.pieces()[-1] == newest and rig.mirror.held(job) == job.prompt_tokens
    assert list(rig.mirror._targets[job.id].tokens) == newest  # what a replay is then read as
    assert prompts.calls >= 3  # the prompt's, then each extension's


class GatedPrompts(ChatPrompts):
    """Tokenizes once `release` is set."""

    def __init__(self) -> None:
        self.asked = 0
        self.release = asyncio.Event()

    async def tokenize(self, text: str) -> list[int]:
        self.asked += 1
        await asyncio.wait_for(self.release.wait(), 5)
        return await super().tokenize(text)


async def test_a_prompt_is_read_once_its_tokens_are_known(rig: Rig) -> None:
    prompts = GatedPrompts()
    job = job_for("x" * 80)
    assert rig.mirror.follow(job, prompts, streaming=False) is not None  # returned while tokenizing
    await asyncio.sleep(0.05)
    assert rig.relay.sent == [] and rig.mirror.held(job) == 0  # nothing to read before its tokens
    prompts.release.set()
    await settle(lambda: len(rig.chats()) == 1, "the replay's own request")
    prompt = ChatPrompts.render(job.body["messages"])
    assert rig.pieces()[-1] == ChatPrompts.ids(prompt)  # the last piece ends with the whole prompt
    assert prompts.asked == 1

    # A job that goes to the CPU while its prompt is tokenized is never read for: the CPU reads it itself.
    taken, late = job_for("y" * 80), GatedPrompts()
    assert rig.mirror.follow(taken, late, streaming=False) is not None
    rig.mirror.taken(taken)
    late.release.set()
    await asyncio.sleep(0.1)
    assert len(rig.relay.sent) == len(rig.pieces()) + 1 and rig.mirror.held(taken) == 0
    assert not any(ord("y") in piece for piece in rig.pieces())


async def test_a_worker_that_refuses_ends_that_read_only(rig: Rig) -> None:
    rig.relay.fail = True
    job = job_for("v" * 64)
    rig.mirror.follow(job, ChatPrompts(), streaming=False)
    await settle(lambda: rig.mirror.status()["skipped"] == 1, "the read to be given up")
    assert rig.mirror.held(job) == 0 and rig.slots.in_flight("cpu") == 0


async def test_a_job_that_goes_to_the_cpu_is_not_read_for_it_any_more(rig: Rig) -> None:
    rig.relay.gate = asyncio.Event()
    job = job_for("u" * 200)
    rig.mirror.follow(job, ChatPrompts(), streaming=False)
    await settle(lambda: rig.relay.open_streams == 1, "a piece being read")
    rig.mirror.taken(job)
    await settle(lambda: rig.relay.open_streams == 0, "the read to stop")
    rig.relay.gate.set()
    await asyncio.sleep(0.05)
    assert len(rig.relay.sent) == 1 and rig.mirror.status()["following"] == 0


async def test_a_replay_lets_the_piece_of_its_own_prompt_finish(rig: Rig) -> None:
    """Cancelled, the piece would keep its slot busy and the replay would miss it in another slot."""
    rig.relay.gate = asyncio.Event()
    job = job_for("t" * 200)
    rig.mirror.follow(job, ChatPrompts(), streaming=False)
    await settle(lambda: rig.relay.open_streams == 1, "a piece being read")
    settling = asyncio.create_task(rig.mirror.settle(job))
    await asyncio.sleep(0.05)
    assert not settling.done()  # the replay waits for the piece...
    rig.relay.gate.set()
    await settling
    assert rig.relay.closed_early == 0 and len(rig.relay.sent) == 1  # ...which finished, and was the last
    assert rig.slots.in_flight("cpu") == 0


async def test_a_finished_answer_is_read_for_the_next_turn(rig: Rig) -> None:
    """While the user reads the answer, the CPU reads it too: the next turn then starts past it."""
    first = [{"role": "user", "content": "s" * 70}]
    following = rig.mirror.follow(job_for("", messages=first), ChatPrompts(), streaming=False)
    assert following is not None
    await settle(lambda: len(rig.chats()) == 1, "the prompt")
    assembler = Assembler("chat")
    assembler.feed({"choices": [{"delta": {"content": "The answer."}, "finish_reason": "stop"}]})
    following.finished(assembler)
    answered = [*first, {"role": "assistant", "content": "The answer."}]
    rendered = ChatPrompts.ids(ChatPrompts.render(answered))  # as the next turn renders it
    await settle(lambda: rig.pieces()[-1] == rendered, "the answer")
    before = len(rig.pieces())
    follow_up = [*answered, {"role": "user", "content": "ok"}]
    rig.mirror.follow(job_for("", messages=follow_up), ChatPrompts(), streaming=False)
    await settle(lambda: len(rig.chats()) == 2, "the follow-up")
    # One piece for the whole follow-up: it started where the answer ended (from the start, it would be
    # two pieces of 64 and the rest).
    assert [len(piece) for piece in rig.pieces()[before:]] == [len(ChatPrompts.render(follow_up))]


async def test_a_final_jobs_target_keeps_its_tokens_and_lets_go_of_the_job(rig: Rig) -> None:
    """Review F14: up to KEPT targets outlive their jobs, each once holding the whole Job (body, result) and,
    for a failed, cancelled or tool-call answer, `exact`: the request re-encoded, as large as the body.
    A final job's target keeps only its token array (the next turn's start), nothing of the request."""
    read = job_for("f" * 80)
    rig.mirror.follow(read, ChatPrompts(), streaming=False)
    await settle(lambda: len(rig.chats()) == 1, "the first job's prompt and request")
    held = await rig.slots.acquire("cpu", "real-job", 1.0)  # real work: the mirror reads nothing meanwhile
    unread = job_for("g" * 80)
    rig.mirror.follow(unread, ChatPrompts(), streaming=False)
    await settle(lambda: unread.id in rig.mirror._targets, "the second target")
    assert rig.mirror._targets[unread.id].exact is not None  # its request, waiting to be read
    read.state, unread.state = JobState.COMPLETED, JobState.FAILED
    rig.mirror._wake.set()  # the owner's next turn (WAKE_SECONDS at most)
    await settle(lambda: all(t.job is None for t in rig.mirror._targets.values()), "the final jobs let go")
    for job in (read, unread):
        target = rig.mirror._targets[job.id]
        assert target.exact is None
        assert list(target.tokens) == ChatPrompts.ids(ChatPrompts.render(job.body["messages"]))
    assert rig.mirror.held(read) == read.prompt_tokens  # what the CPU holds is still known
    assert rig.mirror.status()["following"] == 0
    rig.slots.release("cpu", held)
    await settle(lambda: rig.mirror.status()["tokens_behind"] == 0, "the failed job's prompt to be read")
    assert rig.mirror.held(unread) == unread.prompt_tokens
    assert len(rig.chats()) == 1  # ...but never its request, which no replay will send


async def test_a_finished_answer_is_read_after_its_job_is_final(rig: Rig) -> None:
    first = [{"role": "user", "content": "h" * 70}]
    job = job_for("", messages=first)
    following = rig.mirror.follow(job, ChatPrompts(), streaming=False)
    assert following is not None
    await settle(lambda: len(rig.chats()) == 1, "the prompt")
    job.state = JobState.COMPLETED
    rig.mirror._wake.set()
    await settle(lambda: rig.mirror._targets[job.id].job is None, "the job let go")
    assembler = Assembler("chat")
    assembler.feed({"choices": [{"delta": {"content": "Done."}, "finish_reason": "stop"}]})
    following.finished(assembler)  # the attempt's own job renders the next turn
    answered = [*first, {"role": "assistant", "content": "Done."}]
    rendered = ChatPrompts.ids(ChatPrompts.render(answered))
    await settle(lambda: rig.pieces()[-1] == rendered, "the answer")
    assert rig.mirror._targets[job.id].job is None


class Unrenderable(ChatPrompts):
    """A template that cannot render this request (the worker then says so to the job itself)."""

    async def chat_prompt(self, messages: list[dict[str, Any]], tools: Any = None) -> tuple[str, list[str]]:
        raise ValueError("'dict object' has no attribute 'name'")


async def test_a_prompt_the_router_cannot_render_is_not_mirrored_and_the_job_goes_on(rig: Rig) -> None:
    unrendered = job_for("x" * 100)
    rig.mirror.follow(unrendered, Unrenderable(), streaming=True)
    following = rig.mirror.follow(job := job_for("y" * 100), ChatPrompts(), streaming=True)
    assert following is not None
    await settle(lambda: job.id in rig.mirror._targets, "the readable prompt's target")
    assert unrendered.id not in rig.mirror._targets and unrendered.id not in rig.mirror._first
    assembler = Assembler("chat")
    assembler.feed({"choices": [{"delta": {"content": "Fine."}, "finish_reason": "stop"}]})
    following._prompts = Unrenderable()  # its answer, rendered for the next turn, fails the same way
    following.finished(assembler)
    await settle(lambda: rig.mirror.status()["skipped"] == 1, "the mirror gave the job up")
    assert rig.mirror.held(job) == 0


async def test_the_owner_ends_when_cancelled_as_it_is_woken(rig: Rig) -> None:
    owner = asyncio.create_task(rig.mirror.run())
    await asyncio.sleep(0.01)  # waiting to be woken
    rig.mirror._wake.set()  # something changed, and the service stops in the same step
    owner.cancel()
    done, _ = await asyncio.wait({owner}, timeout=2.0)
    assert done == {owner} and owner.cancelled()
