"""What a drill needs from the service's HTTP API: requests as a client sends them (seeing every chunk and
whether the connection ended cleanly), the control API (status, faults, pressure, job records) and a
recorder of the server-sent event stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import httpx

from tray_app.contract.status import ServiceStatus
from tray_app.contract.vocabulary import FINAL_JOB_STATES
from tray_app.host.launch import workers_ready
from tray_app.reach import admin_token

REQUEST_TIMEOUT = 600.0
# The drill is a patient client: it tells the service (X-Failsoft-Deadline) that it will wait this long, so a
# busy machine's slow CPU estimate still fits and the replay decision is the one the drill means to test.
CLIENT_DEADLINE = 600.0


class DrillError(RuntimeError):
    """The drill itself could not go on (the service refused a control call, a wait ran out)."""


@dataclass
class Answer:
    """What one client request received, streamed or not."""

    job_id: str = ""
    status: int = 0
    streamed: bool = False
    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    failsoft: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    finish_reasons: int = 0  # chunks carrying a finish_reason (more than one: answered twice)
    failsoft_chunks: int = 0  # stream chunks carrying the failsoft object
    done_markers: int = 0  # `data: [DONE]` lines
    chunks: int = 0
    connection_ok: bool = False  # the response ended the way the protocol says (not reset, not cut off)
    transport_error: str = ""
    started_at: float = 0.0
    first_content_at: float | None = None
    content_at: list[float] = field(default_factory=list)  # when each chunk with text arrived
    prompt_tokens: int = 0  # the usage's, where the request asked for it (stream_options.include_usage)
    ended_at: float = 0.0

    @property
    def answered(self) -> bool:
        return self.failsoft is not None and self.error is None

    @property
    def controlled_error(self) -> bool:
        """An OpenAI-format error with a code: the service ended the job on purpose and said why."""
        return bool(self.error and self.error.get("code"))

    def answers_seen(self) -> int:
        """How many final answers reached the client (exactly one is right)."""
        if not self.streamed:
            return 1 if self.answered else 0
        return max(self.failsoft_chunks, self.done_markers if self.error is None else 0)


def _apply_chunk(answer: Answer, obj: dict[str, Any]) -> None:
    if "error" in obj:
        answer.error = obj["error"] if isinstance(obj["error"], dict) else {"message": str(obj["error"])}
        return
    answer.chunks += 1
    usage = obj.get("usage") or {}
    answer.prompt_tokens = int(usage.get("prompt_tokens") or answer.prompt_tokens)
    if obj.get("failsoft"):
        answer.failsoft = obj["failsoft"]
        answer.failsoft_chunks += 1
    for choice in obj.get("choices") or []:
        if choice.get("finish_reason"):
            answer.finish_reasons += 1
        delta = choice.get("delta") or {}
        content = delta.get("content") or choice.get("text")
        if content:
            answer.text += content
            answer.content_at.append(time.time())
            answer.first_content_at = answer.first_content_at or answer.content_at[-1]
        for call in delta.get("tool_calls") or []:
            _merge_tool_call(answer.tool_calls, call)


def _merge_tool_call(calls: list[dict[str, Any]], delta: dict[str, Any]) -> None:
    index = int(delta.get("index", 0))
    while len(calls) <= index:
        calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
    entry = calls[index]
    entry["id"] = delta.get("id") or entry["id"]
    function = delta.get("function") or {}
    entry["function"]["name"] = function.get("name") or entry["function"]["name"]
    entry["function"]["arguments"] += function.get("arguments") or ""


class ServiceClient:
    def __init__(
        self, base_url: str, api_key: str = "", deadline: float = CLIENT_DEADLINE, admin: str = ""
    ) -> None:
        """`admin`: the control API's token (default: the one found on this machine, sent only to the local
        service's own address: admin_token.for_url)."""
        self.base_url = base_url.rstrip("/")
        self.deadline = deadline
        headers = {
            "X-Failsoft-Deadline": str(int(deadline)),
            **admin_token.headers(admin or admin_token.for_url(self.base_url)),
        }
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(REQUEST_TIMEOUT, connect=10.0),
            # Shorter than llama-server's 5 s keep-alive (the bench asks workers directly with it too).
            limits=httpx.Limits(max_connections=32, keepalive_expiry=2.0),
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    # ------------------------------------------------------------------------------- control API
    async def _json(
        self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 30.0
    ) -> dict[str, Any]:
        response = await self.http.request(method, path, json=body, timeout=timeout)
        try:
            data: dict[str, Any] = response.json()
        except ValueError:
            data = {"error": {"message": response.text}}
        if response.status_code >= 400:
            message = (data.get("error") or {}).get("message", response.text)
            raise DrillError(f"{method} {path} answered {response.status_code}: {message}")
        return data

    async def status(self) -> ServiceStatus:
        return cast(ServiceStatus, await self._json("GET", "/failsoft/status"))

    async def arm(self, kind: str, after_tokens: int, role: str = "gpu") -> dict[str, Any]:
        await self.wait_ready()
        return await self._json(
            "POST", "/failsoft/debug/faults", {"role": role, "kind": kind, "after_tokens": after_tokens}
        )

    async def pressure(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._json("POST", "/failsoft/debug/pressure", body)

    async def model_action(
        self, name: str, action: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """`POST /failsoft/models/{name}/load` (body: {"device": ...}) or `/unload`; the model's status."""
        # A load waits for the worker to be ready (the service's start timeout), longer than a control call.
        return await self._json("POST", f"/failsoft/models/{name}/{action}", body or {}, REQUEST_TIMEOUT)

    async def worker_action(self, role: str, action: str) -> dict[str, Any]:
        """`POST /failsoft/workers/{role}/{action}` (stop, start, restart); the worker's status. A start waits
        for the worker to be ready, longer than a control call."""
        return await self._json("POST", f"/failsoft/workers/{role}/{action}", {}, REQUEST_TIMEOUT)

    async def jobs(self) -> list[dict[str, Any]]:
        """The jobs the service holds (`GET /failsoft/jobs`), without their results."""
        data: list[dict[str, Any]] = (await self._json("GET", "/failsoft/jobs"))["data"]
        return data

    async def job(self, job_id: str) -> dict[str, Any]:
        return await self._json("GET", f"/v1/jobs/{job_id}")

    async def wait_for(
        self, probe: Callable[[], Any], what: str, timeout: float, interval: float = 0.05
    ) -> Any:
        """Poll the async `probe` until it returns something truthy."""
        deadline = time.monotonic() + timeout
        while True:
            value = await probe()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise DrillError(f"timed out after {timeout:.0f}s waiting for {what}")
            await asyncio.sleep(interval)

    async def wait_ready(self, timeout: float = 120.0) -> ServiceStatus:
        async def probe() -> ServiceStatus | None:
            status = await self.status()
            return status if workers_ready(status) else None

        result: ServiceStatus = await self.wait_for(probe, "both workers to be ready", timeout, 0.1)
        return result

    async def wait_job_final(self, job_id: str, timeout: float = 60.0) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            record = await self.job(job_id)
            return record if record.get("state") in FINAL_JOB_STATES else None

        result: dict[str, Any] = await self.wait_for(probe, f"job {job_id} to end", timeout, 0.1)
        return result

    # ------------------------------------------------------------------------------- requests
    async def chat(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> Answer:
        """A non-streamed chat completion, as a plain client sends it."""
        answer = Answer(started_at=time.time())
        try:
            response = await self.http.post("/v1/chat/completions", json=body, headers=headers)
        except httpx.HTTPError as error:
            answer.transport_error = repr(error)
            answer.ended_at = time.time()
            return answer
        answer.ended_at = time.time()
        answer.status = response.status_code
        answer.job_id = response.headers.get("x-failsoft-job", "")
        try:
            data = response.json()
        except ValueError:
            answer.transport_error = f"not JSON: {response.text[:200]}"
            return answer
        answer.connection_ok = True
        if response.status_code >= 400 or "error" in data:
            answer.error = data.get("error") or {"message": response.text}
            return answer
        message = (data.get("choices") or [{}])[0].get("message") or {}
        answer.text = message.get("content") or ""
        answer.tool_calls = message.get("tool_calls") or []
        answer.failsoft = data.get("failsoft")
        answer.finish_reasons = sum(1 for choice in data.get("choices") or [] if choice.get("finish_reason"))
        return answer

    async def stream_chat(
        self,
        body: dict[str, Any],
        *,
        stop_after: Callable[[Answer], Any] | None = None,
        on_open: Callable[[str], None] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        """A streamed chat completion. `stop_after(answer)` is awaited after each chunk; a truthy result
        closes the connection there (a client that goes away). `on_open(job_id)` runs on the headers."""
        answer = Answer(streamed=True, started_at=time.time())
        body = {**body, "stream": True}
        try:
            async with self.http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as rsp:
                answer.status = rsp.status_code
                answer.job_id = rsp.headers.get("x-failsoft-job", "")
                if on_open is not None:
                    on_open(answer.job_id)
                if rsp.status_code >= 400:
                    raw = await rsp.aread()
                    try:
                        answer.error = json.loads(raw)["error"]
                    except (ValueError, KeyError, TypeError):
                        answer.error = {"message": f"HTTP {rsp.status_code}: {raw[:200]!r}"}
                    answer.connection_ok = True
                    return answer
                async for line in rsp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    payload = line[len("data: ") :]
                    if payload == "[DONE]":
                        answer.done_markers += 1
                        continue
                    _apply_chunk(answer, json.loads(payload))
                    if stop_after is not None and await stop_after(answer):
                        answer.connection_ok = True  # closed by this client, on purpose
                        return answer
                answer.connection_ok = answer.done_markers > 0
        except httpx.HTTPError as error:
            answer.transport_error = repr(error)
        finally:
            answer.ended_at = time.time()
        return answer


@dataclass
class Event:
    type: str
    data: dict[str, Any]

    @property
    def at(self) -> float:
        return float(self.data.get("at") or 0.0)


class EventLog:
    """Records the service's /failsoft/events stream in the background; scenarios read it by job and time."""

    def __init__(self, client: ServiceClient) -> None:
        self.client = client
        self.events: list[Event] = []
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._read(), name="drill-events")
        await asyncio.wait_for(self._connected.wait(), 30)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            # A stream the service already closed (it is stopping) ends the recording just the same.
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await self._task

    async def _read(self) -> None:
        kind = ""
        timeout = httpx.Timeout(10.0, read=None)
        async with self.client.http.stream("GET", "/failsoft/events", timeout=timeout) as response:
            self._connected.set()
            async for line in response.aiter_lines():
                if line.startswith("event: "):
                    kind = line[len("event: ") :]
                elif line.startswith("data: "):
                    data = json.loads(line[len("data: ") :])
                    async with self._changed:
                        self.events.append(Event(kind or str(data.get("type")), data))
                        self._changed.notify_all()

    def for_job(self, job_id: str) -> list[Event]:
        return [event for event in self.events if event.data.get("job_id") == job_id]

    def between(self, start: float, end: float, types: tuple[str, ...]) -> list[Event]:
        return [event for event in self.events if event.type in types and start <= event.at <= end]

    async def wait(self, match: Callable[[Event], bool], timeout: float, what: str) -> Event:
        """The first recorded event that `match`es, waiting up to `timeout` seconds for it to arrive."""
        async with self._changed:
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: _first(self.events, match) is not None), timeout
                )
            except TimeoutError:
                raise DrillError(f"timed out after {timeout:.0f}s waiting for {what}") from None
            event = _first(self.events, match)
        assert event is not None
        return event


def _first(events: list[Event], match: Callable[[Event], bool]) -> Event | None:
    return next((event for event in events if match(event)), None)
