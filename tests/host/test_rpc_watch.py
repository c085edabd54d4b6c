"""The RPC boxes' watch (host.rpc_watch): an idle GPU worker whose box does not answer is restarted (its
start plans without the box); a busy one, one without boxes or one not ready is left alone. A real TCP
listener stands for a box that answers."""

from __future__ import annotations

import socket
from pathlib import Path

from tray_app.engine.profile import WorkerProfile
from tray_app.host.rpc_watch import RpcWatch, answers

PROFILE = WorkerProfile(role="gpu", model_path=Path("m.gguf"), n_ctx=2048, n_gpu_layers=10, n_threads=2)


class Worker:
    def __init__(self, rpc: tuple[str, ...], state: str = "ready") -> None:
        self.state = state
        self.running_profile = WorkerProfile(
            **{**PROFILE.to_dict(), "model_path": Path("m.gguf"), "rpc": rpc}
        )
        self.restarted: list[str] = []

    async def restart(self, reason: str) -> bool:
        self.restarted.append(reason)
        return True


def closed_port() -> int:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        return int(unused.getsockname()[1])


async def test_an_idle_worker_whose_box_is_gone_is_restarted_and_a_busy_one_is_not() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listening:
        alive = f"127.0.0.1:{listening.getsockname()[1]}"
        gone = f"127.0.0.1:{closed_port()}"
        assert answers(alive) and not answers(gone) and not answers("no-port")
        worker = Worker((alive, gone))
        busy = {"gpu": 1}
        watch = RpcWatch(lambda: {"gpu": worker}, lambda role: busy.get(role, 0))
        assert await watch.check() is None and worker.restarted == []  # in flight: it fails over if it must
        busy.clear()
        reason = await watch.check()
        assert reason == f"RPC box {gone} does not answer: the GPU worker starts again without it"
        assert worker.restarted == [reason]
        answering = Worker((alive,))
        assert await RpcWatch(lambda: {"gpu": answering}, lambda role: 0).check() is None
        for other in (Worker(()), Worker((gone,), state="starting")):
            assert await RpcWatch(lambda w=other: {"gpu": w}, lambda role: 0).check() is None
            assert other.restarted == []
