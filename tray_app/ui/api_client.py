"""HTTP to the service without ever blocking the GUI thread.

Everything goes through one QNetworkAccessManager: requests are asynchronous and their answers come back as
Qt signals on the GUI thread's event loop, so no widget waits on the network. Three kinds of calls:

- `ApiCall`: one JSON request and its answer (`succeeded(object)` or `failed(str)`);
- `EventStream`: the `/failsoft/events` server-sent event stream, reconnecting with backoff when it drops;
- `ChatStream`: one streamed `/v1/chat/completions`, token by token, with the final `failsoft` object.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from PySide6.QtCore import QByteArray, QObject, QTimer, QUrl, Signal
from PySide6.QtNetwork import QNetworkAccessManager, QNetworkProxy, QNetworkReply, QNetworkRequest

from tray_app.reach import admin_token

log = logging.getLogger(__name__)

CONTROL_TIMEOUT_MS = 15_000
RESTART_TIMEOUT_MS = 180_000  # a reload with restart answers once both workers loaded again
LOAD_TIMEOUT_MS = 180_000  # a model's load answers once its workers loaded
RECONNECT_DELAYS_MS = (500, 1000, 2000, 5000)


@dataclass(frozen=True)
class SseMessage:
    event: str
    data: str


class SseParser:
    """Incremental server-sent events parser: feed bytes as they arrive, get whole messages back."""

    def __init__(self) -> None:
        self._buffer = b""
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[SseMessage]:
        self._buffer += chunk
        messages: list[SseMessage] = []
        while (end := self._buffer.find(b"\n")) >= 0:
            # A newline byte never occurs inside a multi-byte UTF-8 sequence, so decoding per line is safe.
            line = self._buffer[:end].rstrip(b"\r").decode("utf-8", "replace")
            self._buffer = self._buffer[end + 1 :]
            if not line:
                if self._data:
                    messages.append(SseMessage(self._event or "message", "\n".join(self._data)))
                self._event, self._data = "", []
            elif not line.startswith(":"):  # a leading colon is a comment (keep-alive)
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "event":
                    self._event = value
                elif name == "data":
                    self._data.append(value)
        return messages


def error_message(body: bytes, status: int | None, fallback: str) -> str:
    """The message of an OpenAI-format error body, else the HTTP status and transport error."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if data.get("detail"):
            return str(data["detail"])
    if status:
        text = body.decode("utf-8", "replace").strip()[:200]
        return f"HTTP {status}: {text or fallback}"
    return fallback


def error_payload(body: bytes) -> dict[str, Any]:
    """The `error` object of an OpenAI-format error body, or {}."""
    try:
        data = json.loads(body)
    except ValueError:
        return {}
    error = data.get("error") if isinstance(data, dict) else None
    return error if isinstance(error, dict) else {}


def _status_code(reply: QNetworkReply) -> int | None:
    value = reply.attribute(QNetworkRequest.Attribute.HttpStatusCodeAttribute)
    return int(value) if value is not None else None


class ApiCall(QObject):
    """One request/answer. Emits exactly one of `succeeded(parsed JSON)` or `failed(message)`."""

    succeeded = Signal(object)
    failed = Signal(str)

    def __init__(self, reply: QNetworkReply, parent: QObject) -> None:
        super().__init__(parent)
        self.status: int | None = None
        self.error: dict[str, Any] = {}
        self._reply = reply
        reply.finished.connect(self._finished)

    def _finished(self) -> None:
        reply = self._reply
        self.status = _status_code(reply)
        body = bytes(reply.readAll().data())
        if self.status is None or self.status >= 400:
            self.error = error_payload(body)
            message = error_message(body, self.status, reply.errorString())
            self.failed.emit(message)
        else:
            try:
                data: Any = json.loads(body) if body.strip() else {}
            except ValueError:
                data = body.decode("utf-8", "replace")
            self.succeeded.emit(data)
        reply.deleteLater()
        self.deleteLater()


