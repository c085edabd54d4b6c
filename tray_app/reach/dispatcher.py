"""From the service's events to the user's channels: each `[[notify]]` channel gathers the events it is
told about for `coalesce_seconds` (a burst gives one message), holds them through its quiet hours, and
sends on its own task. A failing or slow channel never blocks or fails a job: publishing an event only
queues it, and a channel's errors are counted in /failsoft/status and written to the log.

A channel is sent the events' wire form (`Event.to_dict()`), which holds no prompt text; an approval's
prompt opening (`ApprovalNeeded.prompt_preview`) goes only to a channel with `preview = true`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx

from tray_app.config.notify import NotifyConfig, destination
from tray_app.contract.events import ApprovalNeeded, Event, EventBus
from tray_app.reach import quiet
from tray_app.reach.build import build
from tray_app.reach.capability import Signer
from tray_app.reach.channels import Channel, ChannelError
from tray_app.reach.events import EVENT_NAMES, name_of
from tray_app.reach.message import Message, compose

log = logging.getLogger(__name__)
HELD_MAX = 200  # events one channel holds (quiet hours, a long gather); the oldest go first beyond it
ACTION_PATH = "/ui/act/"
PAGE_PATH = "/ui/"
QUIET_MARGIN = 1.0  # seconds past the end of quiet hours: the clock has surely moved on


def action_url(public_url: str, token: str) -> str:
    return f"{public_url.rstrip('/')}{ACTION_PATH}{quote(token, safe='.-_~')}"


@dataclass
class ChannelState:
    cfg: NotifyConfig
    channel: Channel | None  # None: it could not be built (the error says why)
    pending: list[dict[str, Any]] = field(default_factory=list)
    previews: dict[str, str] = field(default_factory=dict)  # by job id, of pending approvals (preview = true)
    timer: asyncio.TimerHandle | None = None
    sent: int = 0
    failed: int = 0
    dropped: int = 0
    last_sent_at: float | None = None
    last_error: str = ""
    last_error_at: float | None = None

    def status(self) -> dict[str, Any]:
        return {
            "name": self.cfg.name,
            "kind": self.cfg.kind,
            "where": destination(self.cfg),  # its host, never its topic, path or token
            "events": list(self.cfg.events),
            "quiet_hours": self.cfg.quiet_hours,
            "preview": self.cfg.preview,  # whether its approvals quote the prompt
            "sent": self.sent,
            "failed": self.failed,
            "dropped": self.dropped,
            "pending": len(self.pending),
            "last_sent_at": self.last_sent_at,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
        }


class Dispatcher:
    """Owned by the service for one run: `start()` on its loop, `stop()` at the end."""

    def __init__(
        self,
        bus: EventBus,
        channels: Callable[[], list[NotifyConfig]],
        public_url: Callable[[], str],
        signer: Signer,
        *,
        now: Callable[[], datetime] = datetime.now,
    ) -> None:
        self.bus = bus
        self._configs = channels  # read at each event: a config reload takes effect at once
        self._public_url = public_url
        self.signer = signer
        self._now = now
        self._states: dict[str, ChannelState] = {}
        self._built_from: list[NotifyConfig] | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._remove: Callable[[], None] | None = None
        self._client: httpx.AsyncClient | None = None

    # --------------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._client = httpx.AsyncClient(follow_redirects=False)
        self._remove = self.bus.add_listener(self._listener)
        self._sync()

    async def stop(self) -> None:
        if self._remove is not None:
            self._remove()
        for state in self._states.values():
            if state.timer is not None:
                state.timer.cancel()
        if self._sending:  # messages already on their way get their own timeout, no more
            await asyncio.wait(self._sending, timeout=2.0)
            for task in self._sending:
                task.cancel()
        if self._client is not None:
            await self._client.aclose()

    def status(self) -> list[dict[str, Any]]:
        return [state.status() for state in self._states.values()]

    # ------------------------------------------------------------------------------------ events
    def _listener(self, event: Event) -> None:
        """On the publisher's thread: nothing but a hand-over to the loop."""
        loop = self._loop
        # By type first: most events (a job's states, the queue) are never a message, and this runs on
        # the publisher's path.
        if loop is None or loop.is_closed() or (event.type not in EVENT_NAMES and event.type != "gpu_path"):
            return
        preview = event.prompt_preview if isinstance(event, ApprovalNeeded) else ""
        with contextlib.suppress(RuntimeError):  # the loop closed in between
            loop.call_soon_threadsafe(self.take, event.to_dict(), preview)

    def take(self, event: dict[str, Any], preview: str = "") -> None:
        """On the loop: queue `event` for each channel that is told about it, and start its gather;
        `preview` (an approval's prompt opening) only for the channels with `preview = true`."""
        name = name_of(event)
        job = str(event.get("job_id") or "")
        for state in self._sync():
            if name not in state.cfg.events:
                continue
            state.pending.append(event)
            if preview and job and state.cfg.preview:
                state.previews[job] = preview
            if len(state.pending) > HELD_MAX:
                dropped = state.pending.pop(0)
                if dropped.get("type") == "approval_needed":
                    state.previews.pop(str(dropped.get("job_id") or ""), None)
                state.dropped += 1
            if state.timer is None:
                self._schedule(state, state.cfg.coalesce_seconds)

    def _sync(self) -> list[ChannelState]:
        """The channels of the config now (rebuilt when it changed; counts kept by name)."""
        configs = self._configs()
        if configs is not self._built_from and self._client is not None:
            fresh: dict[str, ChannelState] = {}
            for cfg in configs:
                old = self._states.get(cfg.name)
                if old is not None and old.cfg == cfg:
                    fresh[cfg.name] = old
                    continue
                state = ChannelState(cfg, None)
                try:
                    state.channel = build(cfg, self._client)
                except ChannelError as error:
                    self._failed(state, str(error))
                fresh[cfg.name] = state
            for name, old in self._states.items():
                if name not in fresh and old.timer is not None:
                    old.timer.cancel()
            self._states, self._built_from = fresh, configs
        return list(self._states.values())

    def _schedule(self, state: ChannelState, delay: float) -> None:
        assert self._loop is not None
        state.timer = self._loop.call_later(max(delay, 0.0), self._flush, state)

    def _flush(self, state: ChannelState) -> None:
        state.timer = None
        if not state.pending or self._states.get(state.cfg.name) is not state:
            return
        held = quiet.seconds_until_end(state.cfg.quiet_hours, self._now())
        if held > 0:
            self._schedule(state, held + QUIET_MARGIN)  # one message when quiet hours end
            return
        events, state.pending = state.pending, []
        previews, state.previews = state.previews, {}
        message = compose(events, self._links, self._page(), previews)
        if message is None:
            return
        task = asyncio.get_running_loop().create_task(self._send(state, message))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, state: ChannelState, message: Message) -> None:
        if state.channel is None:
            self._failed(state, state.last_error or "the channel could not be set up")
            return
        try:
            await state.channel.send(message)
        except ChannelError as error:
            self._failed(state, str(error))
        except Exception as error:  # a channel's own bug must not reach the service
            log.exception("notify channel %s failed", state.cfg.name)
            self._failed(state, f"{type(error).__name__}: {error}")
        else:
            state.sent += 1
            state.last_sent_at = time.time()

    def _failed(self, state: ChannelState, error: str) -> None:
        state.failed += 1
        state.last_error, state.last_error_at = error, time.time()
        log.warning("notify channel %s (%s): %s", state.cfg.name, state.cfg.kind, error)

    # ------------------------------------------------------------------------------------- links
    def _links(self, job_id: str) -> dict[str, str] | None:
        base = self._public_url()
        if not base:
            return None
        return {
            decision: action_url(base, self.signer.link_token(job_id, decision))
            for decision in ("approve", "reject")
        }

    def _page(self) -> str | None:
        base = self._public_url()
        return base.rstrip("/") + PAGE_PATH if base else None
