"""A process killed mid-stream by the drill (scenarios n and o): the stream's callback that sends SIGKILL
once the answer has reached the point asked for, and what the client had then."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tray_app.drill.client import Answer


@dataclass
class Kill:
    """SIGKILL to `pid` once `due(answer)`: one time only, noting what the client had and when."""

    pid: int
    due: Callable[[Answer], bool]
    delivered: str = ""  # the answer's text at the kill; empty: not killed (the stream ended first)
    at: float = 0.0

    def on_chunk(self) -> Callable[[Answer], Awaitable[bool]]:
        """The stream's stop_after: kills once, never stops the stream itself."""

        async def check(answer: Answer) -> bool:
            if not self.delivered and self.due(answer):
                os.kill(self.pid, signal.SIGKILL)
                self.delivered, self.at = answer.text, time.time()
            return False

        return check
