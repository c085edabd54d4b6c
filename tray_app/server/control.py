"""The control API the tray (and drills) use: status, events, workers, approvals, config reload, faults."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tray_app import config
from tray_app.contract.events import Event
from tray_app.contract.roles import CHAT_ROLES, EMBED_ROLES
from tray_app.contract.sizes import parse_size
from tray_app.contract.vocabulary import JOB_STATES as STATES
from tray_app.engine.faults import FAULT_KINDS
from tray_app.library.errors import LoadRefused
from tray_app.reach import admin_token
from tray_app.server.errors import ApiError
from tray_app.server.origin_guard import CONTROL_MAX_BODY
from tray_app.server.ports import ControlView
from tray_app.server.status_page import session

KEEPALIVE_SECONDS = 15.0
# /failsoft/events: at most this many streams at once (the tray needs one; more is a leak or abuse): 503.
MAX_EVENT_SUBSCRIBERS = 16
# Of those, kept for the owner (the admin token: the tray, the commands; a status page session): API
# clients, which need no admin token to read events, share the rest (429 beyond), so they cannot lock the
# tray and the page out.
OWNER_EVENT_STREAMS = 4
# Events waiting for one slow subscriber; past this it is dropped (its stream ends; the tray reconnects and
# can catch up with ?history=1), so a reader that stopped reading cannot grow the service's memory.
SUBSCRIBER_QUEUE = 1000
ROLES = (*CHAT_ROLES, *EMBED_ROLES.values())
# Config sections a running service can take over without restarting its workers.


def _error(
    status: int,
    message: str,
    code: str,
    param: str | None = None,
    *,
    retry_after: int | None = None,
    kind: str = "invalid_request_error",
) -> Response:
    error = ApiError(status, message, type=kind, code=code, param=param)
    return Response(
        error.body_bytes(),
        status_code=status,
        media_type="application/json",
        headers={"Retry-After": str(retry_after)} if retry_after is not None else None,
    )


async def _json_body(request: Request) -> dict[str, Any]:
    raw = b""
    async for chunk in request.stream():  # the outer layer refused a larger Content-Length already
        raw += chunk
        if len(raw) > CONTROL_MAX_BODY:
            raise ApiError(
                413, f"control request bodies are at most {CONTROL_MAX_BODY} bytes", code="request_too_large"
            )
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    return body


def event_frame(event: Event) -> bytes:
    return f"event: {event.type}\ndata: {json.dumps(event.to_dict())}\n\n".encode()


class Control:
    def __init__(self, service: ControlView) -> None:
        self.svc = service
        self.subscribers = 0  # open /failsoft/events streams
        self.client_subscribers = 0  # of those, opened without the admin token or a page session

    def routes(self) -> list[Route]:
        routes = [
            Route("/failsoft/status", self.status, methods=["GET"]),
            Route("/failsoft/events", self.events, methods=["GET"]),
            Route("/failsoft/workers/{role}/{action}", self.worker_action, methods=["POST"]),
            Route("/failsoft/models/{name}/{action}", self.model_action, methods=["POST"]),
            Route("/failsoft/jobs", self.jobs, methods=["GET"]),
            Route("/failsoft/jobs/approve-all", self.approve_all, methods=["POST"]),
            Route("/failsoft/jobs/{job_id}/{action}", self.job_action, methods=["POST"]),
            Route("/failsoft/config", self.show_config, methods=["GET"]),
            Route("/failsoft/config", self.change_config, methods=["PATCH"]),
            Route("/failsoft/config/reload", self.reload_config, methods=["POST"]),
            Route("/failsoft/timing", self.timing, methods=["GET"]),
            Route("/failsoft/device/history", self.device_history, methods=["GET"]),
            Route("/failsoft/gpu/{action}", self.gpu_action, methods=["POST"]),
            Route("/metrics", self.metrics, methods=["GET"]),
        ]
        if self.svc.enable_faults:
            # Drills only: without --enable-faults these routes do not exist at all.
            routes += [
                Route("/failsoft/debug/faults", self.faults, methods=["POST"]),
                Route("/failsoft/debug/pressure", self.pressure, methods=["POST"]),
            ]
        return routes

    async def status(self, request: Request) -> Response:
        return JSONResponse(self.svc.status())

    async def timing(self, request: Request) -> Response:
        """The router's own time on the recent streams' way to their first token (jobs.path_timing)."""
        return JSONResponse(self.svc.jobs.path_timing())

    async def device_history(self, request: Request) -> Response:
        """The device watcher's readings of the last 15 minutes (`?since=` a Unix time: only later ones)."""
        since = request.query_params.get("since")
        try:
            after = float(since) if since else None
        except ValueError:
            return _error(400, "'since' must be a Unix time in seconds", "invalid_request", "since")
        return JSONResponse(self.svc.device_history(after))

    async def gpu_action(self, request: Request) -> Response:
        """`yield`: give the GPU to other programs (in-flight jobs finish, then the GPU workers stop; the
        answer comes once they have, unless `{"wait": false}`); `resume`: take it back once it fits."""
        action = request.path_params["action"]
        try:
            body = await _json_body(request)
        except ApiError as error:
            return Response(error.body_bytes(), status_code=error.status, media_type="application/json")
        if action == "yield":
            wait = body.get("wait", True)
            if not isinstance(wait, bool):
                return _error(400, "'wait' must be true or false", "invalid_request", "wait")
            return JSONResponse(await self.svc.yield_gpu(wait))
        if action == "resume":
            return JSONResponse(self.svc.resume_gpu())
        return _error(404, f"unknown action {action!r}; use yield or resume", "not_found")

    async def metrics(self, request: Request) -> Response:
        self.svc.status()  # refreshes the gauges that are read, not pushed
        return Response(self.svc.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def events(self, request: Request) -> Response:
        """Server-sent events from the bus; `?history=1` first replays the recent ones.

        At most MAX_EVENT_SUBSCRIBERS streams at once (503 beyond), of which API clients hold at most all
        but OWNER_EVENT_STREAMS (429 beyond); a subscriber that falls SUBSCRIBER_QUEUE events behind is
        dropped (its stream ends)."""
        owner = self._from_owner(request)
        client_share = MAX_EVENT_SUBSCRIBERS - OWNER_EVENT_STREAMS
        if not owner and self.client_subscribers >= client_share:
            return _error(
                429,
                f"API clients may hold at most {client_share} event streams at once, and hold them all; "
                f"{OWNER_EVENT_STREAMS} more are kept for the tray and the status page (the admin token or "
                "a status page login); close one and retry",
                "too_many_event_streams",
                retry_after=5,
                kind="rate_limit_error",
            )
        if self.subscribers >= MAX_EVENT_SUBSCRIBERS:
            return _error(
                503,
                f"too many event streams open ({MAX_EVENT_SUBSCRIBERS}); close one and retry",
                "too_many_subscribers",
                retry_after=5,
                kind="service_unavailable",
            )
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        history = request.query_params.get("history") in ("1", "true")
        overflowed = False

        def deliver(event: Event) -> None:  # on the loop
            nonlocal overflowed
            if overflowed:
                return
            if queue.qsize() >= SUBSCRIBER_QUEUE:
                overflowed = True
                queue.put_nowait(None)  # the end marker: this reader is too slow
                return
            queue.put_nowait(event)

        def listener(event: Event) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(deliver, event)

        remove = self.svc.bus.add_listener(listener)
        self.subscribers += 1
        self.client_subscribers += 0 if owner else 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                remove()
                self.subscribers -= 1
                self.client_subscribers -= 0 if owner else 1

        async def frames() -> AsyncIterator[bytes]:
            try:
                yield b": connected\n\n"
                if history:
                    for event in self.svc.bus.recent():
                        yield event_frame(event)
                while True:
                    try:
                        item = await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
                    except TimeoutError:
                        yield b": keepalive\n\n"
                        continue
                    if item is None:
                        yield b": dropped: this reader fell too far behind\n\n"
                        return
                    yield event_frame(item)
            finally:
                release()

        return StreamingResponse(
            frames(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
            background=BackgroundTask(release),  # also when the stream never started
        )

    def _from_owner(self, request: Request) -> bool:
        """The request carries the admin token (the tray, the commands) or a valid status page session:
        what the outer layer (server.http) takes for the owner on the admin routes."""
        header = admin_token.HEADER.lower().encode("ascii")
        sent = next((value for name, value in request.scope.get("headers", []) if name == header), None)
        if admin_token.matches(sent, self.svc.admin_token):
            return True
        return session.has_session(request.scope, self.svc.cfg.server, self.svc.signer.session_valid)

    async def worker_action(self, request: Request) -> Response:
        role, action = request.path_params["role"], request.path_params["action"]
        if role not in ROLES and role not in self.svc.workers:
            names = ", ".join([*ROLES, *(name for name in self.svc.workers if name not in ROLES)])
            return _error(404, f"unknown worker {role!r}; workers are {names}", "worker_not_found")
        worker = self.svc.workers.get(role)
        if worker is None:
            return _error(404, f"this service has no {role} worker", "worker_not_found")
        if action == "restart":
            await worker.restart("restart requested")
        elif action == "stop":
            await worker.stop()
        elif action == "start":
            await worker.start()
        else:
            return _error(404, f"unknown action {action!r}; use restart, stop or start", "not_found")
        return JSONResponse({"role": role, **self.svc.worker_status(role)})

    async def model_action(self, request: Request) -> Response:
        """Load a model now (on the GPU when it may and fits, making room; else the CPU), or unload one."""
        name, action = request.path_params["name"], request.path_params["action"]
        library = self.svc.library
        entry = library.catalog.find(name)
        if entry is None:
            names = ", ".join(library.catalog.names())
            return _error(404, f"no model {name!r}; models are {names}", "model_not_found")
        if action not in ("load", "unload"):
            return _error(404, f"unknown action {action!r}; use load or unload", "not_found")
        try:
            body = await _json_body(request)
        except ApiError as error:
            return Response(error.body_bytes(), status_code=error.status, media_type="application/json")
        if action == "unload":
            if entry.main:
                message = f"{entry.name} is the main model: its workers are always kept"
                return _error(409, message, "main_model")
            if not await library.unload(entry.name, if_idle=True):  # looked at again before each worker
                return _error(409, f"{entry.name} has requests in flight", "model_busy")
            return JSONResponse(self._model_status(entry.name))
        device = body.get("device", "auto")
        roles = library.roles(entry)
        if device == "auto":
            device = "gpu" if "gpu" in roles else "cpu"
        if device not in ("gpu", "cpu"):
            return _error(400, "'device' must be auto, gpu or cpu", "invalid_device", "device")
        try:
            ready = await library.load(entry, device, self.svc.cfg.supervisor.start_timeout)
        except LoadRefused as refused:
            return _error(409, str(refused), refused.code)
        if not ready:
            message = f"{entry.name} did not become ready on the {device.upper()}"
            return _error(503, message, "model_not_ready")
        return JSONResponse(self._model_status(entry.name))

    def _model_status(self, name: str) -> dict[str, Any]:
        statuses = self.svc.library.status(self.svc.plan_set, self.svc.jobs.in_flight)
        return dict(next(status for status in statuses if status["name"] == name))

    async def jobs(self, request: Request) -> Response:
        state = request.query_params.get("state")
        if state is not None and state not in STATES:
            return _error(
                400, f"unknown state {state!r}; states are {', '.join(STATES)}", "invalid_state", "state"
            )
        jobs = [
            {key: value for key, value in job.summary().items() if key != "result"}
            for job in self.svc.jobs.by_state(state)
        ]
        return JSONResponse({"object": "list", "data": jobs})

    async def job_action(self, request: Request) -> Response:
        job_id, action = request.path_params["job_id"], request.path_params["action"]
        job = self.svc.jobs.get(job_id)
        if job is None:
            return _error(404, f"no live job {job_id}", "job_not_found")
        if action not in ("approve", "reject", "stand-in"):
            return _error(404, f"unknown action {action!r}; use approve, reject or stand-in", "not_found")
        if job.state != "awaiting_approval":
            return _error(409, f"job {job_id} is {job.state}, not awaiting approval", "not_awaiting_approval")
        if action == "stand-in":
            # The user picked the smaller model on the GPU now over the big one on the CPU later.
            if not await self.svc.jobs.pick_stand_in(job):
                return _error(409, f"job {job_id} has no stand-in that can answer now", "no_stand_in")
        elif action == "approve":
            self.svc.jobs.approve(job)
        else:
            self.svc.jobs.reject(job)
        return JSONResponse({"object": "job", **job.summary()})

    async def approve_all(self, request: Request) -> Response:
        approved = [
            job.id for job in self.svc.jobs.by_state("awaiting_approval") if self.svc.jobs.approve(job)
        ]
        return JSONResponse({"approved": approved})

    async def show_config(self, request: Request) -> Response:
        cfg = self.svc.cfg
        return JSONResponse(
            {
                "config": config.public_view(cfg),  # in effect: the file, then command-line overrides
                "file": config.public_view(await asyncio.to_thread(config.load, Path(cfg.source)))
                if cfg.source
                else None,
                "source": cfg.source,
                "overrides": cfg.overrides,  # set on the command line: they win over the file
                "live": [
                    f"{section}.{key}"
                    for section, values in cfg.to_dict().items()
                    for key in values
                    if config.is_live(section, key)
                ],
            }
        )

    async def change_config(self, request: Request) -> Response:
        """PATCH `{"changes": {"section": {"key": value}}, "restart": false}`: the service writes its own
        config file and takes the change over; the answer says what applied and what waits for a restart."""
        try:
            body = await _json_body(request)
        except ApiError as error:
            return Response(error.body_bytes(), status_code=error.status, media_type="application/json")
        changes = body.get("changes")
        refused = config.file_only(changes) if isinstance(changes, dict) else []
        if refused:
            where = self.svc.cfg.source or "config.toml"
            return _error(
                403,
                f"{', '.join(refused)}: set in the config file only ({where}), "
                "not over HTTP: programs, model and template files, server.host and server.api_key are "
                "written by the user, then POST /failsoft/config/reload",
                "file_only_setting",
                refused[0],
            )
        if not isinstance(changes, dict) or not all(isinstance(v, dict) for v in changes.values()):
            return _error(
                400, "'changes' must be an object of sections and keys", "invalid_request", "changes"
            )
        if not isinstance(body.get("restart", False), bool):
            return _error(400, "'restart' must be true or false", "invalid_request", "restart")
        try:
            change, changed = await self.svc.change_config(changes, restart=bool(body.get("restart")))
        except (config.ConfigError, ValueError) as error:
            return _error(400, str(error), "invalid_config")
        overridden = [name for name in changed if name in self.svc.cfg.overrides]
        return JSONResponse(
            {
                "changed": changed,
                "applied": change.applied,
                "needs_restart": change.needs_restart,
                "restarted": change.restarted,
                "overridden": overridden,  # changed in the file, but a command-line value still wins
            }
        )

    async def reload_config(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
            fresh = config.apply_overrides(
                config.load(Path(self.svc.cfg.source) if self.svc.cfg.source else None),
                self.svc.cfg.overrides,
            )
        except ApiError as error:
            return Response(error.body_bytes(), status_code=error.status, media_type="application/json")
        except config.ConfigError as error:
            return _error(400, str(error), "invalid_config")
        if not isinstance(body.get("restart", False), bool):
            return _error(400, "'restart' must be true or false", "invalid_request", "restart")
        try:
            change = await self.svc.take_config(fresh, restart=bool(body.get("restart")))
        except (config.ConfigError, ValueError) as error:  # e.g. a model file that is not a GGUF
            return _error(400, str(error), "invalid_config")
        applied, needs_restart, restarted = change.applied, change.needs_restart, change.restarted
        if needs_restart:
            note = "restart the service to apply needs_restart"
        elif restarted:
            note = "workers restarted with the new config"
        else:
            note = ""
        return JSONResponse(
            {
                "applied": applied,
                "needs_restart": needs_restart,
                "restarted": restarted,
                "restart_requested": bool(body.get("restart")),
                "note": note,
            }
        )

    async def faults(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
        except ApiError as error:
            return Response(error.body_bytes(), status_code=error.status, media_type="application/json")
        role = body.get("role", "gpu")
        kind = body.get("kind")
        after = body.get("after_tokens", 0)
        if not isinstance(role, str) or self.svc.workers.get(role) is None:
            return _error(400, f"no {role!r} worker to arm", "invalid_role", "role")
        if kind not in FAULT_KINDS:
            return _error(400, f"'kind' must be one of {', '.join(FAULT_KINDS)}", "invalid_fault", "kind")
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            return _error(400, "'after_tokens' must be an integer >= 0", "invalid_fault", "after_tokens")
        worker = self.svc.workers[role]
        if kind == "kill" and after == 0:
            pid = worker.pid
            if pid is None:
                return _error(409, f"the {role} worker is not running", "worker_not_running")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            return JSONResponse({"role": role, "kind": kind, "pid": pid})
        try:
            await worker.arm_fault(kind, after)
        except RuntimeError as error:  # the worker cannot take it now (its supervisor says why)
            return _error(409, str(error), "worker_not_ready")
        return JSONResponse({"role": role, "kind": kind, "after_tokens": after, "pid": worker.pid})

    async def pressure(self, request: Request) -> Response:
        """Take simulated VRAM (`{"take": "1GiB", "label": "x"}`) or give it back (`{"release": label}`): on
        the simulated GPU's ledger, under the service's pid, as another program would (`failsoft hog`)."""
        device = self.svc.simulated_device
        if device is None:
            return _error(409, "pressure needs a simulated GPU (--simulate-vram)", "not_simulated")
        try:
            body = await _json_body(request)
            if "release" in body:
                released = device.release(str(body["release"]))
                result: dict[str, Any] = {"released": released}
            else:
                size = parse_size(str(body.get("take", "")))
                device.take(str(body.get("label", "pressure")), size)
                result = {"taken": size}
        except ApiError as error:
            return Response(error.body_bytes(), status_code=error.status, media_type="application/json")
        except MemoryError as error:
            return _error(409, str(error), "insufficient_vram")
        except ValueError as error:
            return _error(400, str(error), "invalid_size", "take")
        plan_set = await self.svc.read_device()  # the watcher reads the ledger now; a plan follows a move
        return JSONResponse({**result, "held": device.held(), "plan": plan_set.gpu.to_dict()})
