"""ntfy (https://ntfy.sh or a self-hosted server): a JSON publish with action buttons. An "http" action
makes the phone send the request itself, so Approve works from the notification without opening anything.
The topic URL is split into its server (where the JSON goes) and the topic (a field of the JSON)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from tray_app.reach.channels import ChannelError, post_json
from tray_app.reach.message import Message

PRIORITY = {"info": 3, "warning": 4, "critical": 5}
TAGS = {"info": ["information_source"], "warning": ["warning"], "critical": ["rotating_light"]}


def split_topic(url: str) -> tuple[str, str]:
    """`https://ntfy.example/alerts` -> ("https://ntfy.example/", "alerts") (a server under a path too)."""
    base, _, topic = url.rstrip("/").rpartition("/")
    if not topic or "://" not in base:
        shown = _without_credentials(url)
        raise ChannelError(f"an ntfy url ends with its topic, e.g. https://ntfy.sh/my-topic (got {shown!r})")
    return base + "/", topic


def _without_credentials(url: str) -> str:
    """The URL with a user:password replaced: the error is shown in the status and the log."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="…@" + parts.netloc.rpartition("@")[2]))


def payload(message: Message, topic: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "topic": topic,
        "title": message.title,
        "message": message.body,
        "priority": PRIORITY.get(message.level, 3),
        "tags": TAGS.get(message.level, []),
    }
    actions = []
    for action in message.actions[:3]:  # ntfy shows at most three buttons
        if action.method == "GET":
            actions.append({"action": "view", "label": action.label, "url": action.url, "clear": False})
        else:
            actions.append(
                {
                    "action": "http",
                    "label": action.label,
                    "url": action.url,
                    "method": action.method,
                    "clear": True,
                }
            )
    if actions:
        body["actions"] = actions
    page = next((action.url for action in message.actions if action.method == "GET"), None)
    if page:
        body["click"] = page
    return body


class NtfyChannel:
    def __init__(self, url: str, token: str, client: httpx.AsyncClient) -> None:
        self.server, self.topic = split_topic(url)
        self.token = token
        self.client = client

    async def send(self, message: Message) -> None:
        await post_json(self.client, self.server, payload(message, self.topic), self.token)
