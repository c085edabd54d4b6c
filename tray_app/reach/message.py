"""One message for a batch of events (one event, or a burst gathered by the dispatcher), in words a person
reads on a phone: a title, a body, a level, and the actions it offers. Pure: the links come from outside.

An approval says the model, the prompt's size and the reason, never what the prompt says: a channel may be a
third party's server (ntfy.sh, a chat service through Apprise). The prompt's opening is added only when the
dispatcher passes it (`previews`: for a channel with `preview = true`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tray_app.reach.events import name_of
from tray_app.view.reasons import (
    GPU_PATH_TITLES,
    fallback_place,
    fallback_target,
    fallback_to,
    moves_to_peer,
    reason_text,
)
from tray_app.view.state import format_duration

SET_PUBLIC_URL = "Set server.public_url in Failsoft's config to approve from here."
PREVIEW_CHARS = 120  # of the prompt's opening, for a channel with preview = true


@dataclass(frozen=True)
class ActionLink:
    label: str  # "Approve", "Reject", "Open"
    url: str
    method: str = "POST"  # "GET": opens a page (the status page) instead of acting


@dataclass(frozen=True)
class Message:
    title: str
    body: str
    level: str  # info, warning, critical
    actions: tuple[ActionLink, ...] = ()
    events: tuple[dict[str, Any], ...] = field(default=(), compare=False)


# Links for a job awaiting approval: {"approve": url, "reject": url}, or None without server.public_url.
Links = Callable[[str], dict[str, str] | None]


def _what(event: dict[str, Any]) -> str:
    """The job in the words that may leave the machine: its model, its prompt's size, the reason."""
    parts = []
    if event.get("model"):
        parts.append(f"Model {event['model']}")
    tokens = event.get("prompt_tokens")
    if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
        parts.append(f"prompt {tokens:,} tokens")
    if event.get("reason"):
        parts.append(reason_text(str(event["reason"])))
    return " · ".join(parts)


def _approval(event: dict[str, Any], links: Links, page: str | None, preview: str = "") -> Message:
    job = str(event.get("job_id") or "")
    body = f"{job} needs about {format_duration(float(event.get('estimated_seconds') or 0))} on the CPU."
    if event.get("stand_in"):
        body += f" Or {event['stand_in']} can answer on the GPU now (status page)."
    what = _what(event)
    if what:
        body += f"\n{what}"
    preview = " ".join(preview.split())
    if preview:
        body += f"\n“{preview[:PREVIEW_CHARS]}”"
    urls = links(job)
    if urls is None:
        return Message("Approval needed", f"{body}\n{SET_PUBLIC_URL}", "warning", (), (event,))
    actions = [ActionLink("Approve", urls["approve"]), ActionLink("Reject", urls["reject"])]
    if page:
        actions.append(ActionLink("Open", page, "GET"))
    return Message("Approval needed", body, "warning", tuple(actions), (event,))


def _single(event: dict[str, Any], links: Links, page: str | None, preview: str = "") -> Message:
    kind = event.get("type")
    job = str(event.get("job_id") or "")
    reason = reason_text(str(event.get("reason") or ""))
    if kind == "approval_needed":
        return _approval(event, links, page, preview)
    if kind == "fallback_started":
        to = fallback_to(event)
        title = f"Moved to {fallback_target(to)}"
        return Message(title, f"{job} continues on {fallback_place(to)}: {reason}.", "warning", (), (event,))
    if kind == "fallback_refused":
        detail = str(event.get("detail") or "")
        body = f"{job} was not moved to the CPU: {reason}." + (f" {detail}" if detail else "")
        return Message("Fallback refused", body, "critical", (), (event,))
    if kind == "worker_unhealthy":
        role = str(event.get("role") or "a")
        body = f"The {role} worker failed: {reason_text(str(event.get('kind') or ''))}. Failsoft restarts it."
        return Message(f"{role.upper()} worker failed", body, "critical", (), (event,))
    if kind == "journal_failed":
        body = (
            f"Background jobs are refused until Failsoft restarts: {event.get('reason') or 'a write failed'}"
        )
        return Message("Failsoft cannot store jobs", body, "critical", (), (event,))
    state = str(event.get("state") or "")
    parts = [str(event.get(key) or "").strip() for key in ("reason", "action")]
    body = ". ".join(part[:1].upper() + part[1:] for part in parts if part) + "."
    level = {"lost": "critical", "squeezed": "warning", "yielded": "warning"}.get(state, "info")
    return Message(GPU_PATH_TITLES.get(state, "GPU path changed"), body, level, (), (event,))


TO_PEER = "fallback_started:peer"  # a burst's count of the jobs moved to a peer


def _kind_and_place(event: dict[str, Any]) -> str:
    """The event's type, a move to a peer told apart (TO_PEER)."""
    return TO_PEER if moves_to_peer(event) else str(event["type"])


def _plural(count: int, one: str, many: str) -> str:
    return one if count == 1 else many.format(count)


LEVELS = ("info", "warning", "critical")


def compose(
    events: list[dict[str, Any]],
    links: Links,
    page: str | None = None,
    previews: Mapping[str, str] | None = None,
) -> Message | None:
    """The message for `events` (oldest first); None when none is worth a message. A single approval
    carries its Approve and Reject actions (and its prompt's opening when `previews`, by job id, has it);
    several approvals in a burst point at the status page."""
    events = [event for event in events if name_of(event) is not None]
    if not events:
        return None
    if len(events) == 1:
        preview = (previews or {}).get(str(events[0].get("job_id") or ""), "")
        return _single(events[0], links, page, preview)
    singles = [_single(event, lambda _job: None, None) for event in events]
    # A move to a peer is counted apart from one to the CPU: "moved to the CPU" is never said of a peer.
    counts = Counter(_kind_and_place(event) for event in events)
    lines = []
    if counts["approval_needed"]:
        waiting = _plural(counts["approval_needed"], "1 job waits", "{} jobs wait")
        lines.append(f"{waiting} for approval" + (": decide on the status page" if page else ""))
    for kind, one, many in (
        ("fallback_refused", "1 fallback refused", "{} fallbacks refused"),
        ("fallback_started", "1 job moved to the CPU", "{} jobs moved to the CPU"),
        (TO_PEER, "1 job moved to another machine", "{} jobs moved to another machine"),
        ("worker_unhealthy", "1 worker failure", "{} worker failures"),
        ("journal_failed", "the journal cannot store jobs", "the journal cannot store jobs"),
    ):
        if counts[kind]:
            lines.append(_plural(counts[kind], one, many))
    gpu = [message for message, event in zip(singles, events, strict=True) if event["type"] == "gpu_path"]
    if gpu:
        lines.append(f"{gpu[-1].title}: {gpu[-1].body}")  # the GPU as it is now
    lead = max(singles, key=lambda message: LEVELS.index(message.level))
    actions = (ActionLink("Open", page, "GET"),) if page else ()
    title = f"{lead.title} (+{len(events) - 1} more)"
    return Message(title, "\n".join(lines), lead.level, actions, tuple(events))
