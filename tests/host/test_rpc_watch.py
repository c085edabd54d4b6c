"""The RPC boxes' watch (host.rpc_watch): an idle GPU worker whose connection to a box is gone is restarted
(its start plans without the box); a busy one, one without boxes or one not ready is left alone. Real TCP
connections of this process stand for the worker's to its boxes."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from tray_app.engine.profile import WorkerProfile
from tray_app.host.rpc_watch import RpcWatch, connected


class Worker:
    def __init__(self, rpc: tuple[str, ...], state: str = "ready") -> None:
        self.state, self.pid = state, os.getpid()
        self.running_profile = WorkerProfile(
            role="gpu", model_path=Path("m.gguf"), n_ctx=2048, n_gpu_layers=10, n_threads=2, rpc=rpc
        )
        self.restarted: list[str] = []

    async def restart(self, reason: str) -> bool:
        self.restarted.append(reason)
        return True


async def test_an_idle_worker_whose_box_closed_its_connection_is_restarted_and_a_busy_one_is_not() -> None:
    with (
        socket.create_server(("127.0.0.1", 0)) as kept_box,
        socket.create_server(("127.0.0.1", 0)) as lost_box,
        socket.create_connection(kept_box.getsockname()),
        socket.create_connection(lost_box.getsockname()),
    ):
        kept = f"127.0.0.1:{kept_box.getsockname()[1]}"
        lost = f"127.0.0.1:{lost_box.getsockname()[1]}"
        served, _ = kept_box.accept()
        ended, _ = lost_box.accept()
        assert connected(os.getpid(), kept) and connected(os.getpid(), lost)
        ended.close()  # the box's rpc-server ended: our side of the connection is CLOSE_WAIT now
        assert connected(os.getpid(), kept) and not connected(os.getpid(), lost)
        assert not connected(os.getpid(), "127.0.0.1:1") and not connected(os.getpid(), "no-port")

        worker = Worker((kept, lost))
        busy = {"gpu": 1}
        watch = RpcWatch(lambda: {"gpu": worker}, lambda role: busy.get(role, 0))
        assert await watch.check() is None and worker.restarted == []  # in flight: it fails over if it must
        busy.clear()
        reason = await watch.check()
        assert reason is not None and reason.startswith(f"RPC box {lost} is gone")
        assert worker.restarted == [reason]
        holding = Worker((kept,))
        assert await RpcWatch(lambda: {"gpu": holding}, lambda role: 0).check() is None
        for other in (Worker(()), Worker((lost,), state="starting")):
            assert await RpcWatch(lambda w=other: {"gpu": w}, lambda role: 0).check() is None
            assert other.restarted == []
        served.close()
