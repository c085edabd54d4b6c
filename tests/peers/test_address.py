"""Where plain HTTP may go: the config's rule for a literal address or a name, and a name's addresses
resolved before a plain-HTTP probe."""

from __future__ import annotations

import asyncio

import pytest

from tests.peers.health_server import resolving
from tray_app.peers.address import plain_http_allowed_host, resolved_is_local


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("10.0.0.1", True),
        ("172.16.0.1", True),
        ("172.31.255.255", True),
        ("192.168.1.20", True),
        ("169.254.1.1", True),
        ("fe80::1", True),
        ("fc00::1", True),
        ("fdff:ffff::1", True),
        ("::ffff:192.168.1.20", True),  # an IPv4 address written as IPv6
        ("localhost", True),
        ("LocalHost.", True),
        ("gaming-pc", True),
        ("gaming-pc.local", True),
        ("ai-box.lan", True),
        ("ai-box.home.arpa", True),
        ("AI-BOX.LAN", True),
        ("8.8.8.8", False),
        ("172.32.0.1", False),
        ("100.64.0.1", False),
        ("192.0.2.1", False),  # documentation range: `is_private` says yes, no peer lives there
        ("0.0.0.0", False),
        ("2001:db8::1", False),
        ("::ffff:8.8.8.8", False),
        ("fe00::1", False),
        ("example.org", False),
        ("gaming-pc.local.example.org", False),
        ("lan", True),  # no dot: a LAN name
        ("box.arpa", False),
        ("", False),
        (".", False),
    ],
)
def test_plain_http_allowed_host(host: str, allowed: bool) -> None:
    assert plain_http_allowed_host(host) is allowed


async def test_loopback_names_and_addresses_resolve_locally() -> None:
    assert await resolved_is_local("localhost")
    assert await resolved_is_local("127.0.0.1")
    assert await resolved_is_local("::1")
    assert not await resolved_is_local("8.8.8.8")  # a literal: resolved without asking any DNS


async def test_every_address_of_a_name_must_be_local(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    names = {"gaming-pc": ["192.168.1.20", "fe80::2"], "split-horizon": ["192.168.1.20", "8.8.8.8"]}
    monkeypatch.setattr(loop, "getaddrinfo", resolving(names))
    assert await resolved_is_local("gaming-pc")
    assert not await resolved_is_local("split-horizon")
    with pytest.raises(OSError):
        await resolved_is_local("nowhere")
