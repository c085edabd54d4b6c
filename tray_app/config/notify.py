"""The `[[notify]]` tables of the config: where Failsoft sends a message when something needs a person
(a phone through ntfy, a webhook, anything Apprise reaches), which events, when not, and how often.

Kept apart from the sections (schema.py): validation.py calls `channels_from_config`, view.py `redacted`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

ChannelKind = Literal["ntfy", "webhook", "apprise"]
# What a channel may be told about, in the config's words; tray_app.reach.events maps events to them.
EventName = Literal["fallback", "approval", "worker_failed", "gpu_taken", "gpu_lost"]
EVENT_NAMES: tuple[str, ...] = get_args(EventName)
KINDS: tuple[str, ...] = get_args(ChannelKind)
_APPRISE_SCHEME = re.compile(r"(?:^|[,\s])\s*([A-Za-z][A-Za-z0-9+.-]*)://")  # one per URL of a list
_QUIET = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)$")


@dataclass
class NotifyConfig:
    """One `[[notify]]` table."""

    kind: ChannelKind = "ntfy"
    url: str = ""  # ntfy: the topic's URL; webhook: where the JSON goes; apprise: one or more Apprise URLs
    name: str = ""  # for status and the log; empty: the kind and its number
    token: str = ""  # sent as Authorization: Bearer (an ntfy access token, a webhook's secret)
    events: list[str] = field(default_factory=lambda: list(EVENT_NAMES))
    quiet_hours: str = ""  # "22:00-07:00" local time: held, then sent as one message when it ends
    coalesce_seconds: float = 10.0  # a burst within this many seconds goes out as one message
    # An approval's message quotes the prompt's opening (120 characters). Off by default: the channel may
    # be a third party's server (ntfy.sh, Apprise's services); without it, the model, size and reason only.
    preview: bool = False


def channels_from_config(source: str, value: Any) -> list[NotifyConfig]:
    """The `[[notify]]` tables checked: ConfigError-style ValueError messages naming file and key."""
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise ValueError(f"{source}: notify must be [[notify]] tables")
    channels = []
    for number, table in enumerate(value, 1):
        where = f"{source}: notify[{number}]"
        channel = NotifyConfig()
        for key, item in table.items():
            _set(channel, where, key, item)
        if not channel.url:
            raise ValueError(f"{where} needs a url")
        if channel.kind != "apprise" and urlsplit(channel.url).scheme not in ("http", "https"):
            raise ValueError(f"{where}.url = {channel.url!r} must be an http:// or https:// URL")
        channel.name = channel.name or f"{channel.kind}-{number}"
        channels.append(channel)
    names = [channel.name for channel in channels]
    if len(set(names)) < len(names):
        raise ValueError(f"{source}: two [[notify]] tables have the same name")
    return channels


def _set(channel: NotifyConfig, where: str, key: str, value: Any) -> None:
    if key == "kind":
        if value not in KINDS:
            raise ValueError(f"{where}.kind = {value!r} is not allowed; use one of {', '.join(KINDS)}")
    elif key in ("url", "name", "token", "quiet_hours"):
        if not isinstance(value, str):
            raise ValueError(f"{where}.{key} = {value!r} must be a string")
        if key == "quiet_hours" and value and quiet_window(value) is None:
            raise ValueError(f'{where}.quiet_hours = {value!r} must look like "22:00-07:00"')
    elif key == "events":
        unknown = [item for item in value if item not in EVENT_NAMES] if isinstance(value, list) else [value]
        if unknown:
            raise ValueError(f"{where}.events: {unknown!r}: use some of {', '.join(EVENT_NAMES)}")
        value = list(value)
    elif key == "preview":
        if not isinstance(value, bool):
            raise ValueError(f"{where}.preview = {value!r} must be true or false")
    elif key == "coalesce_seconds":
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"{where}.coalesce_seconds = {value!r} must be a number >= 0")
        value = float(value)
    else:
        keys = "kind, url, name, token, events, quiet_hours, coalesce_seconds, preview"
        raise ValueError(f"{where}: unknown key {key!r}; keys are {keys}")
    setattr(channel, key, value)


def quiet_window(text: str) -> tuple[int, int] | None:
    """ "22:00-07:00" as (start, end) minutes after midnight; None when it is not such a window."""
    match = _QUIET.match(text.strip())
    if match is None:
        return None
    hour_a, minute_a, hour_b, minute_b = (int(group) for group in match.groups())
    return hour_a * 60 + minute_a, hour_b * 60 + minute_b


def public_url_error(url: str) -> str | None:
    """What is wrong with `server.public_url` (None: nothing): an http(s) URL with a host and no query."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        return "must be an http:// or https:// URL with a host, e.g. https://ai-box.example.org"
    return None


def destination(channel: NotifyConfig) -> str:
    """Where a channel sends, safe to show: an http(s) URL's scheme, host and port (an ntfy topic, a
    webhook's path and a user:password are its secrets). Of Apprise URLs only the services' schemes: many
    carry a token where a host would be (pover://user@token, slack://TokenA/TokenB/TokenC)."""
    if channel.kind == "apprise":
        schemes = _APPRISE_SCHEME.findall(channel.url)
        return ", ".join(f"{scheme}://…" for scheme in dict.fromkeys(schemes)) or "apprise URL"
    parts = urlsplit(channel.url)
    host = parts.hostname
    if not host:
        return f"{channel.kind} URL"
    try:
        port = parts.port
    except ValueError:  # checked on load for its scheme only
        port = None
    host = f"[{host}]" if ":" in host else host  # an IPv6 address
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


def redacted(channels: list[NotifyConfig]) -> list[dict[str, Any]]:
    """The channels as the control API shows them: tokens and URLs (which may hold a secret topic or a
    password) reduced to whether they are set and where they go."""
    shown = []
    for channel in channels:
        where = destination(channel)
        shown.append(
            {
                "name": channel.name,
                "kind": channel.kind,
                "url": f"{where} (set)" if channel.kind == "apprise" else f"{where}/… (set)",
                "token": "(set)" if channel.token else "",
                "events": list(channel.events),
                "quiet_hours": channel.quiet_hours,
                "coalesce_seconds": channel.coalesce_seconds,
                "preview": channel.preview,
            }
        )
    return shown
