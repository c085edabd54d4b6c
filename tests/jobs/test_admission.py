"""Admission: slots per worker, a bounded FIFO wait queue with positions, and token counting."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tray_app.engine.tools import CHATML_TOOLS_TEMPLATE
from tray_app.jobs.admission import QueueFull, QueueTimeout, SlotPool, requested_tokens
from tray_app.tokenizer.counter import TokenCounter


async def test_slots_are_never_exceeded_and_waiters_go_in_order() -> None:
    depths: list[int] = []
    pool = SlotPool({"gpu": 1, "cpu": 1}, queue_limit=5, on_change=depths.append)
    first = await pool.acquire("gpu", "a", timeout=1)
    order: list[str] = []

    async def wait(job: str) -> None:
        acquired = await pool.acquire("gpu", job, timeout=5)
        order.append(job)
        assert pool.in_flight("gpu") == 1
        await asyncio.sleep(0)
        pool.release("gpu", acquired)

    tasks = [asyncio.create_task(wait(job)) for job in ("b", "c", "d")]
    while pool.depth < 3:
        await asyncio.sleep(0)
    assert [pool.position(job) for job in ("b", "c", "d")] == [1, 2, 3]
    assert pool.position("a") is None
    pool.release("gpu", first)
    await asyncio.gather(*tasks)
    assert order == ["b", "c", "d"]
    assert pool.in_flight("gpu") == 0 and pool.depth == 0
    assert max(depths) == 3 and depths[-1] == 0


async def test_full_queue_answers_at_once_with_retry_after() -> None:
    pool = SlotPool({"gpu": 1}, queue_limit=1)
    held = await pool.acquire("gpu", "a", timeout=1)
    waiting = asyncio.create_task(pool.acquire("gpu", "b", timeout=5))
    while pool.depth < 1:
        await asyncio.sleep(0)
    with pytest.raises(QueueFull) as full:
        await pool.acquire("gpu", "c", timeout=5)
    assert full.value.retry_after >= 1
    # Accepted work (a replay) is never turned away by the limit.
    replay = asyncio.create_task(pool.acquire("gpu", "replay", timeout=5, accepted=True))
    while pool.depth < 2:
        await asyncio.sleep(0)
    pool.release("gpu", held)
    pool.release("gpu", await waiting)
    pool.release("gpu", await replay)
    assert pool.in_flight("gpu") == 0


async def test_accepted_work_waiting_does_not_crowd_out_new_requests() -> None:
    """Issue 14: background jobs waiting for a slot were counted against the interactive queue, so a
    batch of /v1/jobs submissions turned every chat request away with 429."""
    pool = SlotPool({"gpu": 1}, queue_limit=2)
    held = await pool.acquire("gpu", "a", timeout=1)
    background = [
        asyncio.create_task(pool.acquire("gpu", f"job-{n}", timeout=5, accepted=True)) for n in range(5)
    ]
    while pool.depth < 5:
        await asyncio.sleep(0)
    assert pool.interactive_depth == 0
    chats = [asyncio.create_task(pool.acquire("gpu", f"chat-{n}", timeout=5)) for n in range(2)]
    while pool.depth < 7:
        await asyncio.sleep(0)
    with pytest.raises(QueueFull) as full:  # the limit counts the two chats waiting, not the five jobs
        await pool.acquire("gpu", "chat-3", timeout=5)
    assert full.value.depth == 2
    pool.release("gpu", held)
    for waiter in [*background, *chats]:
        pool.release("gpu", await waiter)
    assert pool.in_flight("gpu") == 0 and pool.depth == 0


async def test_waiting_is_bounded_in_time() -> None:
    pool = SlotPool({"cpu": 1}, queue_limit=4)
    held = await pool.acquire("cpu", "a", timeout=1)
    with pytest.raises(QueueTimeout):
        await pool.acquire("cpu", "b", timeout=0.05)
    assert pool.depth == 0  # the one that gave up left the line
    pool.release("cpu", held)
    assert pool.in_flight("cpu") == 0


async def test_a_cancelled_waiter_leaves_no_slot_behind() -> None:
    pool = SlotPool({"gpu": 1}, queue_limit=4)
    held = await pool.acquire("gpu", "a", timeout=1)
    waiter = asyncio.create_task(pool.acquire("gpu", "b", timeout=5))
    while pool.depth < 1:
        await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    pool.release("gpu", held)
    assert pool.in_flight("gpu") == 0 and pool.depth == 0


async def test_background_work_takes_only_a_free_worker_and_hears_real_work_coming() -> None:
    """The CPU mirror's slots: never queued, never beside real work, capped, and told to step aside."""
    pool = SlotPool({"cpu": 3}, queue_limit=4)
    heard: list[tuple[str, bool]] = []
    pool.listen(lambda role, wanted: heard.append((role, wanted)))
    first = pool.try_acquire_background("cpu", most=1)
    assert first is not None and pool.try_acquire_background("cpu", most=1) is None  # its cap
    real = await pool.acquire("cpu", "job", timeout=1)
    assert heard == [("cpu", True)]  # the background work is told at once
    pool.release_background("cpu", first)
    assert pool.try_acquire_background("cpu", most=2) is None  # real work in flight: none for background
    assert not pool.idle_for_background("cpu")
    pool.release("cpu", real)
    assert heard[-1] == ("cpu", False) and pool.idle_for_background("cpu")
    again = pool.try_acquire_background("cpu", most=1)
    assert again is not None and pool.in_flight("cpu") == 1


