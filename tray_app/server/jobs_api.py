"""Background jobs over HTTP (`/v1/jobs`): submit a request that runs without a client waiting, collect its
answer later, cancel it. The lifecycle is the jobs facade's; this module reads and writes HTTP."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tray_app.jobs.intake import BACKGROUND_DEADLINE, Refused
from tray_app.server.errors import ApiError, from_job_error
from tray_app.server.http import error_response, job_headers, read_body
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
                "Idempotent-Replayed": "true",
            }
        return JSONResponse(
            {"object": "job", **accepted.summary}, status_code=accepted.status, headers=headers
        )

    async def get(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        summary = await self.jobs.summary(job_id)
        if summary is None:
            return error_response(ApiError(404, f"no job {job_id}", code="job_not_found"))
        return JSONResponse({"object": "job", **summary})

    async def delete(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        job = self.jobs.cancel(job_id)
        if job is None:
            return error_response(ApiError(404, f"no live job {job_id}", code="job_not_found"))
        return JSONResponse({"object": "job", **job.summary()})
