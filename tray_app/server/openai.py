"""OpenAI's API: chat and legacy completions (streamed or not), embeddings, the model list and health. The
request's life is the jobs facade's (jobs.intake); this module reads the HTTP request, hands it over, and
writes the answer, streamed or whole. The other dialects translate into `Router.generate`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp

from tray_app.contract.roles import CHAT_ROLES
from tray_app.contract.sizes import parse_size
from tray_app.jobs.intake import BACKGROUND_DEADLINE, Admission, JobRequest, Refused
from tray_app.jobs.outcomes import JobFailed, Piece
from tray_app.jobs.registry import Job
from tray_app.server.embedding_requests import check_tokens, parse_embedding_request
from tray_app.server.errors import ApiError, from_job_error
from tray_app.server.event_stream import SSE_HEADERS, EventStreamResponse, Writer
from tray_app.server.health import health_answer
from tray_app.server.http import (
    JOB_TOKEN_HEADER,
    RECEIVED_AT,
    error_response,
    job_headers,
    read_body,
    wait_for_disconnect,
)
from tray_app.server.ports import GenerationView
from tray_app.server.requests import (
    Kind,
    ParsedRequest,
    check_model,
    check_model_name,
    keep_alive_option,
    parse_request,
    stand_in_allowed,
)
from tray_app.server.rewrite import NamedAsAsked
from tray_app.server.streaming import include_usage, outcome_bytes, result_to_stream

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=8)
def _size(text: str) -> int:
    return parse_size(text)


def deadline_seconds(request: Request, default: float) -> float:
    """X-Failsoft-Deadline, the seconds the client waits (default: the config's)."""
    value = request.headers.get("x-failsoft-deadline")
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= BACKGROUND_DEADLINE:
        raise ApiError(
            400,
            "X-Failsoft-Deadline must be a number of seconds > 0",
            param="X-Failsoft-Deadline",
            code="invalid_deadline",
        )
    return seconds


def job_request(
    request: Request,
    parsed: ParsedRequest,
    deadline: float,
    *,
    fit_budget: bool = False,
    holds_tool_calls: bool = False,
) -> JobRequest:
    """The facade's request from the HTTP one: the body without the router's own options, and what the
    headers say (identity, Idempotency-Key, stand-in, when it arrived)."""
    body = dict(parsed.body)
    keep_alive = keep_alive_option(body.pop("keep_alive", None))
    may_stand_in = stand_in_allowed(request.headers.get("x-failsoft-stand-in"), body.pop("stand_in", None))
    key = request.headers.get("idempotency-key")
    return JobRequest(
        kind=parsed.kind,
        body=body,
        stream=parsed.stream,
        max_tokens=parsed.max_tokens,
        body_hash=parsed.body_hash if key else "",
        idempotency_key=key,
        request_id=request.headers.get("x-request-id"),
        deadline=deadline,
        keep_alive=keep_alive,
        may_stand_in=may_stand_in,
        received_at=request.scope.get(RECEIVED_AT),
        fit_budget=fit_budget,
        holds_tool_calls=holds_tool_calls,
    )


class Router:
    """The OpenAI routes. One instance per service; handlers are bound methods."""

    def __init__(self, service: GenerationView) -> None:
        self.svc = service
        self.jobs = service.jobs

    @property
    def max_body(self) -> int:
        return _size(self.svc.cfg.server.max_body)  # read each time: a config reload may change it

    def deadline_seconds(self, request: Request) -> float:
        return deadline_seconds(request, self.svc.cfg.failover.deadline)

    async def count_chat(self, raw: bytes) -> int:
        """The prompt tokens of a chat request (`raw`, OpenAI's shape) on the model it names, counted as
        admission counts them (by the tokenizer helper); ApiError (400, 404) when the request is not one the
        router would take."""
        parsed = parse_request("chat", raw)
        check_model(parsed, self.svc.model_names)
        try:
            return await self.jobs.count_prompt("chat", parsed.body, parsed.model)
        except Refused as refused:
            raise from_job_error(refused.error) from None

    def context_per_slot(self, name: str | None) -> int:
        return self.jobs.context_per_slot(self.jobs.model(name))

    # ------------------------------------------------------------------------------ handlers
    async def chat(self, request: Request) -> ASGIApp:
        return await self._openai(request, "chat")

    async def completions(self, request: Request) -> ASGIApp:
        return await self._openai(request, "completion")

    async def _openai(self, request: Request, kind: Kind) -> ASGIApp:
        try:
            raw = await read_body(request, self.max_body)
        except ApiError as error:
            return error_response(error)
        return await self.generate(request, kind, raw)

    async def generate(
        self,
        request: Request,
        kind: Kind,
        raw: bytes,
        *,
        fit_budget: bool = False,
        holds_tool_calls: bool = False,
    ) -> ASGIApp:
        """Serve an OpenAI request whose body was already read (`raw`): the OpenAI routes, and the routes
        of the other APIs with the body they translated into OpenAI's. Headers and disconnects come from
        `request`. `fit_budget`, `holds_tool_calls`: see jobs.intake.JobRequest."""
        try:
            parsed = parse_request(kind, raw)
            asked = parsed.model
            as_asked = asked != check_model(parsed, self.svc.model_names)  # an Ollama client's name for it
            deadline = self.deadline_seconds(request)
            spec = job_request(
                request, parsed, deadline, fit_budget=fit_budget, holds_tool_calls=holds_tool_calls
            )
            if spec.idempotency_key:
                replay = self.jobs.replay(spec.idempotency_key, parsed.body_hash)
                if replay is not None:
                    answer = _replayed(parsed, replay.job_id, replay.result, replay.read_token)
                    served = self.jobs.model(parsed.model).name
                    return NamedAsAsked(answer, served, asked) if as_asked and asked else answer
            job = self.jobs.make(spec, prompt_tokens=await self.jobs.count_request(spec))
            admission = await self.jobs.admit(job, deadline)
        except ApiError as error:
            return error_response(error)
        except Refused as refused:
            return error_response(from_job_error(refused.error))
        answer = await self._answer(request, job, admission)
        # Named as asked, as Ollama's OpenAI routes name it (the library's name otherwise, as OpenAI does).
        return NamedAsAsked(answer, job.asked_model, asked) if as_asked and asked else answer

    async def _answer(self, request: Request, job: Job, admission: Admission) -> ASGIApp:
        if job.stream:
            return self._stream(job, admission)
        task = (
            self.jobs.wait_for_approval(job, admission.approval)
            if admission.approval
            else self.jobs.start(job, admission.held)
        )
        watcher = asyncio.create_task(wait_for_disconnect(request.receive))
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if not task.done():
            self.jobs.stop(job)  # the client is gone: stop the generation now
            self.svc.metrics.requests.labels(route=job.route, outcome="cancelled").inc()
            return Response(status_code=499)
        self.svc.metrics.requests.labels(route=job.worker or job.route, outcome=job.state).inc()
        if job.state == "completed" and job.result is not None:
            return Response(json.dumps(job.result), media_type="application/json", headers=job_headers(job))
        error = dict(job.error or {"message": "the job ended without an answer", "code": job.state})
        status = int(error.pop("status", 503))
        headers = job_headers(job)
        if status == 503:
            headers["Retry-After"] = str(job.retry_after())
        return Response(
            json.dumps({"error": error}), status_code=status, media_type="application/json", headers=headers
        )

    def _stream(self, job: Job, admission: Admission) -> EventStreamResponse:
        writer = Writer()
        jobs = self.jobs

        async def pump() -> None:
            timed = job.path is None  # the first output's way is recorded once
            try:
                source = jobs.outcomes(job, admission)
                # Closed however the pump ends: a cancel that lands in a blocked write to the client (it
                # left, or stopped reading) must still end the job and free its slot, in the generator.
                async with contextlib.aclosing(source):
                    async for piece in source:
                        # Finished and Ended are always a job's last outcome: they end the response. A
                        # piece with no output (a finish) waits for what comes next: one write, not two.
                        # (The role comes attached to the first token already: see jobs.attempt.)
                        output = not isinstance(piece, Piece) or piece.output
                        written = await writer.write(
                            outcome_bytes(job, piece), hold=not output, last=not isinstance(piece, Piece)
                        )
                        if not timed and isinstance(piece, Piece) and piece.output:
                            timed = True
                            if written:
                                jobs.first_output_written(job)
                            else:  # it goes out with the status line: timed then
                                writer.when_pending_sent(functools.partial(jobs.first_output_written, job))
            finally:
                writer.close()

        jobs.run_task(job, pump(), f"stream-{job.id}")

        def stop_job() -> None:
            jobs.stop(job)  # the client went away mid-stream

        def count() -> None:
            stop_job()  # the response ended early (an error while writing): nobody reads the job any more
            self.svc.metrics.requests.labels(route=job.worker or job.route, outcome=job.state).inc()

        return EventStreamResponse(
            writer,
            job_headers(job, False),
            on_disconnect=stop_job,
            on_end=count,
            keepalive=self.svc.cfg.server.keepalive_seconds,
            stall=jobs.stall_seconds,
            on_stall=functools.partial(jobs.drop_stalled, job),
        )

    async def embeddings(self, request: Request) -> ASGIApp:
        try:
            raw = await read_body(request, self.max_body)
        except ApiError as error:
            return error_response(error)
        return await self.embed(request, raw)

    async def embed(self, request: Request, raw: bytes) -> Response:
        """Serve an embeddings request whose body was already read: `/v1/embeddings`, and Ollama's
        `/api/embed` with the body it translated. The answer carries the identity headers and object."""
        job: Job | None = None
        try:
            parsed = parse_embedding_request(raw)
            asked = parsed.model
            served = check_model_name(asked, self.svc.model_names)
            counts = await self.jobs.count_inputs(self.svc.cfg.embeddings.model, parsed.inputs)
            tokens = check_tokens(counts, self.svc.cfg)
            deadline = self.deadline_seconds(request)
            job = self.jobs.embed(parsed.body, tokens, deadline, request.headers.get("x-request-id"))
            answer = await self.jobs.run_embedding(job)
        except JobFailed as failed:
            return error_response(from_job_error(failed.error), job_headers(job) if job else None)
        except ApiError as error:
            return error_response(error, job_headers(job) if job else None)
        outcome = "completed" if job.state == "completed" else job.state
        self.svc.metrics.requests.labels(route=f"embed-{job.worker}", outcome=outcome).inc()
        if asked is not None and asked != served:
            answer["model"] = asked  # an Ollama client's name for it, as Ollama's OpenAI routes answer
        return Response(json.dumps(answer), media_type="application/json", headers=job_headers(job))

    async def health(self, request: Request) -> Response:
        states: dict[str, str] = {role: self.svc.worker_status(role)["state"] for role in CHAT_ROLES}
        status, body = health_answer(states, self.svc.plan_set.device.simulated)
        return JSONResponse(body, status_code=status)

    async def models(self, request: Request) -> Response:
        """Every model a request may name, the main one first, each with where it is loaded now."""
        statuses = self.svc.library.status(self.svc.plan_set, self.jobs.in_flight)
        started = datetime.fromtimestamp(self.svc.started_at, UTC).isoformat().replace("+00:00", "Z")
        data = []
        for status in statuses:
            extra: dict[str, Any] = {
                "path": status["path"],
                "aliases": [name for name in status["aliases"] if "/" not in name and "\\" not in name],
                "main": status["main"],
                "where": status["where"],
                "devices": status["devices"],
                "stand_in": status["stand_in"],
            }
            if status["main"]:
                extra["caps"] = self.svc.caps()
            data.append(
                {
                    "id": status["name"],
                    "object": "model",
                    "created": int(self.svc.started_at),
                    "owned_by": "failsoft",
                    # Anthropic's fields beside OpenAI's: its SDKs list models from the same path.
                    "type": "model",
                    "display_name": status["name"],
                    "created_at": started,
                    "failsoft": extra,
                }
            )
        first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
        page = {"has_more": False, "first_id": first, "last_id": last}  # Anthropic's one page
        return JSONResponse({"object": "list", "data": data, **page})


def _replayed(parsed: ParsedRequest, job_id: str, result: dict[str, Any], read_token: str) -> ASGIApp:
    """The stored answer of a request repeated under its Idempotency-Key, streamed if this one asks so."""
    headers = {"X-Failsoft-Job": job_id, JOB_TOKEN_HEADER: read_token, "Idempotent-Replayed": "true"}
    failsoft = result.get("failsoft") or {}
    headers["X-Failsoft-Worker"] = str(failsoft.get("worker") or "")
    headers["X-Failsoft-Attempts"] = str(failsoft.get("attempts") or 0)
    if parsed.stream:
        pieces = result_to_stream(parsed.kind, result, include_usage(parsed.body))
        return StreamingResponse(
            iter(pieces), media_type="text/event-stream", headers={**SSE_HEADERS, **headers}
        )
    return Response(json.dumps(result), media_type="application/json", headers=headers)
