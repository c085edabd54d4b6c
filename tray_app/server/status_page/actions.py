"""`/ui/act/<token>`: what a phone's Approve or Reject does. POST acts (an ntfy button, the form below);
GET only shows what the link would do, with a button, because chat apps and mail scanners open links by
themselves to preview them and must not decide anything.

The token is the credential (reach.capability): no API key, no admin token. It is used up by the POST that
presents it, whatever the job's state, so the same link never acts twice; the answer says what happened to
the job, also when someone decided it already."""

from __future__ import annotations

import html

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route

from tray_app.jobs.registry import Job
from tray_app.reach.capability import Action, Refused
from tray_app.server.ports import StatusView
from tray_app.view.state import format_duration

PATH = "/ui/act/{token}"


def _state_words(job: Job) -> str:
    if job.state == "completed":
        return f"it completed on the {job.route.upper() or 'CPU'}"
    if job.state in ("queued", "running"):
        return f"it is {job.state} on the {job.route.upper() or 'CPU'}"
    return f"it is {job.state.replace('_', ' ')}"


def _answer(request: Request, status: int, title: str, text: str, form: str = "") -> Response:
    if "text/html" not in request.headers.get("accept", ""):
        return PlainTextResponse(text + "\n", status_code=status, headers={"Cache-Control": "no-store"})
    page = (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(title)} · Failsoft</title><link rel='stylesheet' href='/ui/app.css'></head>"
        f"<body class='act'><main><h1>{html.escape(title)}</h1><p id='answer'>{html.escape(text)}</p>{form}"
        "<p><a href='/ui/'>Status page</a></p></main></body></html>"
    )
    return HTMLResponse(page, status_code=status, headers={"Cache-Control": "no-store"})


class Actions:
    def __init__(self, service: StatusView) -> None:
        self.svc = service

    def routes(self) -> list[Route]:
        return [Route(PATH, self.show, methods=["GET"]), Route(PATH, self.act, methods=["POST"])]

    async def show(self, request: Request) -> Response:
        token = request.path_params["token"]
        try:
            action = self.svc.signer.check(token)
        except Refused as refused:
            return _answer(request, 403, "Link refused", f"refused: {refused}; nothing changed")
        job = self.svc.jobs.get(action.job_id)
        if job is None or job.state != "awaiting_approval":
            text = f"{action.job_id} " + (
                "is no longer known" if job is None else f"was already decided: {_state_words(job)}"
            )
            return _answer(request, 409, "Already decided", text)
        verb = "Approve" if action.decision == "approve" else "Reject"
        text = f"{verb} {job.id}? " + _what_it_does(action, job)
        form = (
            f"<form method='post' action='/ui/act/{html.escape(token)}'>"
            f"<button type='submit' class='{action.decision}'>{verb}</button></form>"
        )
        return _answer(request, 200, f"{verb} the CPU run", text, form)

    async def act(self, request: Request) -> Response:
        try:
            action = self.svc.signer.use(request.path_params["token"])  # checked and used up in one step
        except Refused as refused:
            return _answer(request, 403, "Link refused", f"refused: {refused}; nothing changed")
        job = self.svc.jobs.get(action.job_id)
        if job is None:
            return _answer(
                request, 404, "Unknown job", f"{action.job_id} is no longer known; nothing changed"
            )
        if job.state != "awaiting_approval":
            text = f"{job.id} was already decided: {_state_words(job)}; nothing changed"
            return _answer(request, 409, "Already decided", text)
        done = self.svc.jobs.approve(job) if action.decision == "approve" else self.svc.jobs.reject(job)
        if not done:  # decided between the look and the act
            return _answer(request, 409, "Already decided", f"{job.id}: {_state_words(job)}; nothing changed")
        if action.decision == "approve":
            return _answer(request, 200, "Approved", f"approved: {_what_it_does(action, job)}")
        return _answer(request, 200, "Rejected", f"rejected: {job.id} will not run on the CPU")


def _what_it_does(action: Action, job: Job) -> str:
    if action.decision == "reject":
        return f"{job.id} will not run"
    estimate = f", about {format_duration(job.estimated_seconds)}" if job.estimated_seconds else ""
    return f"{job.id} runs on the CPU{estimate}"
