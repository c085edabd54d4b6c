"""A generic JSON webhook (Home Assistant, n8n, a script of one's own): the message, its actions as links,
and the events it was made of (as /failsoft/events sends them: no prompt text), in one POST."""

from __future__ import annotations

from typing import Any

import httpx

from tray_app.reach.channels import post_json
from tray_app.reach.message import Message


def payload(message: Message) -> dict[str, Any]:
    return {
        "source": "failsoft",
        "title": message.title,
        "message": message.body,
        "level": message.level,
        "actions": [
            {"label": action.label, "url": action.url, "method": action.method} for action in message.actions
        ],
        "events": list(message.events),
    }


class WebhookChannel:
    def __init__(self, url: str, token: str, client: httpx.AsyncClient) -> None:
        self.url = url
        self.token = token
        self.client = client

    async def send(self, message: Message) -> None:
        await post_json(self.client, self.url, payload(message), self.token)