def test_requested_tokens_defaults_to_what_the_context_leaves() -> None:
    assert requested_tokens(100, 50, 1024) == 50
    assert requested_tokens(100, None, 1024) == 924
    assert requested_tokens(2000, None, 1024) == 1


def test_a_prompts_tokens_prefix_those_of_the_prompt_continued(model_path: Path) -> None:
    """What the mirror sends as token ids shares its cache with the text a replay sends later."""
    counter = TokenCounter(model_path)
    prompt = counter.chat_prompt([{"role": "user", "content": "Name three rivers."}])[0]
    tokens = counter.tokenize(prompt)
    assert len(tokens) == counter.count_text(prompt)
    assert counter.tokenize(prompt + "The Nile, the")[: len(tokens)] == tokens


def test_token_counter_uses_the_models_tokenizer_and_template(model_path: Path) -> None:
    counter = TokenCounter(model_path)
    short = counter.count_chat({"messages": [{"role": "user", "content": "Hi"}]})
    longer = counter.count_chat({"messages": [{"role": "user", "content": "Hi " * 100}]})
    assert 3 < short < 60
    assert longer - short >= 90  # each "Hi " is about one token
    prompt, stops = counter.chat_prompt([{"role": "user", "content": "Hi"}])
    assert "Hi" in prompt and prompt.rstrip().endswith("assistant")
    assert stops
    assert counter.count_completion({"prompt": "one two three"}) >= 3
    # Counting by pieces (cached) agrees with tokenizing the whole rendered prompt.
    for messages in (
        [{"role": "user", "content": "Name three colours."}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi " * 50}],
    ):
        assert counter.count_chat({"messages": messages}) == counter.count_text(
            counter.chat_prompt(messages)[0]
        )


def test_a_tool_list_is_counted_as_the_workers_template_renders_it(model_path: Path) -> None:
    # The bundled tool template writes each tool's schema and the instructions for calling it: what
    # llama-server counted for this request (173 tokens), more than twice the schemas' own JSON.
    counter = TokenCounter(model_path, str(CHATML_TOOLS_TEMPLATE))
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    assert counter.count_chat({"messages": messages, "tools": [weather]}) == 173
    for tools in ([weather], [weather, {**weather, "function": {**weather["function"], "name": "get_time"}}]):
        rendered = counter.count_text(counter.chat_prompt(messages, tools)[0])
        assert counter.count_chat({"messages": messages, "tools": tools}) == rendered
    # A template that writes no tools (the model's own, here): llama-server describes them itself, and
    # their JSON stands for that.
    plain = TokenCounter(model_path)
    alone = plain.count_chat({"messages": messages})
    assert plain.count_chat({"messages": messages, "tools": [weather]}) > alone + 30
    # A response format is a grammar for the worker, not prompt text.
    json_object = {"messages": messages, "response_format": {"type": "json_object"}}
    assert counter.count_chat(json_object) == counter.count_chat({"messages": messages})


async def test_a_worker_restarted_with_fewer_slots_gets_no_more_requests_than_it_has() -> None:
    """Review N4: the router kept the old slot count after a worker restarted with a new `--parallel`, so
    ordinary load sent it more requests than it had slots; one waited silently and the worker was killed
    as hung."""
    pool = SlotPool({"gpu": 2}, 8)
    first, second = pool.try_acquire("gpu"), pool.try_acquire("gpu")
    assert first is not None and second is not None
    waiting = asyncio.create_task(pool.acquire("gpu", "job-3", 5.0))
    await asyncio.sleep(0)
    pool.resize("gpu", 1)
    pool.release("gpu", first)  # two in flight on a worker of one slot: this frees none for the waiter
    await asyncio.sleep(0)
    assert not waiting.done() and pool.in_flight("gpu") == 1
    pool.release("gpu", second)
    await asyncio.wait_for(waiting, 1)
    assert pool.in_flight("gpu") == 1 and pool.capacity("gpu") == 1


async def test_more_slots_go_to_those_waiting_at_once() -> None:
    pool = SlotPool({"gpu": 1}, 8)
    assert pool.try_acquire("gpu") is not None
    waiting = asyncio.create_task(pool.acquire("gpu", "job-2", 5.0))
    await asyncio.sleep(0)
    pool.resize("gpu", 2)
    await asyncio.wait_for(waiting, 1)
    assert pool.in_flight("gpu") == 2 and pool.depth == 0
