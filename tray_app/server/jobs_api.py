"""Background jobs over HTTP (`/v1/jobs`): submit a request that runs without a client waiting, collect its
answer later, cancel it. The lifecycle is the jobs facade's; this module reads and writes HTTP.

A job is its creator's: reading it back or cancelling it takes the read token its creation answered with
(`X-Failsoft-Job-Token`), or the service's admin token; its id alone is not enough (the event stream names
every job)."""

from __future__ import annotations

import hmac

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tray_app.jobs.intake import BACKGROUND_DEADLINE, Jobs, Refused
from tray_app.reach import admin_token
from tray_app.server.errors import ApiError, from_job_error
from tray_app.server.http import JOB_TOKEN_HEADER, error_response, job_headers, read_body
from tray_app.server.openai import Router, job_request
from tray_app.server.requests import Kind, check_model, parse_json_object, parse_request


class JobsApi:
    def __init__(self, router: Router) -> None:
        self.router = router
        self.jobs = router.jobs

    async def create(self, request: Request) -> Response:
        try:
            raw = await read_body(request, self.router.max_body)
            body = parse_json_object(raw)
            kind: Kind = "completion" if "prompt" in body and "messages" not in body else "chat"
            parsed = parse_request(kind, raw)
            check_model(parsed, self.router.svc.model_names)
            accepted = await self.jobs.submit_background(job_request(request, parsed, BACKGROUND_DEADLINE))
        except ApiError as error:
            return error_response(error)
        except Refused as refused:
            return error_response(from_job_error(refused.error))
        if accepted.job is not None:
            headers = job_headers(accepted.job, False)
        else:
            headers = {
                "X-Request-Id": accepted.request_id,
                "X-Failsoft-Job": accepted.job_id,
                JOB_TOKEN_HEADER: accepted.read_token,
                "Idempotent-Replayed": "true",
            }
        answer = {"object": "job", **accepted.summary, "read_token": accepted.read_token}
        return JSONResponse(answer, status_code=accepted.status, headers=headers)

    async def get(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        if not may_read(request, self.jobs, self.router.svc.admin_token, job_id):
            return _not_found(job_id)
        summary = await self.jobs.summary(job_id)
        if summary is None:
            return _not_found(job_id)
        return JSONResponse({"object": "job", **summary})

    async def delete(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        if not may_read(request, self.jobs, self.router.svc.admin_token, job_id):
            return _not_found(job_id)
        job = self.jobs.cancel(job_id)
        if job is None:
            return error_response(ApiError(404, f"no live job {job_id}", code="job_not_found"))
        return JSONResponse({"object": "job", **job.summary()})


def may_read(request: Request, jobs: Jobs, admin: str, job_id: str, token: str | None = None) -> bool:
    """Whether this request may read job `job_id`: it carries the job's read token (`token`, or the
    header) or the admin token."""
    if admin_token.matches(_header(request, admin_token.HEADER), admin):
        return True
    expected = jobs.read_token(job_id)
    sent = token.encode("ascii", "replace") if token is not None else _header(request, JOB_TOKEN_HEADER)
    if not expected or sent is None:
        return False  # no such job, or one made before read tokens: its owner reads it with the admin token
    return hmac.compare_digest(sent, expected.encode("ascii"))


def _header(request: Request, name: str) -> bytes | None:
    wanted = name.lower().encode("ascii")
    return next((value.strip() for key, value in request.scope["headers"] if key == wanted), None)


def _not_found(job_id: str) -> Response:
    # The same answer for a job that does not exist and one that is not the caller's.
    message = f"no job {job_id} readable with this request: send its {JOB_TOKEN_HEADER} (given at creation)"
    return error_response(ApiError(404, message, code="job_not_found"))
