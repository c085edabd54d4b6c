"""A tool call the client's API writes only once it is whole (Ollama's) is delivered when that line is
written, not when the engine hands its first piece over: a failure in between leaves the Idempotency-Key
free."""

from __future__ import annotations

from tests.jobs.test_executor_effects import (  # noqa: F401  (their fixtures)
    Factory,
    ScriptedRelay,
    chat_chunk,
    journal,
    make_executor,
    new_job,
    run,
)
from tray_app.jobs import policy
from tray_app.jobs.relay import UpstreamError

TOOLS = [{"type": "function", "function": {"name": "get_weather"}}]


async def test_a_held_tool_call_cut_by_a_crash_was_not_delivered(
    make_executor: Factory,  # noqa: F811  (the fixture)
) -> None:
    crash = UpstreamError("exited", "connection dropped")
    executor, registry, _ = make_executor(ScriptedRelay([chat_chunk(tool=True), crash]))
    job = new_job(registry, tools=TOOLS)
    job.holds_tool_calls = True
    outcomes = await run(executor, job)
    assert job.state == "failed" and not job.effects_delivered  # the client never had the call
    assert outcomes  # the stream still ends with the reason


async def test_a_tool_call_streamed_as_it_comes_is_delivered_with_its_first_piece(
    make_executor: Factory,  # noqa: F811  (the fixture)
) -> None:
    crash = UpstreamError("exited", "connection dropped")
    executor, registry, _ = make_executor(ScriptedRelay([chat_chunk(tool=True), crash]))
    job = new_job(registry, tools=TOOLS)
    await run(executor, job)
    assert job.state == "failed" and job.effects_delivered
    assert job.error is not None and job.error.get("code") == policy.EFFECTS_DELIVERED
