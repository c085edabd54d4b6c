"""What must hold once the chaos mix is over, judged from what its clients received (`Sent`) and what the
service shows afterwards (`Observed`). Pure: the soak and the chaos test read the service
(`chaos_observe.observe`), this decides."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from tray_app.drill.chaos_records import Sent

SHOWN = 3  # offenders named per broken invariant


@dataclass
class Observed:
    """The service once the mix settled."""

    unfinished: dict[str, list[str]] = field(default_factory=dict)  # state -> job ids (queued, running, ...)
    busy: dict[str, int] = field(default_factory=dict)  # worker role -> requests the router still holds on it
    queue_depth: int = 0
    mirror_reading: int = 0  # of the CPU's, the CPU mirror's background reads (jobs.mirror)
    not_ready: dict[str, str] = field(default_factory=dict)  # chat worker role -> "state: why"
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # job id -> its record (/v1/jobs/{id})


@dataclass(frozen=True)
class Check:
    name: str
    held: bool
    detail: str = ""

    def line(self) -> str:
        return f"{'ok  ' if self.held else 'FAIL'} {self.name}{': ' + self.detail if self.detail else ''}"


@dataclass
class InvariantReport:
    checks: list[Check]

    @property
    def held(self) -> bool:
        return all(check.held for check in self.checks)

    @property
    def broken(self) -> list[Check]:
        return [check for check in self.checks if not check.held]

    def lines(self) -> list[str]:
        return [check.line() for check in self.checks]

    def to_dict(self) -> dict[str, Any]:
        return {check.name: {"held": check.held, "detail": check.detail} for check in self.checks}


def _named(items: Iterable[str], total: int | None = None) -> str:
    listed = list(items)
    count = len(listed) if total is None else total
    more = f" (+{count - SHOWN} more)" if count > SHOWN else ""
    return f"{count}: {'; '.join(listed[:SHOWN])}{more}" if count else ""


def _check(name: str, offenders: list[str], when_held: str = "") -> Check:
    return Check(name, not offenders, _named(offenders) if offenders else when_held)


def _who(sent: Sent) -> str:
    ident = f" job {sent.job_id}" if sent.job_id else ""
    return f"{sent.kind}{ident}{' (' + sent.detail + ')' if sent.detail else ''}"


def jobs_left(observed: Observed) -> Check:
    left = [f"{job_id} {state}" for state, ids in sorted(observed.unfinished.items()) for job_id in ids]
    return _check("no job left running or queued", left)


def slots_free(observed: Observed) -> Check:
    """Background work counts too: a mirror read still holding a slot once every job ended is a leak."""
    found = _check(
        "every worker's router slots free",
        [f"{role} holds {n}" for role, n in sorted(observed.busy.items()) if n],
    )
    if found.held or not observed.mirror_reading:
        return found
    return replace(
        found, detail=f"{found.detail} (the CPU mirror's reads among them: {observed.mirror_reading})"
    )


def queue_empty(observed: Observed) -> Check:
    return Check("queue empty", observed.queue_depth == 0, f"depth {observed.queue_depth}")


def workers_ready(observed: Observed) -> Check:
    """Both workers back once the faults stopped: a restart may not leave the GPU away."""
    return _check(
        "every worker ready again", [f"{role} {why}" for role, why in sorted(observed.not_ready.items())]
    )


def answers_whole(sents: list[Sent]) -> Check:
    completed = sum(sent.outcome == "completed" for sent in sents)
    cut = [_who(sent) for sent in sents if sent.outcome == "incomplete"]
    return _check("every completed answer whole", cut, f"{completed} answers")


def nothing_lost(sents: list[Sent]) -> Check:
    """Every request ended: answered, refused, left on purpose or ended by the service with a reason."""
    return _check(
        "every request ended with an answer or a reason", [_who(s) for s in sents if s.outcome == "lost"]
    )


def answered_once(sents: list[Sent]) -> Check:
    """No stream ends twice, and no job reaches two clients' requests (a replay under a key is not one)."""
    twice = [f"{_who(sent)} ended {sent.ends} times" for sent in sents if sent.ends > 1]
    answers = Counter(
        sent.job_id for sent in sents if sent.job_id and sent.outcome == "completed" and not sent.replay
    )
    twice += [f"job {job_id} answered {count} times" for job_id, count in answers.items() if count > 1]
    return _check("0 answered twice", twice)


def _by_key(sents: list[Sent]) -> dict[str, list[Sent]]:
    keyed: dict[str, list[Sent]] = defaultdict(list)
    for sent in sents:
        if sent.key:
            keyed[sent.key].append(sent)
    return keyed


def one_job_per_key(sents: list[Sent], observed: Observed) -> Check:
    """Under one Idempotency-Key: at most one job completes, none is made after one completed, and a
    repeat names the job whose answer it gets."""
    problems = []
    for key, group in _by_key(sents).items():
        ids = sorted({sent.job_id for sent in group if sent.job_id}, key=lambda i: _created(observed, i))
        states = [str((observed.jobs.get(job_id) or {}).get("state")) for job_id in ids]
        if states.count("completed") > 1:
            problems.append(f"{key}: {states.count('completed')} jobs completed ({', '.join(ids)})")
        elif "completed" in states[:-1]:
            problems.append(f"{key}: job {ids[-1]} made after {ids[states.index('completed')]} completed")
    return _check("one job per Idempotency-Key", problems)


def _created(observed: Observed, job_id: str) -> float:
    return float((observed.jobs.get(job_id) or {}).get("created_at") or 0.0)


def _attempts_after(record: dict[str, Any], at: float) -> int:
    return sum(float(attempt.get("started_at") or 0.0) > at for attempt in record.get("attempt_log") or [])


def repeated_tool_calls(sents: list[Sent], observed: Observed) -> Check:
    """A tool call that reached a client never reaches it again: not twice in one answer, not from an
    attempt started after it (a failover that ran the turn again), not from a second job under its key."""
    problems = [
        f"{_who(sent)}: {sent.repeated_tool_calls} again" for sent in sents if sent.repeated_tool_calls
    ]
    for sent in sents:
        record = observed.jobs.get(sent.job_id) or {}
        if sent.tool_at is not None and _attempts_after(record, sent.tool_at):
            problems.append(f"{_who(sent)}: an attempt started after its tool call was delivered")
    for key, group in _by_key(sents).items():
        delivering = {sent.job_id for sent in group if sent.tool_heads and not sent.replay}
        if len(delivering) > 1:
            problems.append(f"{key}: tool calls from {len(delivering)} jobs")
    delivered = sum(bool(sent.tool_heads) for sent in sents)
    return _check("0 repeated tool calls", problems, f"{delivered} answers with a tool call")


def engine_fields_refused(sents: list[Sent]) -> Check:
    refused = sum(sent.outcome == "refused" for sent in sents)
    accepted = [sent.detail for sent in sents if sent.outcome == "accepted"]
    return _check("engine fields refused with 400", accepted, f"{refused} refused")


def check(sents: list[Sent], observed: Observed) -> InvariantReport:
    """Every invariant, in the order they are printed."""
    return InvariantReport(
        [
            jobs_left(observed),
            slots_free(observed),
            queue_empty(observed),
            workers_ready(observed),
            answers_whole(sents),
            nothing_lost(sents),
            answered_once(sents),
            one_job_per_key(sents, observed),
            repeated_tool_calls(sents, observed),
            engine_fields_refused(sents),
        ]
    )
