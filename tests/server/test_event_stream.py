"""The streamed response's writer: what the job writes before the status line goes out in one write after
it, what it writes later goes out at once, and the response ends exactly once."""

from __future__ import annotations

import asyncio
from typing import Any

from tray_app.server.event_stream import KEEPALIVE, EventStreamResponse, Writer


class Client:
    """The ASGI side: records what is sent; `receive` waits until told the client went away."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.gone = asyncio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    def bodies(self) -> list[tuple[bytes, bool]]:
        return [(m["body"], m["more_body"]) for m in self.sent if m["type"] == "http.response.body"]


def respond(writer: Writer, client: Client, events: list[str]) -> asyncio.Task[None]:
    response = EventStreamResponse(
        writer, {"X-Failsoft-Job": "job-1"}, lambda: events.append("disconnect"), lambda: events.append("end")
    )
    return asyncio.create_task(response({"type": "http"}, client.receive, client.send))


async def test_pieces_written_before_the_start_go_out_together_then_each_at_once() -> None:
    writer, client, events = Writer(), Client(), []
    assert await writer.write(b"a") is False  # kept for the first write: not sent yet
    await writer.write(b"b")
    task = respond(writer, client, events)
    for _ in range(3):
        await asyncio.sleep(0)
    assert client.sent[0]["type"] == "http.response.start"
    assert (b"x-failsoft-job", b"job-1") in client.sent[0]["headers"]
    assert client.bodies() == [(b"ab", True)]
    assert await writer.write(b"c") is True
    assert client.bodies()[-1] == (b"c", True)  # sent by the write itself, not later
    await writer.write(b"end", last=True)
    writer.close()
    await task
    assert client.bodies() == [(b"ab", True), (b"c", True), (b"end", False)]
    assert events == ["end"]


async def test_a_piece_kept_for_the_status_line_is_reported_when_it_went_out() -> None:
    # The router times a stream's first token when it reaches the client, also one that came before the
    # response started: then it goes out with the status line, and only then is it told.
    writer, client, events = Writer(), Client(), []
    sent_when_told: list[list[tuple[bytes, bool]]] = []
    assert await writer.write(b"first") is False
    writer.when_pending_sent(lambda: sent_when_told.append(client.bodies()))
    assert sent_when_told == []
    task = respond(writer, client, events)
    for _ in range(3):
        await asyncio.sleep(0)
    assert sent_when_told == [[(b"first", True)]]
    await writer.write(b"end", last=True)
    writer.close()
    await task
    assert len(sent_when_told) == 1  # once


async def test_a_job_that_ended_before_the_start_is_sent_in_one_final_write() -> None:
    writer, client, events = Writer(), Client(), []
    await writer.write(b"error")
    writer.close()
    await respond(writer, client, events)
    assert client.bodies() == [(b"error", False)]


async def test_a_stream_closed_without_a_last_piece_still_ends_once() -> None:
    writer, client, events = Writer(), Client(), []
    task = respond(writer, client, events)
    for _ in range(3):
        await asyncio.sleep(0)
    await writer.write(b"a")
    writer.close()
    await task
    await writer.write(b"late")  # the job's task is over: nothing reaches the finished response
    assert client.bodies() == [(b"a", True), (b"", False)]


async def test_a_client_that_goes_away_is_reported() -> None:
    writer, client, events = Writer(), Client(), []
    task = respond(writer, client, events)
    client.gone.set()
    for _ in range(3):
        await asyncio.sleep(0)
    assert events == ["disconnect"]
    writer.close()
    await task
    assert events == ["disconnect", "end"]


async def test_a_held_piece_goes_out_with_the_next_one_or_the_end() -> None:
    writer, client, events = Writer(), Client(), []
    task = respond(writer, client, events)
    for _ in range(3):
        await asyncio.sleep(0)
    assert await writer.write(b"role", hold=True) is False
    assert client.bodies() == []  # nothing the client waits for: no write of its own
    assert await writer.write(b"token") is True
    await writer.write(b"finish", hold=True)
    writer.close()
    await task
    assert client.bodies() == [(b"roletoken", True), (b"finish", False)]


async def test_a_silent_stream_gets_keep_alive_comments_and_a_busy_one_none() -> None:
    writer, client, events = Writer(), Client(), []
    response = EventStreamResponse(writer, {}, lambda: None, lambda: events.append("end"), keepalive=0.2)
    task = asyncio.create_task(response({"type": "http"}, client.receive, client.send))
    async with asyncio.timeout(10):  # silent: a job awaiting approval
        while len(client.bodies()) < 2:
            await asyncio.sleep(0.01)
    quiet = len(client.bodies())
    assert client.bodies() == [(KEEPALIVE, True)] * quiet
    for _ in range(25):  # talking in every interval: the keep-alive stays out of the way
        await writer.write(b"data: x\n\n")
        await asyncio.sleep(0.02)
    assert client.bodies()[quiet:] == [(b"data: x\n\n", True)] * 25
    await writer.write(b"data: [DONE]\n\n", last=True)
    writer.close()
    await task
    await asyncio.sleep(0.5)
    assert client.bodies()[-1] == (b"data: [DONE]\n\n", False)  # nothing after the end
    assert events == ["end"]


class StuckClient(Client):
    """A client that stopped reading: after `accepted` body messages, every send waits forever."""

    def __init__(self, accepted: int) -> None:
        super().__init__()
        self.accepted = accepted

    async def send(self, message: dict[str, Any]) -> None:
        bodies = sum(1 for m in self.sent if m["type"] == "http.response.body")
        if message["type"] == "http.response.body" and bodies >= self.accepted:
            await asyncio.Event().wait()  # the transport's buffer is full: this never returns
        self.sent.append(message)


def stalling_response(writer: Writer, client: Client, events: list[str]) -> asyncio.Task[None]:
    response = EventStreamResponse(
        writer,
        {},
        lambda: events.append("disconnect"),
        lambda: events.append("end"),
        stall=0.2,
        on_stall=lambda: events.append("stalled"),
    )
    return asyncio.create_task(response({"type": "http"}, client.receive, client.send))


async def test_a_client_that_stops_reading_is_dropped_and_the_jobs_write_returns() -> None:
    """Review N1: the job's write blocked for as long as the client did not read, holding its slot."""
    writer, client, events = Writer(), StuckClient(accepted=1), []
    task = stalling_response(writer, client, events)
    await asyncio.sleep(0.01)
    await writer.write(b"first")  # read by the client
    job_write = asyncio.create_task(writer.write(b"second"))  # blocks: the client stopped reading
    await asyncio.wait_for(task, 2)  # the response ends by itself once the write was blocked 0.2 s
    assert events == ["stalled", "end"]
    assert job_write.cancelled()  # the job's task is released from its write
    assert client.bodies() == [(b"first", True)]  # nothing more was sent, not even an end
    assert writer.abandoned


