"""`failsoft status`, `approvals`, `approve`, `reject`, `load`, `unload`, `worker`, `yield` and `resume`: the
tray's view, its approval buttons and its model, worker and GPU menus, for a terminal. Exit status 1 when
the service cannot be reached or refuses any of the asked actions."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from tray_app.console.service_client import ServiceClient, ServiceError
from tray_app.console.status_text import render_pending, render_status
from tray_app.view.pending import pending_jobs
from tray_app.view.state import model_line, worker_line

READY_TIMEOUT_S = 300.0  # a load or restart answers once its worker answers /health


def _show(
    args: argparse.Namespace,
    command: str,
    path: str,
    render: Callable[[Any, str, float], str],
    params: dict[str, str] | None = None,
) -> int:
    """One GET, printed as it came (--json) or in words."""
    client = ServiceClient.from_args(args)
    try:
        body = client.get(path, params)
    except ServiceError as error:
        print(f"failsoft {command}: {error}", file=sys.stderr)
        return 1
    print(json.dumps(body, indent=2) if args.json else render(body, client.base_url, time.time()))
    return 0


def status(args: argparse.Namespace) -> int:
    return _show(args, "status", "/failsoft/status", render_status)


def approvals(args: argparse.Namespace) -> int:
    def render(body: object, _url: str, now: float) -> str:
        return render_pending(pending_jobs(body), now)

    return _show(args, "approvals", "/failsoft/jobs", render, {"state": "awaiting_approval"})


def _approve_all(client: ServiceClient) -> int:
    try:
        approved = client.post("/failsoft/jobs/approve-all").get("approved") or []
    except ServiceError as error:
        print(f"failsoft approve: {error}", file=sys.stderr)
        return 1
    print(
        f"approved {len(approved)} job{'' if len(approved) == 1 else 's'}"
        + "".join(f"\n  {i}" for i in approved)
    )
    return 0


def _act(args: argparse.Namespace, action: str, command: str, done: str) -> int:
    client = ServiceClient.from_args(args)
    failed = 0
    for job_id in args.job_ids:
        try:
            job = client.post(f"/failsoft/jobs/{quote(job_id, safe='')}/{action}")
        except ServiceError as error:
            said = str(error)
            print(f"failsoft {command}: {said if job_id in said else f'{job_id}: {said}'}", file=sys.stderr)
            failed += 1
            continue
        model = f" ({job['model']})" if job.get("model") else ""
        print(f"{job_id}: {done}{model}, now {job.get('state')}")
    return 1 if failed else 0


def approve(args: argparse.Namespace) -> int:
    if args.all == bool(args.job_ids):
        print("failsoft approve: name the jobs to approve, or --all (not both)", file=sys.stderr)
        return 2
    if args.all:
        return _approve_all(ServiceClient.from_args(args))
    if args.stand_in:
        return _act(args, "stand-in", "approve", "answered now by the smaller model on the GPU")
    return _act(args, "approve", "approve", "approved for the CPU")


def reject(args: argparse.Namespace) -> int:
    return _act(args, "reject", "reject", "rejected")


def _wait_and_show(
    args: argparse.Namespace,
    command: str,
    path: str,
    line: Callable[[Any], str],
    body: dict[str, Any] | None = None,
) -> int:
    """One action that answers once its worker is ready, its answer printed as one line."""
    try:
        answer = ServiceClient.from_args(args).post(path, body, timeout=READY_TIMEOUT_S)
    except ServiceError as error:
        print(f"failsoft {command}: {error}", file=sys.stderr)
        return 1
    print(line(answer))
    return 0


def load(args: argparse.Namespace) -> int:
    path = f"/failsoft/models/{quote(args.name, safe='')}/load"
    return _wait_and_show(args, "load", path, model_line, {"device": args.device})


def unload(args: argparse.Namespace) -> int:
    return _wait_and_show(args, "unload", f"/failsoft/models/{quote(args.name, safe='')}/unload", model_line)


def _path_line(answer: dict[str, Any]) -> str:
    """The GPU path after a yield or resume, in words."""
    state = answer.get("state") or "unknown"
    line = f"GPU path: {state}" + (f" ({answer['reason']})" if answer.get("reason") else "")
    waiting = (answer.get("yielded") or {}).get("waiting")
    back = f"\n  back when: {waiting}" if waiting else ""
    return f"{line}{back}\n  Failsoft: {answer.get('action', '')}"


def yield_gpu(args: argparse.Namespace) -> int:
    """Answers once the GPU workers have stopped (their jobs finish first: up to gpu.drain_timeout)."""
    return _wait_and_show(args, "yield", "/failsoft/gpu/yield", _path_line)


def resume_gpu(args: argparse.Namespace) -> int:
    return _wait_and_show(args, "resume", "/failsoft/gpu/resume", _path_line)


def worker(args: argparse.Namespace) -> int:
    path = f"/failsoft/workers/{quote(args.role, safe='')}/{args.action}"
    return _wait_and_show(args, "worker", path, lambda answer: worker_line(args.role, answer))