class ServiceClient(QObject):
    """The service's HTTP API (docs/architecture.md), asynchronously."""

    def __init__(
        self, base_url: str, api_key: str = "", parent: QObject | None = None, admin: str = ""
    ) -> None:
        super().__init__(parent)
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self._admin = admin  # the control API's token; "": read from the data folder when first needed
        self.manager = QNetworkAccessManager(self)
        # The service is on loopback or the LAN: a desktop proxy setting must not reroute it.
        self.manager.setProxy(QNetworkProxy(QNetworkProxy.ProxyType.NoProxy))

    def request(
        self, path: str, timeout_ms: int = CONTROL_TIMEOUT_MS, *, as_owner: bool = False
    ) -> QNetworkRequest:
        """`as_owner`: send the admin token on a read-only view too (the event stream: streams are kept
        for the owner that API clients cannot take)."""
        request = QNetworkRequest(QUrl(self.base_url + path))
        request.setTransferTimeout(timeout_ms)
        if self.api_key:
            request.setRawHeader(b"Authorization", f"Bearer {self.api_key}".encode())
        if as_owner or admin_token.sent_by_owner(path.partition("?")[0]):
            # Read late: an in-process service writes the file as it starts, after this client exists. A
            # token found on this machine goes to the local service's own address only (--attach elsewhere
            # sends one only when named: --admin-token).
            self._admin = self._admin or admin_token.for_url(self.base_url)
            if self._admin:
                request.setRawHeader(admin_token.HEADER.encode(), self._admin.encode())
        return request

    def get(self, path: str) -> ApiCall:
        return ApiCall(self.manager.get(self.request(path)), self)

    def post(
        self, path: str, body: dict[str, Any] | None = None, timeout_ms: int = CONTROL_TIMEOUT_MS
    ) -> ApiCall:
        request = self.request(path, timeout_ms)
        request.setHeader(QNetworkRequest.KnownHeaders.ContentTypeHeader, "application/json")
        payload = QByteArray(json.dumps(body or {}).encode())
        return ApiCall(self.manager.post(request, payload), self)

    # The control API, by name.
    def status(self) -> ApiCall:
        return self.get("/failsoft/status")

    def worker_action(self, role: str, action: str) -> ApiCall:
        """`action` is restart, stop or start."""
        return self.post(f"/failsoft/workers/{role}/{action}")

    def gpu_action(self, action: str) -> ApiCall:
        """`yield` (answered at once; the GPU workers stop once their jobs finished) or `resume`."""
        return self.post(f"/failsoft/gpu/{action}", {"wait": False} if action == "yield" else {})

    def device_history(self) -> ApiCall:
        """The device watcher's readings of the last 15 minutes, with the timeline's markers."""
        return self.get("/failsoft/device/history")

    def load_model(self, name: str, device: str = "auto") -> ApiCall:
        """`device` is auto, gpu or cpu; answers the model's status once it is loaded."""
        return self.post(f"/failsoft/models/{quote(name, safe='')}/load", {"device": device}, LOAD_TIMEOUT_MS)

    def unload_model(self, name: str) -> ApiCall:
        return self.post(f"/failsoft/models/{quote(name, safe='')}/unload")

    def awaiting_approval(self) -> ApiCall:
        return self.get("/failsoft/jobs?state=awaiting_approval")

    def approve(self, job_id: str) -> ApiCall:
        return self.post(f"/failsoft/jobs/{job_id}/approve")

    def job_action(self, job_id: str, action: str) -> ApiCall:
        """approve, reject, or stand-in (the smaller model answers on the GPU now)."""
        return self.post(f"/failsoft/jobs/{job_id}/{action}")

    def reject(self, job_id: str) -> ApiCall:
        return self.post(f"/failsoft/jobs/{job_id}/reject")

    def approve_all(self) -> ApiCall:
        return self.post("/failsoft/jobs/approve-all")

    def config(self) -> ApiCall:
        """The config in effect and the file's own values (`GET /failsoft/config`)."""
        return self.get("/failsoft/config")

    def change_config(self, changes: dict[str, dict[str, Any]], restart: bool = False) -> ApiCall:
        """The service writes its config file and takes the change over (`PATCH /failsoft/config`)."""
        request = self.request("/failsoft/config", RESTART_TIMEOUT_MS if restart else CONTROL_TIMEOUT_MS)
        request.setHeader(QNetworkRequest.KnownHeaders.ContentTypeHeader, "application/json")
        payload = QByteArray(json.dumps({"changes": changes, "restart": restart}).encode())
        return ApiCall(self.manager.sendCustomRequest(request, QByteArray(b"PATCH"), payload), self)

    def reload_config(self, restart: bool) -> ApiCall:
        timeout = RESTART_TIMEOUT_MS if restart else CONTROL_TIMEOUT_MS
        return self.post("/failsoft/config/reload", {"restart": restart}, timeout)

    def job(self, job_id: str) -> ApiCall:
        return self.get(f"/v1/jobs/{job_id}")

    def cancel_job(self, job_id: str) -> ApiCall:
        return ApiCall(self.manager.deleteResource(self.request(f"/v1/jobs/{job_id}")), self)

    def events(self) -> EventStream:
        return EventStream(self)

    def chat(
        self, messages: list[dict[str, Any]], max_tokens: int, deadline: float | None = None
    ) -> ChatStream:
        return ChatStream(self, messages, max_tokens, deadline)


