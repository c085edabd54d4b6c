"""One question and its answer while it is in flight: the stream, the service's events about its job, and
(when the service kept the job: waiting for approval, a slow CPU run) the job polled to its end."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from PySide6.QtCore import QTimer

from tray_app.contract.vocabulary import FINAL_JOB_STATES
from tray_app.ui.answer_view import AnswerView
from tray_app.ui.api_client import ChatStream, ServiceClient
from tray_app.view.answer import (
    AnswerInfo,
    Badge,
    answer_badge,
    completion_text,
    job_info,
    model_badge,
    with_header_model,
)
from tray_app.view.pending import as_job
from tray_app.view.reasons import fallback_place, fallback_to, peer_name, reason_text
from tray_app.view.state import device_name, format_duration

JOB_POLL_MS = 1000


class ChatHost(Protocol):
    """What an exchange needs of its chat window."""

    client: ServiceClient
    simulated: bool

    def scroll_to_end(self) -> None: ...

    def exchange_ended(self, exchange: Exchange, badge: Badge) -> None: ...


class Exchange:
    """One question and its answer while it is in flight: the stream, then (if it had to wait) the job."""

    def __init__(self, window: ChatHost, view: AnswerView, stream: ChatStream, max_tokens: int) -> None:
        self.window = window
        self.view = view
        self.stream = stream
        self.max_tokens = max_tokens
        self.job_id = ""
        self.headers: dict[str, str] = {}
        self.on_cpu = False
        self.estimated_seconds = 0.0
        self.cpu_started: float | None = None
        self.first_token_at: float | None = None
        self.tokens = 0
        self.usage: dict[str, Any] = {}  # the answer's token counts (prompt and completion), once it ended
        self.done = False
        self.poll = QTimer(view)
        self.poll.setInterval(JOB_POLL_MS)
        self.poll.timeout.connect(self._poll_job)
        stream.started.connect(self._started)
        stream.delta.connect(self._delta)
        stream.thinking.connect(self._thinking)
        stream.finished.connect(self._finished)
        stream.failed.connect(self._failed)
        stream.stopped.connect(self._stopped)

    # the stream
    def _started(self, headers: dict[str, str]) -> None:
        self.job_id = headers.get("x-failsoft-job", self.job_id)
        self.headers = headers
        if not self.tokens:
            model, device = headers.get("x-failsoft-model"), headers.get("x-failsoft-device")
            on = f" with {model} on {device_name(device)}" if model and device else ""
            self.view.set_phase(f"Generating{on}…")

    def _delta(self, text: str) -> None:
        self._token(self.view.append, text)

    def _thinking(self, text: str) -> None:
        self._token(self.view.append_thinking, text)

    def _token(self, show: Callable[[str], None], text: str) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        self.tokens += 1
        show(text)
        if self.on_cpu:
            self._show_cpu_progress()
        else:
            self.view.set_phase("")
        self.window.scroll_to_end()

    def _finished(self, failsoft: AnswerInfo) -> None:  # the stream's last `failsoft` object
        self.usage = self.stream.usage
        tokens = int(self.stream.usage.get("completion_tokens") or self.tokens)
        seconds = time.monotonic() - self.first_token_at if self.first_token_at is not None else 0.0
        info = with_header_model(failsoft, self.headers)
        self._end(answer_badge(info, tokens, seconds, self.window.simulated), model_badge(info))

    def _failed(self, message: str, error: dict[str, Any]) -> None:
        job_id = str(error.get("job_id") or "")
        if job_id and error.get("code") not in ("rejected", "cancelled"):
            # The service kept the job (waiting for approval, or a slow CPU run): follow it to the end.
            self.job_id = job_id
            self.view.set_phase(f"Queued as job {job_id}: {message}")
            self.view.set_progress(None)
            self.poll.start()
            return
        self._end(Badge("failed", f"Failed — {message}"))

    def _stopped(self) -> None:
        self._end(Badge("stopped", f"Stopped by you after {self.tokens} tokens"))

    def stop(self) -> None:
        if self.poll.isActive() and self.job_id:
            self.window.client.cancel_job(self.job_id)
            self.poll.stop()
            self._end(Badge("stopped", f"Job {self.job_id} cancelled"))
        else:
            self.stream.stop()

    # service events about this job
    def on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "approval_needed":
            self.estimated_seconds = float(event.get("estimated_seconds") or 0)
            self.view.set_phase(
                f"Queued for the CPU: about {format_duration(self.estimated_seconds)}. "
                "Waiting for approval in the Approvals window."
            )
            self.view.set_progress(None)
        elif kind == "fallback_started":
            where = fallback_place(fallback_to(event), aside=True)
            self.view.set_phase(
                f"The GPU failed ({reason_text(str(event.get('reason') or ''))}); continuing on {where}…"
            )
        elif kind == "job_state" and event.get("state") == "running" and event.get("worker") == "cpu":
            self.on_cpu = True
            self.cpu_started = time.monotonic()
            self._show_cpu_progress()
        elif kind == "job_state" and event.get("state") == "running" and _on_peer(event.get("worker")):
            self._show_peer_run(str(event["worker"]))
        elif kind == "job_state" and event.get("state") == "rejected":
            self.view.set_phase("Rejected in the Approvals window.")

    def _show_peer_run(self, worker: str) -> None:
        """A peer (another machine's GPU) runs the job: the CPU's estimate and progress do not apply to it."""
        self.on_cpu = False
        if not self.tokens:
            self.view.set_phase(f"Running on {fallback_place(worker, aside=True)}…")

    def _show_cpu_progress(self) -> None:
        if self.estimated_seconds and self.cpu_started is not None:
            elapsed = time.monotonic() - self.cpu_started
            self.view.set_progress(int(100 * elapsed / self.estimated_seconds))
            left = max(self.estimated_seconds - elapsed, 0)
            self.view.set_phase(
                f"Running on the CPU: {self.tokens} tokens, about {format_duration(left)} left"
            )
        else:
            self.view.set_progress(self.tokens, self.max_tokens)
            self.view.set_phase(f"Running on the CPU: {self.tokens} of at most {self.max_tokens} tokens")

    # a job that outlived its stream
    def _poll_job(self) -> None:
        call = self.window.client.job(self.job_id)
        call.succeeded.connect(self._job_answer)

    def _job_answer(self, answer: object) -> None:
        job = as_job(answer)
        if job is None or self.done:
            return
        state = str(job.get("state") or "")
        if state == "running" and job.get("worker") == "cpu" and not self.on_cpu:
            self.on_cpu = True
            self.cpu_started = time.monotonic()
            self.estimated_seconds = float(job.get("estimated_seconds") or 0)
        elif state == "running" and _on_peer(job.get("worker")):
            self._show_peer_run(str(job["worker"]))
        if self.on_cpu and state == "running":
            self._show_cpu_progress()
        if state not in FINAL_JOB_STATES:
            return
        self.poll.stop()
        result = job.get("result") or {}
        if state == "completed":
            text, reasoning = completion_text(result)
            if reasoning:
                self.view.append_thinking(reasoning)
            self.view.append(text)
            self.usage = dict(result.get("usage") or {})
            tokens = int(self.usage.get("completion_tokens") or 0)
            seconds = time.monotonic() - self.cpu_started if self.cpu_started else 0.0
            info = with_header_model(result.get("failsoft") or job_info(job), self.headers)
            self._end(answer_badge(info, tokens, seconds, self.window.simulated), model_badge(info))
        else:
            message = str((job.get("error") or {}).get("message") or state)
            self._end(Badge("failed", f"Job {state} — {message}"))

    def _end(self, badge: Badge, model: Badge | None = None) -> None:
        if self.done:
            return
        self.done = True
        self.poll.stop()
        self.view.set_badge(badge, model)
        self.window.exchange_ended(self, badge)


def _on_peer(worker: object) -> bool:
    """A job's worker on a peer ("peer:gaming-pc"): another machine's GPU, never this machine's CPU."""
    return isinstance(worker, str) and peer_name(worker) is not None
