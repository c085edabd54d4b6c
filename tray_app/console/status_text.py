"""`failsoft status` in words: the tray's reading of `/failsoft/status` (view.state, view.budget_split),
laid out for a terminal."""

from __future__ import annotations

from typing import Any

from tray_app.config.notify import EVENT_NAMES
from tray_app.contract.sizes import format_size, text_bar
from tray_app.contract.status import ServiceStatus
from tray_app.view.budget_split import box_problems, caps_text, remote_bars, status_segments
from tray_app.view.device_now import device_lines
from tray_app.view.peers import peer_views
from tray_app.view.pending import PendingJob
from tray_app.view.service_run import clock, crash_line, how_it_ended
from tray_app.view.state import format_duration, library, model_line, summarize, worker_line

COUNTERS = ("accepted", "completed", "failed", "rejected", "cancelled")
NO_CHANNELS = (
    'Notify: no channels (phone push and webhooks: [[notify]], see "Away from the server" in the README)'
)


def _device_lines(status: ServiceStatus) -> list[str]:
    device = status.get("device") or {}
    engine = status.get("engine") or {}
    name = str(device.get("name") or "no GPU")
    total = int(device.get("total_bytes") or 0)
    label = " [SIMULATED]" if status.get("simulated") or device.get("simulated") else ""
    lines = [f"GPU: {name}{', ' + format_size(total) if total else ''}{label} - {device.get('reason') or ''}"]
    if engine.get("version"):
        commit = f" (llama.cpp {engine['commit']})" if engine.get("commit") else ""
        lines.append(f"engine: llama-server {engine['version']}{commit}")
    return lines + device_lines(status)  # the device now: who holds the GPU's memory, the GPU path


def _budget_lines(status: ServiceStatus) -> list[str]:
    plan = status.get("plan") or {}
    total = int(plan.get("total_bytes") or 0)
    if total <= 0:
        return [f"No GPU budget: {plan.get('reason') or 'no GPU to plan for'}", *_rpc_lines(status)]
    lines = [f"VRAM budget ({format_size(total)}):"]
    for segment in status_segments(status):
        lines.append(
            f"  {segment.label:<16} {text_bar(segment.bytes, total)} {format_size(segment.bytes):>11}"
        )
    lines.append("  " + caps_text(plan, status.get("caps") or {}))
    return lines + _rpc_lines(status)


def _rpc_lines(status: ServiceStatus) -> list[str]:
    """The RPC boxes the GPU worker spans: a bar of each share's usable memory, its layers and parts; a line
    per configured box that holds none, and why. Nothing without boxes."""
    lines = []
    for bar in remote_bars(status):
        parts = ", ".join(f"{s.label} {format_size(s.bytes)}" for s in bar.segments if s.key != "free")
        lines += [
            f"  {bar.label}: {bar.layers}",
            f"  {'':<16} {text_bar(bar.used_bytes, bar.total_bytes)} {bar.usage} ({parts})",
        ]
    return lines + ["  " + problem for problem in box_problems(status)]


def _worker_lines(status: ServiceStatus, now: float) -> list[str]:
    lines = ["Workers:"]
    groups = (
        (status.get("workers"), ""),
        (status.get("library_workers"), "other models"),
        (status.get("embedding_workers"), "embeddings"),
    )
    for workers, group in groups:
        for role, worker in (workers or {}).items():
            line = worker_line(role, worker) + (f" ({group})" if group else "")
            why = worker.get("reason")
            if worker.get("state") == "stopped" and not worker.get("warm") and worker.get("warm_reason"):
                why = worker["warm_reason"]  # "not started" says less than when it will be
            if worker.get("state") != "ready" and why:
                line += f"\n      {why}"
            failure = worker.get("last_failure") or {}
            if failure.get("kind"):
                line += f"\n      last failure: {failure['kind']}: {failure.get('message') or ''}".rstrip()
            retry_at = worker.get("next_retry_at")
            if isinstance(retry_at, int | float):
                line += f"\n      next try in {format_duration(retry_at - now)}"
            lines.append("  " + line)
    return lines


def _peer_lines(status: ServiceStatus) -> list[str]:
    """The peers (other machines' servers, asked between this GPU and this CPU); no block without any."""
    views = peer_views(status)
    if not views:
        return []
    lines = ["Peers:"]
    for view in views:
        lines.append("  " + "\n      ".join([view.line, *view.details]))
    return lines


def _jobs_lines(status: ServiceStatus) -> list[str]:
    queue = status.get("queue") or {}
    pending = int((status.get("approvals") or {}).get("pending") or 0)
    approvals = f"{pending} awaiting approval" + (" (`failsoft approvals`)" if pending else "")
    counters = status.get("counters") or {}
    policy = status.get("policy") or {}
    lines = [
        f"Queue: {queue.get('depth', 0)} waiting of at most {queue.get('limit', '?')} · {approvals}",
        "Jobs since start: " + ", ".join(f"{int(counters.get(name) or 0)} {name}" for name in COUNTERS),
    ]
    if policy:
        speed = policy.get("cpu_tokens_per_second")
        cpu = f" · the CPU makes about {speed:.1f} tokens/s" if isinstance(speed, int | float) else ""
        lines.append(f"Fallback: {policy.get('fallback')} · client deadline {policy.get('deadline')} s{cpu}")
    lines.append(mirror_line(status))
    journal = status.get("journal") or {}
    if journal.get("ok") is False:
        lines.append(f"JOURNAL FAILED: {journal.get('failure')}")
    return lines