class EventStream(QObject):
    """`/failsoft/events` as Qt signals; reconnects with backoff until `stop()`."""

    event_received = Signal(dict)
    connection_changed = Signal(bool)

    def __init__(self, client: ServiceClient) -> None:
        super().__init__(client)
        self._client = client
        self._reply: QNetworkReply | None = None
        self._parser = SseParser()
        self._stopped = True
        self._attempt = 0
        self.connected = False
        self._retry = QTimer(self)
        self._retry.setSingleShot(True)
        self._retry.timeout.connect(self._open)

    def start(self) -> None:
        self._stopped = False
        self._open()

    def stop(self) -> None:
        self._stopped = True
        self._retry.stop()
        reply, self._reply = self._reply, None
        if reply is not None:
            reply.abort()
            reply.deleteLater()
        self._set_connected(False)

    def retry_now(self) -> None:
        """Skip the rest of the backoff (e.g. the service was just started)."""
        if not self._stopped and self._reply is None:
            self._retry.stop()
            self._open()

    def _open(self) -> None:
        if self._stopped:
            return
        request = self._client.request("/failsoft/events", timeout_ms=0, as_owner=True)
        request.setRawHeader(b"Accept", b"text/event-stream")
        request.setAttribute(
            QNetworkRequest.Attribute.CacheLoadControlAttribute,
            QNetworkRequest.CacheLoadControl.AlwaysNetwork,
        )
        self._parser = SseParser()
        reply = self._client.manager.get(request)
        reply.metaDataChanged.connect(lambda: self._on_headers(reply))
        reply.readyRead.connect(lambda: self._on_data(reply))
        reply.finished.connect(lambda: self._on_finished(reply))
        self._reply = reply

    def _on_headers(self, reply: QNetworkReply) -> None:
        if reply is self._reply and _status_code(reply) == 200:
            self._attempt = 0
            self._set_connected(True)

    def _on_data(self, reply: QNetworkReply) -> None:
        if reply is not self._reply:
            return
        for message in self._parser.feed(bytes(reply.readAll().data())):
            try:
                data = json.loads(message.data)
            except ValueError:
                log.warning("event %s with data that is not JSON: %.200s", message.event, message.data)
                continue
            if isinstance(data, dict):
                data.setdefault("type", message.event)
                self.event_received.emit(data)

    def _on_finished(self, reply: QNetworkReply) -> None:
        reply.deleteLater()
        if reply is not self._reply:
            return
        self._reply = None
        self._set_connected(False)
        if not self._stopped:
            delay = RECONNECT_DELAYS_MS[min(self._attempt, len(RECONNECT_DELAYS_MS) - 1)]
            self._attempt += 1
            log.info("event stream closed (%s); reconnecting in %d ms", reply.errorString(), delay)
            self._retry.start(delay)

    def _set_connected(self, connected: bool) -> None:
        if connected != self.connected:
            self.connected = connected
            self.connection_changed.emit(connected)


