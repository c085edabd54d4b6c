"""The status page's routes: its files (`/ui/`), the login that turns the admin token into a session (its id
in a cookie), the logout that ends it, and `/failsoft/view`, everything the page shows in one answer (an
admin route: the cookie or the token)."""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from tray_app.contract.events import ApprovalNeeded, FallbackCompleted, FallbackRefused, FallbackStarted
from tray_app.contract.sizes import format_size
from tray_app.server.errors import ApiError
from tray_app.server.http import error_response, read_body
from tray_app.server.ports import StatusView
from tray_app.server.status_page import session
from tray_app.server.status_page.actions import Actions
from tray_app.view.budget_split import Segment, box_problems, caps_text, remote_bars, status_segments

FILES = {"index.html": "text/html", "app.css": "text/css", "app.js": "text/javascript"}
# The page's own files and nothing else: no inline script, no other site, no framing (clickjacking a
# button that approves).
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
LOGIN_MAX_BODY = 4096
# A job's way off the GPU: moved, finished there, refused, or put in the user's hands.
FAILOVER_EVENTS = (FallbackStarted, FallbackCompleted, FallbackRefused, ApprovalNeeded)
RECENT_FAILOVERS = 10


def _file(name: str) -> bytes:
    return (resources.files(__package__) / "static" / name).read_bytes()


class StatusPage:
    def __init__(self, service: StatusView) -> None:
        self.svc = service
        self.actions = Actions(service)

    def routes(self) -> list[Route]:
        return [
            Route("/ui", self.to_page, methods=["GET"]),
            Route("/ui/", self.page, methods=["GET"]),
            Route("/ui/login", self.login, methods=["POST"]),
            Route("/ui/logout", self.logout, methods=["POST"]),
            *self.actions.routes(),
            Route("/ui/{name}", self.page, methods=["GET"]),
            Route("/failsoft/view", self.view, methods=["GET"]),
        ]

    async def to_page(self, request: Request) -> Response:
        return RedirectResponse("/ui/", status_code=308)

    async def page(self, request: Request) -> Response:
        name = request.path_params.get("name", "index.html")
        if name not in FILES:
            return Response("not found\n", status_code=404, media_type="text/plain")
        return Response(_file(name), media_type=FILES[name], headers=SECURITY_HEADERS)

    async def login(self, request: Request) -> Response:
        """`{"token": "<admin token>"}` -> a new session, its id in the cookie: HttpOnly (the page's script
        never holds it), SameSite=Strict (no other site's request carries it), and over HTTPS a `__Host-`
        cookie (Secure: never sent over plain HTTP, to this service's port or another's)."""
        try:
            raw = await read_body(request, LOGIN_MAX_BODY)
        except ApiError as error:  # 413: a token is a few dozen characters
            return error_response(error)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        token = body.get("token") if isinstance(body, dict) else None
        expected = self.svc.admin_token
        if not isinstance(token, str) or not expected or not _same(token.strip(), expected):
            return JSONResponse(
                {"error": {"message": "that is not this service's admin token", "code": "bad_token"}}, 401
            )
        for old in session.cookie_values(request.scope):
            self.svc.signer.end_session(old)  # a login in a browser already logged in replaces its session
        response = JSONResponse({"logged_in": True})
        secure = session.over_https(request.scope, self.svc.cfg.server)
        response.set_cookie(
            session.SECURE_COOKIE if secure else session.COOKIE,
            self.svc.signer.start_session(),
            max_age=int(self.svc.signer.session_ttl),
            path="/",
            httponly=True,
            samesite="strict",
            secure=secure,
        )
        return response

    async def logout(self, request: Request) -> Response:
        """Ends the session here (its cookie is worth nothing from now on, wherever a copy of it is), and
        asks the browser to drop the cookie."""
        for cookie in session.cookie_values(request.scope):
            self.svc.signer.end_session(cookie)
        response = JSONResponse({"logged_in": False})
        response.delete_cookie(session.COOKIE, path="/", httponly=True, samesite="strict")
        response.delete_cookie(session.SECURE_COOKIE, path="/", secure=True, httponly=True, samesite="strict")
        return response

    async def view(self, request: Request) -> Response:
        """The page's data: the status, the VRAM bar as the tray draws it, the jobs waiting for a decision
        and those queued or running, the recent failovers, the notification channels."""
        status = self.svc.status()
        segments = status_segments(status)
        jobs = [
            _summary(job)
            for state in ("awaiting_approval", "queued", "running")
            for job in self.svc.jobs.by_state(state)
        ]
        failovers = [event.to_dict() for event in self.svc.bus.recent() if isinstance(event, FAILOVER_EVENTS)]
        return JSONResponse(
            {
                "status": status,
                "bar": {
                    "segments": [_segment(s) for s in segments],
                    "total": budget_title(status.get("plan") or {}, sum(s.bytes for s in segments)),
                    "caps": caps_text(status.get("plan") or {}, status.get("caps") or {}),
                    **remote_view(status),
                },
                "approvals": [job for job in jobs if job["state"] == "awaiting_approval"],
                "jobs": [job for job in jobs if job["state"] != "awaiting_approval"],
                "failovers": failovers[-RECENT_FAILOVERS:][::-1],
            }
        )


def remote_view(status: Mapping[str, Any]) -> dict[str, Any]:
    """Other machines' devices the GPU worker spans: a bar each, and why a configured box holds none."""
    return {
        "remote": [
            {
                "key": bar.key,
                "label": bar.label,
                "layers": bar.layers,
                "usage": bar.usage,
                "segments": [_segment(s) for s in bar.segments],
            }
            for bar in remote_bars(status)
        ],
        "problems": box_problems(status),
    }


def _segment(segment: Segment) -> dict[str, Any]:
    return {
        "key": segment.key,
        "label": segment.label,
        "color": segment.color,
        "bytes": segment.bytes,
        "size": format_size(segment.bytes),
        "detail": segment.detail,
    }


def budget_title(plan: dict[str, Any], total: int) -> str:
    """The bar's size and device; a simulated GPU is always called so, never passed off as a real one."""
    device = plan.get("device_name") or "GPU"
    simulated = " [SIMULATED]" if plan.get("simulated") else ""
    return f"{format_size(total)} on {device}{simulated}"


def _summary(job: Any) -> dict[str, Any]:
    return {key: value for key, value in job.summary().items() if key != "result"}


def _same(sent: str, expected: str) -> bool:
    """Constant-time, as bytes: a token with non-ASCII characters (or a lone surrogate from a JSON escape) is
    a wrong token, not a TypeError."""
    return hmac.compare_digest(sent.encode("utf-8", "surrogatepass"), expected.encode("utf-8"))
