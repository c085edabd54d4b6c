"""What a drill scenario records, how a job's record and events are read into it, and the verdict (pure)."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

from tray_app.contract.vocabulary import FINAL_JOB_STATES
from tray_app.drill.client import Answer, Event

# Failure kinds that say the GPU worker itself failed (as opposed to the request being wrong).
WORKER_FAILURE_KINDS = ("oom_decode", "crash_abort", "exited", "killed", "hung", "unavailable")
HEAD_WORDS = 8


@dataclass(frozen=True)
class Expectation:
    """What the service should decide. `reasons` empty: any reason; `final_state` of every job; `attempts`
    the job's attempts as "worker outcome", in order (empty: not checked)."""

    route: str  # gpu, cpu, approval, refused
    reasons: tuple[str, ...] = ()
    final_state: str = "completed"
    attempts: tuple[str, ...] = ()

    def describe(self) -> str:
        reason = "|".join(self.reasons) if self.reasons else "any reason"
        return f"{self.route} ({reason}) -> {self.final_state}"

    def met_by(self, route: str, reason: str, final_state: str) -> bool:
        return (
            route == self.route
            and (not self.reasons or reason in self.reasons)
            and final_state == self.final_state
        )

    def attempts_problem(self, trace: JobTrace) -> str:
        """What is wrong with the job's attempts; empty when they are the expected ones (or not checked)."""
        found = trace.attempt_words()
        if not self.attempts or found == self.attempts:
            return ""
        return f"attempts: {', '.join(found) or 'none'}, expected {', '.join(self.attempts)}"


@dataclass
class ScenarioRecord:
    key: str
    title: str
    streamed: bool
    expected: str = ""
    actual: str = ""
    decision_ok: bool = False
    decision_why: str = ""
    job_ids: list[str] = field(default_factory=list)
    final_states: list[str] = field(default_factory=list)
    first_error_at: float | None = None  # seconds after the scenario started
    first_error_kind: str | None = None
    first_error_message: str | None = None
    cpu_started_at: float | None = None  # seconds after the scenario started
    output_head: str = ""
    output_sha256: str = ""
    same_as_unfaulted: bool | None = None  # the answer equals a run without faults (temperature 0, same seed)
    connection_survived: bool | None = None
    tool_calls_intended: int = 0
    tool_executions: int = 0
    total_seconds: float = 0.0
    lost: int = 0
    doubled: int = 0
    notes: list[str] = field(default_factory=list)
    skipped: str = ""  # why the scenario could not run against this service
    # Who answered: "<model> on GPU|CPU" (", stand-in for <asked>"), one per answer ("; " between them), and
    # who should have (empty: not checked). Checks beyond the route decision that failed (eviction, pids).
    answered_by: str = ""
    expected_answerer: str = ""
    failed_checks: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def set_output(self, text: str) -> None:
        self.output_head = " ".join(text.split()[:HEAD_WORDS])
        self.output_sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def verdict(record: ScenarioRecord) -> list[str]:
    """What went wrong in a scenario, in words; empty when it passed. A skipped scenario has no verdict."""
    if record.skipped:
        return []
    problems = []
    if record.lost:
        problems.append(f"lost {record.lost} job(s)")
    if record.doubled:
        problems.append(f"answered {record.doubled} job(s) twice")
    if record.tool_executions > record.tool_calls_intended:
        problems.append(
            f"repeated a tool: {record.tool_executions} executions for "
            f"{record.tool_calls_intended} intended call(s)"
        )
    if not record.decision_ok:
        problems.append(f"unexpected decision: expected {record.expected}, got {record.actual}")
    if record.expected_answerer and record.answered_by != record.expected_answerer:
        problems.append(f"answered by {record.answered_by or 'nobody'}, expected {record.expected_answerer}")
    problems += record.failed_checks
    return problems


def answerer(failsoft: dict[str, Any] | None) -> str:
    """Who answered, from an answer's failsoft object: "<model> on GPU" (", stand-in for <asked>"), or
    "<model> on peer <name>"."""
    if not failsoft:
        return ""
    if failsoft.get("peer"):
        return f"{failsoft.get('model') or '?'} on peer {failsoft['peer']}"
    device = str(failsoft.get("device") or str(failsoft.get("worker") or "").partition("@")[0])
    described = f"{failsoft.get('model') or '?'} on {device.upper() or '?'}"
    if failsoft.get("stand_in_for"):
        described += f", stand-in for {failsoft['stand_in_for']}"
    return described