class ChatStream(QObject):
    """One streamed chat completion. Signals, in order: `started(headers)`, `thinking(text)`* and
    `delta(text)`*, then exactly one of `finished(failsoft_info)`, `failed(message, error_object)` or
    `stopped()`."""

    started = Signal(dict)
    delta = Signal(str)
    thinking = Signal(str)  # a thinking model's reasoning, before (and apart from) its answer
    finished = Signal(dict)
    failed = Signal(str, dict)
    stopped = Signal()

    def __init__(
        self,
        client: ServiceClient,
        messages: list[dict[str, Any]],
        max_tokens: int,
        deadline: float | None = None,
    ) -> None:
        super().__init__(client)
        self.request_id = f"chat-{uuid.uuid4().hex[:16]}"
        self.failsoft: dict[str, Any] = {}
        self.usage: dict[str, Any] = {}
        self.chunks = 0
        self._done = False
        self._stopping = False
        self._parser = SseParser()
        self._error_body = b""
        request = client.request("/v1/chat/completions", timeout_ms=0)
        request.setHeader(QNetworkRequest.KnownHeaders.ContentTypeHeader, "application/json")
        request.setRawHeader(b"Accept", b"text/event-stream")
        request.setRawHeader(b"X-Request-Id", self.request_id.encode())
        if deadline:
            request.setRawHeader(b"X-Failsoft-Deadline", str(deadline).encode())
        # The token counts come in the last chunk: the chat window shows how much of a request's context the
        # conversation already takes.
        body = {
            "messages": messages,
            "stream": True,
            "max_tokens": max_tokens,
            "stream_options": {"include_usage": True},
        }
        self._reply = client.manager.post(request, QByteArray(json.dumps(body).encode()))
        self._reply.metaDataChanged.connect(self._on_headers)
        self._reply.readyRead.connect(self._on_data)
        self._reply.finished.connect(self._on_finished)

    def stop(self) -> None:
        """Close the connection: the service cancels the generation when its client goes away."""
        if not self._done:
            self._stopping = True
            self._reply.abort()

    def _is_error_status(self) -> bool:
        status = _status_code(self._reply)
        return status is not None and status >= 400

    def _on_headers(self) -> None:
        if self._is_error_status():
            return
        headers = {
            bytes(name.data()).decode().lower(): bytes(value.data()).decode()
            for name, value in self._reply.rawHeaderPairs()
        }
        self.started.emit(headers)

    def _on_data(self) -> None:
        data = bytes(self._reply.readAll().data())
        if self._is_error_status():
            self._error_body += data
            return
        for message in self._parser.feed(data):
            self._handle(message.data)

    def _handle(self, data: str) -> None:
        if self._done or data.strip() == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            log.warning("stream chunk that is not JSON: %.200s", data)
            return
        if not isinstance(chunk, dict):
            return
        if "error" in chunk:
            error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            self._finish_failed(str(error.get("message") or "the stream failed"), error)
            return
        if isinstance(chunk.get("failsoft"), dict):
            self.failsoft = chunk["failsoft"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content")
            if reasoning:
                self.chunks += 1
                self.thinking.emit(reasoning)
            text = delta.get("content")
            if text:
                self.chunks += 1
                self.delta.emit(text)

    def _finish_failed(self, message: str, error: dict[str, Any]) -> None:
        if not self._done:
            self._done = True
            self.failed.emit(message, error)

    def _on_finished(self) -> None:
        reply = self._reply
        if not self._stopping:
            self._on_data()  # the last chunks can arrive together with the end of the body
        reply.deleteLater()
        if self._done:
            return
        if self._stopping:
            self._done = True
            self.stopped.emit()
            return
        status = _status_code(reply)
        if status is None or status >= 400:
            body = self._error_body + bytes(reply.readAll().data())
            self._finish_failed(error_message(body, status, reply.errorString()), error_payload(body))
            return
        self._done = True
        self.finished.emit(self.failsoft)
