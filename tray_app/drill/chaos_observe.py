"""Read what the chaos mix left in the service: its unfinished jobs, the router's slots and queue, and the
record of every job the mix's clients were given (`invariants.Observed`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import httpx

from tray_app.contract.roles import CHAT_ROLES
from tray_app.contract.vocabulary import UNFINISHED_JOB_STATES
from tray_app.drill.chaos_records import Sent
from tray_app.drill.chaos_requests import job_headers
from tray_app.drill.client import ServiceClient
from tray_app.drill.invariants import Observed

# Seconds for what the mix left to end by itself: a dropped client's job, a failover, a worker's restart.
SETTLE = 120.0
READS = 8  # job records read at once


async def _unfinished(http: httpx.AsyncClient) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for state in UNFINISHED_JOB_STATES:
        response = await http.get("/failsoft/jobs", params={"state": state}, timeout=30)
        response.raise_for_status()
        ids = [str(job.get("id")) for job in response.json().get("data") or []]
        if ids:
            found[str(state)] = ids
    return found


def _busy(status: dict[str, Any]) -> dict[str, int]:
    workers: dict[str, Any] = {}
    for group in ("workers", "library_workers", "embedding_workers"):
        workers.update(status.get(group) or {})
    return {role: int(worker.get("in_flight") or 0) for role, worker in workers.items()}


def _not_ready(status: dict[str, Any]) -> dict[str, str]:
    """The chat workers (GPU and CPU) not ready, with their state and why."""
    workers = status.get("workers") or {}
    return {
        role: f"{worker.get('state')}: {worker.get('reason') or '-'}"
        for role in CHAT_ROLES
        if (worker := workers.get(role) or {}).get("state") not in ("ready", "absent")
    }


async def _snapshot(client: ServiceClient) -> Observed:
    status: dict[str, Any] = dict(await client.status())
    return Observed(
        not_ready=_not_ready(status),
        unfinished=await _unfinished(client.http),
        busy={role: count for role, count in _busy(status).items() if count},
        queue_depth=int((status.get("queue") or {}).get("depth") or 0),
        mirror_reading=int((status.get("mirror") or {}).get("reading") or 0),
    )


def settled(observed: Observed) -> bool:
    return not (observed.unfinished or observed.busy or observed.queue_depth or observed.not_ready)


async def _record(client: ServiceClient, sent: Sent, gate: asyncio.Semaphore) -> dict[str, Any] | None:
    async with gate:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            response = await client.http.get(f"/v1/jobs/{sent.job_id}", headers=job_headers(sent), timeout=30)
            if response.status_code == 200:
                record: dict[str, Any] = response.json()
                return record
    return None


async def observe(client: ServiceClient, sents: list[Sent], settle: float = SETTLE) -> Observed:
    """The service once nothing the mix started is left (or `settle` seconds passed: then what is left),
    with the record of each job its clients were given."""
    deadline = time.monotonic() + settle
    observed = await _snapshot(client)
    while not settled(observed) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        observed = await _snapshot(client)
    gate = asyncio.Semaphore(READS)
    readers: dict[str, Sent] = {}
    for sent in sents:  # one request per job, one with the job's token where there is one
        if sent.job_id and (sent.token or sent.job_id not in readers):
            readers[sent.job_id] = sent
    unique = list(readers.values())
    records = await asyncio.gather(*(_record(client, sent, gate) for sent in unique))
    observed.jobs = {sent.job_id: record for sent, record in zip(unique, records, strict=True) if record}
    return observed