@dataclass(frozen=True)
class JobTrace:
    """One job as the service recorded it: its journal entry (attempts) and its events."""

    record: dict[str, Any]
    events: tuple[Event, ...]

    @property
    def state(self) -> str:
        return str(self.record.get("state", "unknown"))

    @property
    def attempts(self) -> list[dict[str, Any]]:
        return list(self.record.get("attempt_log") or [])

    def attempt_words(self) -> tuple[str, ...]:
        """Each attempt as "worker outcome" ("gpu failed", "cpu completed"), in order."""
        return tuple(f"{attempt.get('worker')} {attempt.get('outcome')}" for attempt in self.attempts)

    def first_failure(self) -> dict[str, Any] | None:
        return next((attempt for attempt in self.attempts if attempt.get("outcome") == "failed"), None)

    def first_error(self) -> tuple[float, str, str] | None:
        """(time, kind, message) of the first failed attempt; the kind is the router's failure kind."""
        failed = self.first_failure()
        if failed is None:
            return None
        text = str(failed.get("error") or "")
        kind, _, message = text.partition(":")
        return float(failed.get("ended_at") or 0.0), kind.strip(), message.strip()

    def cpu_started(self) -> float | None:
        cpu = next((attempt for attempt in self.attempts if _on_cpu(str(attempt.get("worker")))), None)
        return float(cpu["started_at"]) if cpu is not None else None

    def completed_attempts(self) -> int:
        return sum(1 for attempt in self.attempts if attempt.get("outcome") == "completed")

    def decision(self) -> tuple[str, str]:
        """The service's last routing decision for this job: (route, reason) from its events."""
        refused = [event for event in self.events if event.type == "fallback_refused"]
        if refused:
            return "refused", str(refused[-1].data.get("reason", ""))
        routes = [event for event in self.events if event.type == "route_decided"]
        if routes:
            return str(routes[-1].data.get("route", "")), str(routes[-1].data.get("reason", ""))
        return "none", ""

    def refusal_detail(self) -> str:
        refused = [event for event in self.events if event.type == "fallback_refused"]
        return str(refused[-1].data.get("detail", "")) if refused else ""


def _on_cpu(worker: str) -> bool:
    """The main model's CPU worker ("cpu") or a library model's ("cpu@name")."""
    return worker.partition("@")[0] == "cpu"


def account(answer: Answer, trace: JobTrace | None, *, client_closed: bool = False) -> tuple[int, int, str]:
    """(lost, doubled, note) for one request. Lost: the job never ended, or the client got neither an answer
    nor a controlled error (unless it closed the connection itself). Doubled: more than one completion in the
    journal, or more than one final answer on the wire."""
    if trace is None:
        if answer.controlled_error:
            return 0, 0, f"refused before a job existed: {answer.error}"
        return 1, 0, f"no job record (HTTP {answer.status}, {answer.transport_error or answer.error})"
    lost = 0
    note = ""
    if trace.state not in FINAL_JOB_STATES:
        lost, note = 1, f"job {trace.record.get('id')} still {trace.state}"
    elif not client_closed and not (answer.answered or answer.controlled_error):
        lost, note = 1, f"job {trace.record.get('id')} is {trace.state} but the client got no answer"
    doubled = 1 if trace.completed_attempts() > 1 or answer.answers_seen() > 1 else 0
    if doubled:
        note = (
            f"job {trace.record.get('id')}: {trace.completed_attempts()} completed attempts, "
            f"{answer.answers_seen()} answers on the wire"
        )
    return lost, doubled, note


def explain(
    route: str, reason: str, *, streamed: bool, resumed: bool, detail: str, caps: dict[str, Any]
) -> str:
    """Why the service decided what it did, in words (from the reason code and the service's caps)."""
    match route:
        case "cpu":
            return _why_on_cpu(reason, streamed=streamed, resumed=resumed, caps=caps)
        case "gpu":
            return "fits the GPU profile: served by the GPU worker"
        case "peer":
            return (
                f"this machine's GPU could not take it ({reason}) and a peer was ready: its GPU answered, "
                "the rung before this machine's CPU"
            )
        case "refused":
            return f"refused ({reason}){': ' + detail if detail else ''}"
        case "approval":
            return f"queued for the user's approval ({reason})"
    return f"{route} ({reason})"


def _why_on_cpu(reason: str, *, streamed: bool, resumed: bool, caps: dict[str, Any]) -> str:
    """A job the CPU served: too long for the GPU from the start, or taken over after the GPU failed."""
    if reason == "exceeds_gpu_profile":
        return (
            f"prompt + max_tokens exceed the GPU profile ({caps.get('n_ctx_per_seq')} tokens per sequence) "
            f"but fit the CPU profile ({caps.get('cpu_n_ctx')}): routed to the CPU at admission"
        )
    if reason not in WORKER_FAILURE_KINDS:
        return f"cpu ({reason})"
    if resumed:
        return (
            f"the GPU attempt failed ({reason}) after text reached the client; stream_after_content = "
            "resume: the CPU continued from the text already sent"
        )
    where = "stream" if streamed else "request"
    return (
        f"the GPU attempt failed ({reason}) before anything of the {where} reached the client, the CPU "
        "worker was ready and its estimated time fit the deadline: replayed on the CPU"
    )
