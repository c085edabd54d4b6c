"""`python -m tray_app.worker`: serve /health at once, load the model in a thread, then serve the model."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence

import uvicorn

from tray_app.worker import grammar_guard, stream_errors
from tray_app.worker.app import WorkerApp
from tray_app.worker.args import parse_args
from tray_app.worker.faults import FaultInjector
from tray_app.worker.loader import load_model
from tray_app.worker.parent_watch import guard_parent
from tray_app.worker.state import WorkerState

# Seconds uvicorn lets open streams finish on SIGTERM before it cancels them; the supervisor's own grace
# period (then SIGKILL) is the outer bound.
GRACEFUL_SHUTDOWN_SECONDS = 2


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    guard_parent(args.parent_pid)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    state = WorkerState(args=args, faults=FaultInjector() if args.enable_faults else None)
    stream_errors.install()
    grammar_guard.install()
    config = uvicorn.Config(
        WorkerApp(state),
        host=args.host,
        port=args.port,
        lifespan="off",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
    server = uvicorn.Server(config)

    def stop_serving() -> None:
        server.should_exit = True

    loader = threading.Thread(
        target=load_model, args=(args, state, stop_serving), name="model-load", daemon=True
    )
    loader.start()
    server.run()
    return state.exit_code or (0 if server.started else 1)