async def test_the_responses_own_last_write_is_bounded_too() -> None:
    """The end of the response (sent by the response itself once the job is over) blocks the same way."""
    writer, client, events = Writer(), StuckClient(accepted=0), []
    await writer.write(b"whole answer", last=True)
    writer.close()
    await asyncio.wait_for(stalling_response(writer, client, events), 2)
    assert events == ["stalled", "end"] and client.bodies() == []


async def test_a_slow_but_reading_client_is_not_dropped() -> None:
    writer, client, events = Writer(), Client(), []
    task = stalling_response(writer, client, events)
    for _ in range(5):
        await asyncio.sleep(0.1)  # longer in all than the stall limit, but every write goes through
        await writer.write(b"piece")
    await writer.write(b"end", last=True)
    writer.close()
    await task
    assert events == ["end"] and len(client.bodies()) == 6


class Transport(Client):
    """The server's side of a connection as uvicorn's `send` drives it: a send first waits while the
    transport is paused (its buffer over `limit`), then queues its bytes. `draining`: the client reads what
    is queued; once it stops, the buffer fills and every later send waits. `attempts`: each send's body, in
    the order they were made, whether they went out or are still waiting."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.buffered = 0
        self.writable = asyncio.Event()
        self.writable.set()
        self.draining = True
        self.attempts: list[bytes] = []

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            self.attempts.append(message["body"])
        await self.writable.wait()
        self.sent.append(message)
        if message["type"] == "http.response.body" and not self.draining:
            self.buffered += len(message["body"])
            if self.buffered > self.limit:
                self.writable.clear()  # paused: the client reads nothing

    @property
    def paused(self) -> bool:
        return not self.writable.is_set()


def keepalive_response(
    writer: Writer, transport: Transport, events: list[str], keepalive: float, stall: float
) -> asyncio.Task[None]:
    response = EventStreamResponse(
        writer,
        {},
        lambda: events.append("disconnect"),
        lambda: events.append("end"),
        keepalive=keepalive,
        stall=stall,
        on_stall=lambda: events.append("stalled"),
    )
    return asyncio.create_task(response({"type": "http"}, transport.receive, transport.send))


async def flood_until_blocked(writer: Writer, transport: Transport) -> asyncio.Task[bool]:
    """The job writes piece after piece, as a worker's stream comes, until its write is blocked."""
    while True:
        write = asyncio.create_task(writer.write(b"data: " + b"x" * 1000 + b"\n\n"))
        await asyncio.sleep(0.01)
        if not write.done():
            assert transport.paused
            return write


