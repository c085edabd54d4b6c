"""A stand-in service process for the orphan test: supervises both workers, prints their pids, then waits.

Run as `python supervisor_child.py MODEL LOG_DIR`; the test SIGKILLs this process and checks that the
workers die with it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from tray_app.config import SupervisorConfig
from tray_app.contract.events import EventBus
from tray_app.engine.profile import WorkerProfile
from tray_app.supervisor import WorkerSupervisor


async def main(model: Path, log_dir: Path) -> None:
    bus = EventBus()
    settings = SupervisorConfig(health_interval=0.5)
    supervisors = [
        WorkerSupervisor(
            WorkerProfile(role=role, model_path=model, n_ctx=256, n_gpu_layers=0, n_threads=1),
            bus,
            settings,
            log_dir=log_dir,
        )
        for role in ("gpu", "cpu")
    ]
    ready = await asyncio.gather(*(supervisor.start() for supervisor in supervisors))
    sys.stdout.write(json.dumps({"ready": ready, "pids": [s.pid for s in supervisors]}) + "\n")
    sys.stdout.flush()
    await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2])))
