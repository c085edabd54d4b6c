"""The service runs on uvloop where it is installed (a dependency on Linux): the router's overhead depends
on it."""

from __future__ import annotations

import asyncio

import uvloop

from tray_app.host import event_loop


def test_the_service_loop_is_uvloop() -> None:
    async def running_loop() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    assert isinstance(event_loop.run(running_loop()), uvloop.Loop)
