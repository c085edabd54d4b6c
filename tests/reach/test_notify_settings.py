"""`[[notify]]` and `server.public_url` in the config: checked on load, secrets kept out of the API."""

from __future__ import annotations

import pytest

from tray_app import config
from tray_app.config import notify as notify_settings
from tray_app.config.notify import NotifyConfig


def test_channels_are_read_with_their_defaults() -> None:
    cfg = config.from_dict(
        {"notify": [{"kind": "webhook", "url": "http://127.0.0.1:9/hook", "events": ["approval"]}]}
    )
    [channel] = cfg.notify
    assert (channel.name, channel.kind, channel.events, channel.coalesce_seconds) == (
        "webhook-1",
        "webhook",
        ["approval"],
        10.0,
    )


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"kind": "pager", "url": "http://x/y"}, r"notify\[1\]\.kind"),
        ({"kind": "ntfy"}, "needs a url"),
        ({"url": "ftp://x/y"}, "http:// or https://"),
        ({"url": "http://x/y", "events": ["everything"]}, r"notify\[1\]\.events"),
        ({"url": "http://x/y", "quiet_hours": "late"}, "22:00-07:00"),
        ({"url": "http://x/y", "coalesce_seconds": -1}, "coalesce_seconds"),
        ({"url": "http://x/y", "colour": "red"}, "unknown key"),
        ({"url": "http://x/y", "preview": "yes"}, r"notify\[1\]\.preview .* true or false"),
    ],
)
def test_a_wrong_channel_names_its_key(table: dict[str, object], says: str) -> None:
    with pytest.raises(config.ConfigError, match=says):
        config.from_dict({"notify": [table]})


def test_previews_are_off_unless_a_channel_asks() -> None:
    cfg = config.from_dict(
        {
            "notify": [
                {"url": "https://ntfy.sh/a"},
                {"kind": "webhook", "url": "http://hook.lan/", "preview": True},
            ]
        }
    )
    assert [channel.preview for channel in cfg.notify] == [False, True]
    assert [channel["preview"] for channel in config.public_view(cfg)["notify"]] == [False, True]


def test_public_url_must_be_an_address() -> None:
    assert config.from_dict({"server": {"public_url": "https://ai.example.org"}}).server.public_url
    with pytest.raises(config.ConfigError, match=r"server\.public_url"):
        config.from_dict({"server": {"public_url": "ai.example.org"}})


def test_tokens_and_topics_stay_out_of_the_control_api() -> None:
    cfg = config.from_dict(
        {
            "notify": [
                {"url": "https://ntfy.sh/secret-topic", "token": "tk_secret"},
                {"kind": "apprise", "url": "pover://userkey@apptoken, slack://TokenA/TokenB/TokenC"},
            ]
        }
    )
    shown = str(config.public_view(cfg))
    for secret in ("secret-topic", "tk_secret", "userkey", "apptoken", "tokena", "TokenA"):
        assert secret not in shown
    assert [channel["url"] for channel in config.public_view(cfg)["notify"]] == [
        "https://ntfy.sh/… (set)",
        "pover://…, slack://… (set)",
    ]


@pytest.mark.parametrize(
    ("kind", "url", "shown"),
    [
        ("ntfy", "https://ntfy.sh/secret-topic", "https://ntfy.sh"),
        (
            "webhook",
            "http://me:pa55@homeassistant.lan:8123/api/webhook/s3cret?x=1",
            "http://homeassistant.lan:8123",
        ),
        ("webhook", "http://[::1]:9000/hook", "http://[::1]:9000"),
        ("webhook", "http://host:notaport/hook", "http://host"),
        (
            "apprise",
            "gotify://gotify.lan/AbCdEf123,  gotify://other/Tok tgram://123:bot/chat",
            "gotify://…, tgram://…",
        ),
        ("apprise", "not a url", "apprise URL"),
    ],
)
def test_where_a_channel_sends_is_its_host_never_its_path_or_credentials(
    kind: str, url: str, shown: str
) -> None:
    assert notify_settings.destination(NotifyConfig(kind=kind, url=url)) == shown  # type: ignore[arg-type]


def test_channels_and_public_url_are_set_in_the_file_only() -> None:
    assert config.file_only({"notify": [], "server": {"public_url": "https://x"}}) == [
        "notify.*",
        "server.public_url",
    ]


def test_a_reload_takes_new_channels_over_live() -> None:
    old = config.from_dict({})
    fresh = config.from_dict({"notify": [{"url": "https://ntfy.sh/t"}]})
    merged, applied, needs_restart = config.with_live_changes(old, fresh)
    assert applied == ["notify"] and not needs_restart and merged.notify == fresh.notify
