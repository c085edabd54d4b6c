"""The channel a `[[notify]]` table describes: ntfy, a webhook, or Apprise (its package loaded when used)."""

from __future__ import annotations

import httpx

from tray_app.config.notify import NotifyConfig
from tray_app.reach.apprise_channel import AppriseChannel
from tray_app.reach.channels import Channel
from tray_app.reach.ntfy import NtfyChannel
from tray_app.reach.webhook import WebhookChannel


def build(cfg: NotifyConfig, client: httpx.AsyncClient) -> Channel:
    """ChannelError when the table cannot make a channel (an ntfy url without a topic)."""
    if cfg.kind == "ntfy":
        return NtfyChannel(cfg.url, cfg.token, client)
    if cfg.kind == "webhook":
        return WebhookChannel(cfg.url, cfg.token, client)
    return AppriseChannel(cfg.url)
