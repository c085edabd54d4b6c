"""What every scenario plays with: the service's client, its events and status (`DrillContext`), and how one
answer, its job's record (/v1/jobs/{id}) and the service's events are read into a scenario's record."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tray_app.contract.status import ServiceStatus
from tray_app.drill.bodies import FAULT_REQUEST
from tray_app.drill.client import Answer, EventLog, ServiceClient
from tray_app.drill.peer_pair import PeerSide
from tray_app.drill.records import Expectation, JobTrace, ScenarioRecord, account, answerer, explain

if TYPE_CHECKING:
    from tray_app.drill.rpc_launch import RpcBox  # it plays scenario o with this context


@dataclass
class DrillContext:
    client: ServiceClient
    events: EventLog
    status: ServiceStatus
    # The library settings the service runs with (not in its status): the drill's own service sets them;
    # against --url they are this machine's config, as for the API key. None: not known.
    stand_in_enabled: bool = True
    max_loaded: int | None = None
    # The peer the drill started beside this service (its `[[peers]]`); None: none (scenarios m and n skip).
    peer: PeerSide | None = None
    # The RPC box the drill started beside this service (its `[[peers]] rpc`); None: none (o skips).
    box: RpcBox | None = None
    _reference: dict[str, str] = field(default_factory=dict)

    @property
    def caps(self) -> dict[str, Any]:
        caps: dict[str, Any] = self.status["caps"]
        return caps

    async def refresh(self) -> None:
        self.status = await self.client.status()

    async def trace(self, job_id: str) -> JobTrace:
        """The job once it has ended, with its events (waiting for the final one to come through)."""
        record = await self.client.wait_job_final(job_id)
        await self.events.wait(
            lambda event: (
                event.type == "job_state"
                and event.data.get("job_id") == job_id
                and event.data.get("state") == record["state"]
            ),
            10.0,
            f"the final event of job {job_id}",
        )
        return JobTrace(record, tuple(self.events.for_job(job_id)))

    async def reference_text(self) -> str:
        """The answer to FAULT_REQUEST with no fault: what a replay at temperature 0 should reproduce."""
        if "fault" not in self._reference:
            await self.client.wait_ready()
            answer = await self.client.chat(FAULT_REQUEST)
            self._reference["fault"] = answer.text
        return self._reference["fault"]


async def finish(
    ctx: DrillContext,
    record: ScenarioRecord,
    answer: Answer,
    expectation: Expectation,
    start: float,
    *,
    client_closed: bool = False,
) -> JobTrace | None:
    """Fill a single-job record from the answer, the job's record and its events."""
    trace = await ctx.trace(answer.job_id) if answer.job_id else None
    lost, doubled, note = account(answer, trace, client_closed=client_closed)
    record.lost += lost
    record.doubled += doubled
    if note:
        record.notes.append(note)
    record.expected = expectation.describe()
    record.set_output(answer.text or json.dumps(answer.tool_calls))
    record.connection_survived = None if client_closed else answer.connection_ok
    record.total_seconds = round(answer.ended_at - start, 3)
    record.answered_by = answerer(answer.failsoft)
    if answer.error:
        record.notes.append(f"error to the client: {answer.error.get('code')}: {answer.error.get('message')}")
    if trace is None:
        record.actual = f"no job ({answer.error})"
        return None
    record.job_ids.append(answer.job_id)
    record.final_states.append(trace.state)
    read_trace(record, trace, start)
    route, reason = trace.decision()
    record.actual = f"{route} ({reason or '-'}) -> {trace.state}"
    record.decision_ok = expectation.met_by(route, reason, trace.state)
    attempts = expectation.attempts_problem(trace)
    if attempts:
        record.failed_checks.append(attempts)
    error = trace.first_error()
    resumed = bool(
        record.streamed and error and answer.first_content_at and answer.first_content_at < error[0]
    )
    record.decision_why = explain(
        route, reason, streamed=record.streamed, resumed=resumed, detail=trace.refusal_detail(), caps=ctx.caps
    )
    record.notes += worker_notes(ctx.events, start, max(answer.ended_at, time.time()))
    return trace


async def count_answer(ctx: DrillContext, record: ScenarioRecord, answer: Answer) -> JobTrace | None:
    """One answer into the record's tallies (lost, answered twice, why); its job once it has ended."""
    trace = await ctx.trace(answer.job_id) if answer.job_id else None
    lost, doubled, note = account(answer, trace)
    record.lost += lost
    record.doubled += doubled
    if note:
        record.notes.append(note)
    return trace


def worker_notes(events: EventLog, start: float, end: float) -> list[str]:
    """What the supervisor said about the GPU worker meanwhile: its own failure kind and the restart."""
    notes = []
    for event in events.between(start, end, ("worker_unhealthy", "worker_restarted")):
        if event.data.get("role") != "gpu":
            continue
        if event.type == "worker_unhealthy":
            notes.append(f"GPU worker unhealthy @{event.at - start:.2f}s: {event.data.get('kind')}")
        else:
            notes.append(f"GPU worker restarted @{event.at - start:.2f}s (pid {event.data.get('pid')})")
    return notes


def read_trace(record: ScenarioRecord, trace: JobTrace, start: float) -> None:
    """First error and CPU start (the earliest over the scenario's jobs), relative to the scenario start."""
    error = trace.first_error()
    if error is not None and (record.first_error_at is None or error[0] - start < record.first_error_at):
        record.first_error_at = round(error[0] - start, 3)
        record.first_error_kind, record.first_error_message = error[1], error[2]
    cpu = trace.cpu_started()
    if cpu is not None and (record.cpu_started_at is None or cpu - start < record.cpu_started_at):
        record.cpu_started_at = round(cpu - start, 3)
