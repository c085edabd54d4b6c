"""The owner's inbox and its "something changed" signal.

Any thread may post (a process watcher, a request on another loop); what is put from the owner's loop keeps
its order, so a command sent right after another is handled after it. Waiters wake on every change and look
again; they never act on a state they read, they ask the owner.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from tray_app.supervisor.messages import Command, Message


class Mailbox:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[Message] | None = None
        self._changed: asyncio.Event | None = None

    def open(self) -> None:
        """A fresh inbox on the running loop, for a new owner task (what the old one held is dropped)."""
        self._loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        self._changed = asyncio.Event()

    async def receive(self, timeout: float | None) -> Message:
        """The next message (TimeoutError once `timeout` seconds passed with none)."""
        assert self._queue is not None
        return await asyncio.wait_for(self._queue.get(), timeout=timeout)

    def put(self, message: Message) -> None:
        """Queue at once, in order with what was put before. Only on the owner's loop, once opened."""
        assert self._queue is not None
        self._queue.put_nowait(message)

    async def send(self, command: Command) -> Any:
        """Queue a command and wait for the owner's answer to it. Only on the owner's loop, once opened."""
        assert self._loop is not None
        command.done = self._loop.create_future()
        self.put(command)
        return await command.done

    def post(self, message: Message) -> None:
        """Queue from any thread, without waiting; dropped when no owner ever ran or its loop is gone."""
        loop, queue = self._loop, self._queue
        if loop is None or queue is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(queue.put_nowait, message)

    @staticmethod
    def reply(command: Command, result: Any) -> None:
        """Answer the command's sender; a future answers once it settles, without holding up the owner."""
        done = command.done
        if done is None or done.done():
            return
        if not isinstance(result, asyncio.Future):
            done.set_result(result)
            return

        def copy(settled: asyncio.Future[Any]) -> None:
            if not done.done():
                done.set_result(settled.result() if not settled.cancelled() else False)

        result.add_done_callback(copy)

    def changed(self) -> None:
        if self._changed is not None:
            # Wake every waiter, then arm a fresh event for the next change.
            self._changed.set()
            self._changed = asyncio.Event()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Whether `predicate` holds within `timeout` seconds, looked at again after every change."""
        deadline = self._clock() + timeout
        while not predicate():
            left = deadline - self._clock()
            if left <= 0 or self._changed is None:
                return False
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=left)
        return True