def mirror_line(status: ServiceStatus) -> str:
    """The CPU mirror: how many running jobs the CPU could take over without reading their prompt again,
    and how far behind it is."""
    mirror = status.get("mirror")
    if not mirror:
        return "CPU mirror: not reported"
    cache = int((status.get("cpu_plan") or {}).get("prompt_cache_bytes") or 0)
    cache_words = f" · prompt cache up to {format_size(cache)}" if cache else ""
    if not mirror["enabled"]:
        return f"CPU mirror: off (cpu.mirror = false){cache_words}"
    reading = f", reading now ({mirror['reading']})" if mirror["reading"] else ""
    return (
        f"CPU mirror: {mirror['covered']} of {mirror['following']} running jobs covered, "
        f"{mirror['tokens_behind']} tokens behind{reading} · {mirror['read_tokens']} tokens read, "
        f"{mirror['preempted']} times stepped aside for real work · "
        f"reads {mirror['prompt_tokens_per_second']:.0f} tokens/s{cache_words}"
    )


def _ago(at: Any, now: float) -> str:
    return f"{format_duration(now - at)} ago" if isinstance(at, int | float) else "at an unknown time"


def _channel_state(channel: dict[str, Any], now: float) -> str:
    """ok, or the error of its latest try: an error older than the latest delivery is over."""
    sent, failed = int(channel.get("sent") or 0), int(channel.get("failed") or 0)
    error, sent_at = channel.get("last_error"), channel.get("last_sent_at")
    error_at = channel.get("last_error_at")
    if error and (sent_at is None or (error_at or 0) > sent_at):
        said = " ".join(str(error).split())  # one line per channel, whatever the error held
        return f"FAILING, last error {_ago(error_at, now)}: {said} ({sent} sent, {failed} failed)"
    delivered = f"{sent} sent, the last {_ago(sent_at, now)}" if sent else "nothing sent yet"
    return f"ok, {delivered}" + (f" ({failed} failed before)" if failed else "")


def notify_line(channel: dict[str, Any], now: float) -> str:
    """One [[notify]] channel: its name, where it sends (a host, never a topic or token), what it is told
    and whether its latest message got through."""
    name, kind = str(channel.get("name") or "?"), str(channel.get("kind") or "?")
    label = name if name.startswith(f"{kind}-") else f"{name} ({kind})"  # "ntfy-1" names its kind already
    where = f" → {channel['where']}" if channel.get("where") else ""  # absent from an older service
    events = list(channel.get("events") or [])
    told = "all events" if set(events) >= set(EVENT_NAMES) else ", ".join(events) or "no events"
    extras = [f"quiet {channel['quiet_hours']}"] if channel.get("quiet_hours") else []
    if channel.get("pending"):
        extras.append(f"{channel['pending']} held")
    if channel.get("dropped"):
        extras.append(f"{channel['dropped']} dropped")
    return " · ".join([f"{label}{where}", told, *extras, _channel_state(channel, now)])


def _notify_lines(status: ServiceStatus, now: float) -> list[str]:
    if "notify" not in status:
        return ["Notify: not reported"]
    channels = status["notify"]
    if not channels:
        return [NO_CHANNELS]
    return ["Notify:", *("  " + notify_line(channel, now) for channel in channels)]


def _restart_lines(status: ServiceStatus) -> list[str]:
    """The service's own crash before this run, and the tokenizer helper's restarts, when there were any."""
    lines = []
    service = status.get("service")
    note = service["restarted_after_crash"] if service else None
    if note:
        stack = note.get("stack_log")
        lines.append(crash_line(note) + (f"; its stack: {stack}" if stack else ""))
    helper = status.get("tokenizer") or {}
    last = helper.get("last_exit")
    if helper.get("restarts") and last:
        code = last.get("returncode")
        ended = how_it_ended(last.get("signal"), code if code and code > 0 else None)
        lines.append(
            f"The tokenizer helper was restarted {helper['restarts']} time(s); last at "
            f"{clock(float(last.get('at') or 0))}" + (f" ({ended})" if ended else "")
        )
    return lines


def render_status(status: ServiceStatus, url: str, now: float) -> str:
    """The whole status, one block per part: the headline, the device, the budget, the workers, the peers
    (when there are any), the models, the queue and the jobs, the notify channels."""
    summary = summarize(status, reachable=True)
    uptime = format_duration(float(status.get("uptime_seconds") or 0))
    blocks = [
        [
            f"Failsoft {status.get('version', '')} at {url} · up {uptime}",
            summary.tooltip.removeprefix("Failsoft: "),
            *_restart_lines(status),
        ],
        _device_lines(status),
        _budget_lines(status),
        _worker_lines(status, now),
        _peer_lines(status),
        ["Models:", *("  " + model_line(model) for model in library(status))],
        _jobs_lines(status),
        _notify_lines(status, now),
    ]
    return "\n\n".join("\n".join(block) for block in blocks if block)


def render_pending(jobs: list[PendingJob], now: float) -> str:
    """The jobs waiting for approval, oldest first, each with the question it asks."""
    if not jobs:
        return "No job waits for approval."
    noun = "job waits" if len(jobs) == 1 else "jobs wait"
    lines = [f"{len(jobs)} {noun} for approval (failsoft approve ID..., --all; failsoft reject ID...):"]
    for job in jobs:
        preview = " ".join(job.preview.split())
        preview = preview if len(preview) <= 60 else preview[:59] + "…"
        lines.append(f"  {job.job_id}  waiting {format_duration(now - job.created_at)}  {job.choice()}")
        lines.append(f"      {preview!r}")
    return "\n".join(lines)
