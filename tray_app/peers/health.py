"""One look at a peer: `GET /health`, bounded in time and size, read as a Failsoft or a llama-server answer.

A Failsoft peer's body names its workers (`"workers": {"gpu": "ready", ...}`, server/health.py); a peer is
asked in place of the local GPU, so a Failsoft peer whose GPU worker is not ready is no use: its answer
would come from its CPU, slower than asking our own."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from tray_app.config.peers import PLAIN_HTTP_RULE, literal_address
from tray_app.peers.address import resolved_is_local

BODY_LIMIT = 64 * 1024  # a health answer is a few hundred bytes; a peer gone wrong must not fill memory


@dataclass(frozen=True)
class HealthAnswer:
    """What one probe found: ready, or the failure's kind and message; and the peer's GPU, where it says."""

    ready: bool
    kind: str  # "" when ready; else insecure, unreachable, unhealthy or peer_gpu_unavailable
    message: str
    gpu_ready: bool | None = None  # None: the server does not say (not a Failsoft), or it did not answer


async def ask_health(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], timeout: float
) -> HealthAnswer:
    """`GET {url}/health`, all of it (a name's resolution too) within `timeout` seconds."""
    host = urlsplit(url).hostname or ""
    named_over_plain_http = url.startswith("http:") and literal_address(host) is None
    try:
        async with asyncio.timeout(timeout):
            if named_over_plain_http and not await resolved_is_local(host):
                message = f"{host} resolves to a public address: {PLAIN_HTTP_RULE}"
                return HealthAnswer(False, "insecure", message)
            async with client.stream("GET", f"{url}/health", headers=headers, timeout=timeout) as response:
                body = await _read_at_most(response, BODY_LIMIT)
                status = response.status_code
    except (TimeoutError, httpx.TimeoutException):
        return HealthAnswer(False, "unreachable", f"no answer to GET /health within {timeout:g} s")
    except (httpx.HTTPError, httpx.InvalidURL, OSError) as error:
        return HealthAnswer(False, "unreachable", f"GET /health: {type(error).__name__}: {error}")
    if status != 200:
        return HealthAnswer(False, "unhealthy", f"GET /health answered {status}")
    gpu = failsoft_gpu_state(body)
    if gpu is None:
        return HealthAnswer(True, "", "ready")
    if gpu != "ready":
        message = f"its GPU worker is {gpu}: a peer stands in for a GPU, not for a CPU"
        return HealthAnswer(False, "peer_gpu_unavailable", message, gpu_ready=False)
    return HealthAnswer(True, "", "ready", gpu_ready=True)


def failsoft_gpu_state(body: bytes) -> str | None:
    """The state of a Failsoft peer's GPU worker ("absent" when it has none); None when the body is not a
    Failsoft health answer (llama-server's `{"status": "ok"}`, another server's, a cut-off one)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    workers = data.get("workers") if isinstance(data, dict) else None
    if not isinstance(workers, dict):
        return None
    state = workers.get("gpu")
    return state if isinstance(state, str) and state else "absent"


async def _read_at_most(response: httpx.Response, limit: int) -> bytes:
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) >= limit:
            break  # the rest is never read: leaving the stream closes the connection
    return bytes(body[:limit])
