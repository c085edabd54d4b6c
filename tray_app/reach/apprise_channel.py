"""Apprise (the optional `failsoft[apprise]` extra): one library for Gotify, Home Assistant, Telegram,
Matrix, e-mail and a hundred more, each named by a URL. Its actions become links in the text: most of those
services show a link, none of them a button that sends a request back.

Apprise sends synchronously, one service after another, with timeouts of its own per service (or none). So
its sends run on the channels' own threads (BlockingSends; never the default executor, which serves the
journal's flushes and the long prompts' counting), and none is waited for longer than any channel's send
(channels.SEND_TIMEOUT)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from tray_app.reach import channels
from tray_app.reach.channels import ChannelError
from tray_app.reach.message import Message

INSTALL_HINT = "the apprise package is not installed: pip install 'failsoft[apprise]'"
SEND_THREADS = 2  # blocking sends at once, over every channel
SEND_QUEUE = 16  # sends waiting for a thread; beyond that a send fails at once (the threads hang)

T = TypeVar("T")
_Work = tuple[Callable[[], Any], asyncio.AbstractEventLoop, asyncio.Future[Any]]


class BlockingSends:
    """A bounded pool for the channels' blocking sends: at most `threads` at once, each waited for at most
    its timeout. A send that hangs holds one of these threads, never the event loop's default executor;
    the threads are daemons, so one hung in a dead server does not hold up the service's exit either."""

    def __init__(self, threads: int = SEND_THREADS, queued: int = SEND_QUEUE) -> None:
        self._threads = threads
        self._limit = threads + queued  # sends running or waiting for a thread
        self._work: queue.SimpleQueue[_Work] = queue.SimpleQueue()
        self._outstanding = 0  # of those, sends handed over and not yet made or skipped by a thread
        self._started = 0
        self._lock = threading.Lock()

    @property
    def outstanding(self) -> int:
        """Sends handed over and not yet made or skipped: running, or waiting for a thread."""
        return self._outstanding

    async def run(self, call: Callable[[], T], timeout: float) -> T:
        """`call()` on one of the pool's threads; ChannelError when it takes longer than `timeout` seconds
        (its thread is left to it: a thread cannot be stopped) or when too many sends wait already."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        with self._lock:
            if self._outstanding >= self._limit:
                raise ChannelError(
                    f"not sent: the {self._threads} notification threads still hang on earlier sends"
                )
            self._outstanding += 1
            if self._started < self._threads:
                self._started += 1
                threading.Thread(target=self._serve, name="failsoft-notify", daemon=True).start()
        self._work.put((call, loop, done))
        try:
            return await asyncio.wait_for(done, timeout)  # a send still queued then is never made
        except TimeoutError:
            raise ChannelError(f"no answer within {timeout:g} s") from None

    def _serve(self) -> None:
        while True:
            call, loop, done = self._work.get()
            try:
                if done.cancelled():  # timed out while it waited for a thread
                    continue
                try:
                    result = call()
                except BaseException as error:  # handed to the awaiting task, which raises it
                    outcome = _settle(done, error=error)
                else:
                    outcome = _settle(done, result=result)
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
                    loop.call_soon_threadsafe(outcome)
            finally:
                with self._lock:
                    self._outstanding -= 1


def _settle(
    done: asyncio.Future[Any], *, result: Any = None, error: BaseException | None = None
) -> Callable[[], None]:
    """What the loop runs to hand a send's outcome to the task awaiting it (if it still waits)."""

    def settle() -> None:
        if done.done():  # timed out meanwhile
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    return settle


SENDS = BlockingSends()  # shared by every Apprise channel of the process


def text(message: Message) -> str:
    lines = [message.body]
    for action in message.actions:
        verb = "open" if action.method == "GET" else "press"
        lines.append(f"{action.label} ({verb}): {action.url}")
    return "\n".join(lines)


class AppriseChannel:
    def __init__(self, urls: str, sends: BlockingSends | None = None) -> None:
        self.urls = urls
        self._sends = sends or SENDS
        self._apprise: Any = None

    def _instance(self) -> Any:
        if self._apprise is None:
            try:
                module = importlib.import_module("apprise")
            except ImportError:
                raise ChannelError(INSTALL_HINT) from None
            instance = module.Apprise()
            if not instance.add(self.urls):
                raise ChannelError("Apprise does not understand this channel's url (see Apprise's URL list)")
            self._apprise = instance
        return self._apprise

    async def send(self, message: Message) -> None:
        apprise = self._instance()
        level = {"critical": "failure", "warning": "warning"}.get(message.level, "info")

        def notify() -> bool:
            return bool(apprise.notify(body=text(message), title=message.title, notify_type=level))

        try:
            sent = await self._sends.run(notify, channels.SEND_TIMEOUT)
        except ChannelError as error:
            raise ChannelError(f"Apprise: {error}") from None
        if not sent:
            raise ChannelError("Apprise could not deliver the message (its log says why)")
