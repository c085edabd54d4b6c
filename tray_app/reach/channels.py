"""A notification channel: something that delivers a `Message` or says why it could not. ntfy and webhooks
are plain HTTP POSTs (built in); Apprise reaches the rest when its optional package is installed."""

from __future__ import annotations

from typing import Protocol

import httpx

from tray_app.reach.message import Message

SEND_TIMEOUT = 10.0  # a channel slower than this has failed; the job it tells about never waits for it


class ChannelError(Exception):
    """Delivery failed: the message says how (shown in /failsoft/status and the log)."""


class Channel(Protocol):
    async def send(self, message: Message) -> None:
        """Deliver `message`, or raise ChannelError."""
        ...


async def post_json(client: httpx.AsyncClient, url: str, body: object, token: str) -> None:
    """POST `body` as JSON; ChannelError on a refusal or no answer (never the token in the error)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = await client.post(url, json=body, headers=headers, timeout=SEND_TIMEOUT)
    except httpx.HTTPError as error:
        raise ChannelError(f"{type(error).__name__} posting to {_where(url)}: {error}") from None
    if response.status_code >= 300:
        text = response.text.strip().replace("\n", " ")[:200]
        raise ChannelError(f"{_where(url)} answered {response.status_code}: {text}")


def _where(url: str) -> str:
    """The server of a URL, not its path: an ntfy topic name is its only secret."""
    parsed = httpx.URL(url)
    return f"{parsed.scheme}://{parsed.host}" + (f":{parsed.port}" if parsed.port else "")