async def test_keep_alive_comments_do_not_hide_a_client_that_stopped_reading() -> None:
    """Review F1: each comment restamped the stall clock, so with a keep-alive shorter than the stall limit
    a client that stopped reading was never dropped and held its job's slot."""
    writer, transport, events = Writer(), Transport(limit=64 * 1024), []
    task = keepalive_response(writer, transport, events, keepalive=1.0, stall=3.0)
    await asyncio.sleep(1.5)  # a silent start (a long prompt): the client reads, and gets a comment
    assert transport.bodies() == [(KEEPALIVE, True)]
    transport.draining = False  # the client stops reading
    job_write = await flood_until_blocked(writer, transport)
    blocked_at = len(transport.attempts)
    await asyncio.wait_for(task, 20)  # a generous bound: the drop itself comes after 3 to 4 s
    assert events == ["stalled", "end"]
    assert job_write.cancelled()  # the job's task is released from its write, and with it the slot
    assert len(transport.attempts) == blocked_at  # nothing queued behind the blocked write, no comment


async def test_one_comment_waits_for_a_stalled_client_and_the_drop_cancels_the_jobs_write() -> None:
    """A silent job (awaiting approval) whose client stopped reading: one comment waits for the client,
    no more pile up behind it. When the job writes, the stall is measured on that write, and the drop
    releases the job's write, not only the comment's."""
    writer, transport, events = Writer(), Transport(limit=0), []
    task = keepalive_response(writer, transport, events, keepalive=0.2, stall=1.0)
    await asyncio.sleep(0.01)
    transport.draining = False
    await writer.write(b"data: first\n\n")  # queued: the buffer is now over its limit
    assert transport.paused
    await asyncio.sleep(1.5)  # seven keep-alive intervals, longer than the stall limit
    assert transport.attempts[1:] == [KEEPALIVE]  # one comment, waiting for the client
    assert not task.done()  # a waiting comment is no stall: no job output is held up
    job_write = asyncio.create_task(writer.write(b"data: second\n\n"))
    await asyncio.wait_for(task, 20)
    assert events == ["stalled", "end"]
    assert job_write.cancelled()
    assert transport.attempts[1:] == [KEEPALIVE, b"data: second\n\n"]
    assert transport.bodies() == [(b"data: first\n\n", True)]  # nothing more reached the client


async def test_a_comment_never_overtakes_or_joins_a_write_in_progress() -> None:
    """A write that is slow to go out (a client reading slowly) gets no comment queued beside it, and the
    stream goes on once the client reads again."""
    writer, transport, events = Writer(), Transport(limit=0), []
    task = keepalive_response(writer, transport, events, keepalive=0.1, stall=30.0)
    await asyncio.sleep(0.01)
    transport.draining = False
    await writer.write(b"data: a\n\n")
    job_write = asyncio.create_task(writer.write(b"data: b\n\n"))  # waits: the client is slow
    await asyncio.sleep(0.5)
    assert transport.attempts == [b"data: a\n\n", b"data: b\n\n"]  # no comment while it waits
    transport.draining = True
    transport.buffered = 0
    transport.writable.set()  # the client reads again
    assert await job_write is True
    await writer.write(b"data: [DONE]\n\n", last=True)
    writer.close()
    await task
    assert events == ["end"]
    assert transport.bodies()[-1] == (b"data: [DONE]\n\n", False)
