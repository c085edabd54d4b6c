"""The CPU mirror through real processes: a conversation's earlier turn runs on the GPU while the CPU worker
reads it in the background; the GPU worker is killed (SIGKILL) in the middle of the follow-up turn's stream,
and the CPU's replay finds the prompt in llama-server's cache (its `cache_n`, in the answer's failsoft
object). With `cpu.mirror = false` the same failover reads the prompt from scratch."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.support.helpers import arm, base_settings, client_for, reload_settings, wait_replaced
from tests.support.service import ServiceHandle, module_service
from tests.support.waits import wait_until
from tray_app.drill.conversation import conversation, next_turn

pytestmark = pytest.mark.integration

# Replays always go to the CPU, however slow a busy test machine makes it; one thread each beside the
# simulated GPU.
SETTINGS = base_settings(failover={"auto_approve_seconds": 3600}, cpu={"threads": 1})
KILL_AFTER = 5
FIRST_TURN = 700  # tokens: long enough to be worth mirroring, short enough for the GPU to read in time


svc = module_service(enable_faults=True, settings=SETTINGS)


def stream_turn(client: openai.OpenAI, messages: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """A streamed turn: its text and the failsoft object of its last chunk."""
    text, failsoft = "", {}
    stream = client.chat.completions.create(
        model="default",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=32,
        temperature=0,
        seed=3,
        stream=True,
        extra_body={"ignore_eos": True},  # every answer its whole length: the kill lands mid-stream
    )
    for chunk in stream:
        failsoft = (chunk.model_extra or {}).get("failsoft") or failsoft
        text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
    return text, failsoft


def mirror_caught_up(svc: ServiceHandle) -> dict[str, Any] | None:
    mirror: dict[str, Any] = svc.status()["mirror"]
    return mirror if mirror["tokens_behind"] == 0 and mirror["reading"] == 0 else None


def follow_up_killed_mid_stream(svc: ServiceHandle, seed: int, *, mirrored: bool) -> dict[str, Any]:
    """The first turn on the GPU, the mirror given the user's reading time, then the follow-up turn with the
    GPU worker killed after its 5th token: the follow-up's failsoft object."""
    client = client_for(svc)
    first = conversation(FIRST_TURN, seed)
    answer, failsoft = stream_turn(client, first)
    assert failsoft["device"] == "gpu" and answer
    if mirrored:
        wait_until(lambda: mirror_caught_up(svc), timeout=120, what="the mirror to read the first turn")
    turn = next_turn(first, answer)
    armed = arm(svc, "kill", after_tokens=KILL_AFTER)
    _, failsoft = stream_turn(client, turn)
    wait_replaced(svc, armed["pid"])
    assert (failsoft["worker"], failsoft["attempts"]) == ("cpu", 2), failsoft
    return failsoft


def test_a_follow_up_turn_fails_over_onto_its_mirrored_prompt(svc: ServiceHandle) -> None:
    failsoft = follow_up_killed_mid_stream(svc, seed=11, mirrored=True)
    # llama-server's own answer: of the resumed prompt (the follow-up plus 5 tokens of its answer), its
    # cache held at least the whole first turn, which the mirror read while the user was reading.
    assert failsoft["cpu_cached_tokens"] >= FIRST_TURN, failsoft
    mirror = svc.status()["mirror"]
    assert mirror["enabled"] and mirror["read_tokens"] >= FIRST_TURN


def test_with_the_mirror_off_the_cpu_reads_the_follow_up_from_scratch(svc: ServiceHandle) -> None:
    reload_settings(svc, {**SETTINGS, "cpu": {**SETTINGS["cpu"], "mirror": False}})  # live: no restart
    try:
        read_before = svc.status()["mirror"]["read_tokens"]
        failsoft = follow_up_killed_mid_stream(svc, seed=12, mirrored=False)
        assert failsoft["cpu_cached_tokens"] < 100, failsoft  # at most the system prompt's first words
        status = svc.status()["mirror"]
        assert not status["enabled"] and status["read_tokens"] == read_before
    finally:
        reload_settings(svc, SETTINGS)
