"""`[[peers]]` in the config: read with their defaults, every wrong value refused naming `peers[i].key`,
plain HTTP only on the local network, set in the file only, and their keys kept out of the control API."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from tray_app import config
from tray_app.config import PeerConfig

GAMING_PC = {"name": "gaming-pc", "url": "http://192.168.1.20:8750"}


def peers_of(*tables: dict[str, Any]) -> list[PeerConfig]:
    return config.from_dict({"peers": list(tables)}).peers


def test_none_by_default() -> None:
    assert config.from_dict({}).peers == []


def test_a_peer_is_read_with_its_defaults_and_its_url_without_the_trailing_slash() -> None:
    [peer] = peers_of({"name": "gaming-pc", "url": "http://192.168.1.20:8750/"})
    assert peer == PeerConfig(name="gaming-pc", url="http://192.168.1.20:8750")
    assert (peer.api_key, peer.models, peer.priority, peer.slots) == ("", [], 0, 4)


def test_every_key_is_read() -> None:
    table = {
        "name": "office.box_2",
        "url": "https://ai.example.org",
        "api_key": "sk-peer-1",
        "models": ["default", "gemma"],
        "priority": 3,
        "slots": 64,
    }
    [peer] = peers_of(table)
    assert peer == PeerConfig(**table)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"name": "x"}, r"peers must be \[\[peers\]\] tables"),
        (["x"], r"peers must be \[\[peers\]\] tables"),
    ],
)
def test_peers_must_be_tables(value: object, says: str) -> None:
    with pytest.raises(config.ConfigError, match=says):
        config.from_dict({"peers": value})


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"url": "http://10.0.0.2"}, r"peers\[1\]\.name is required"),
        ({**GAMING_PC, "name": "gaming pc"}, r"peers\[1\]\.name = 'gaming pc' must be 1 to 40"),
        ({**GAMING_PC, "name": "x" * 41}, r"peers\[1\]\.name = 'x+' must be 1 to 40"),
        ({**GAMING_PC, "name": "pc/1"}, r"peers\[1\]\.name"),
        ({"name": "gaming-pc"}, r"peers\[1\]\.url is required"),
        ({**GAMING_PC, "url": "ftp://192.168.1.20"}, r"peers\[1\]\.url = .* http:// or https://"),
        ({**GAMING_PC, "url": "192.168.1.20:8750"}, r"peers\[1\]\.url = .* http:// or https://"),
        ({**GAMING_PC, "url": "http://"}, r"peers\[1\]\.url = .* with a host"),
        ({**GAMING_PC, "url": "http://192.168.1.20:8750/v1"}, r"peers\[1\]\.url = .* without a path"),
        ({**GAMING_PC, "url": "http://192.168.1.20:8750/?a=1"}, r"peers\[1\]\.url = .* query"),
        ({**GAMING_PC, "url": "http://192.168.1.20:8750/#top"}, r"peers\[1\]\.url = .* fragment"),
        ({**GAMING_PC, "url": "http://me:pw@192.168.1.20"}, r"peers\[1\]\.url = .* api_key"),
        ({**GAMING_PC, "url": "http://192.168.1.20:0"}, r"peers\[1\]\.url = .* port 0"),
        ({**GAMING_PC, "url": "http://192.168.1.20:99999"}, r"peers\[1\]\.url = .* not a URL"),
        ({**GAMING_PC, "url": "http://192.168.1.20:port"}, r"peers\[1\]\.url = .* not a URL"),
        ({**GAMING_PC, "url": "http://[fd00::1"}, r"peers\[1\]\.url = .* not a URL"),
        ({**GAMING_PC, "url": "http://gaming pc:8750"}, r"peers\[1\]\.url = .* no spaces"),
        ({**GAMING_PC, "url": "http://gam!ng-pc:8750"}, r"peers\[1\]\.url = .* no valid host name"),
        ({**GAMING_PC, "api_key": "two words"}, r"peers\[1\]\.api_key must be printable ASCII"),
        ({**GAMING_PC, "api_key": "clé"}, r"peers\[1\]\.api_key must be printable ASCII"),
        ({**GAMING_PC, "api_key": "k\n"}, r"peers\[1\]\.api_key must be printable ASCII"),
        ({**GAMING_PC, "api_key": 42}, r"peers\[1\]\.api_key = 42 must be a string"),
        ({**GAMING_PC, "models": "default"}, r"peers\[1\]\.models = 'default' must be a list of strings"),
        ({**GAMING_PC, "models": [""]}, r"peers\[1\]\.models = \[''\]: each must be a model name"),
        ({**GAMING_PC, "priority": -1}, r"peers\[1\]\.priority = -1 must be a whole number >= 0"),
        ({**GAMING_PC, "priority": 1.5}, r"peers\[1\]\.priority = 1\.5 must be a whole number"),
        ({**GAMING_PC, "slots": 0}, r"peers\[1\]\.slots = 0 must be in 1\.\.64"),
        ({**GAMING_PC, "slots": 65}, r"peers\[1\]\.slots = 65 must be in 1\.\.64"),
        ({**GAMING_PC, "slots": True}, r"peers\[1\]\.slots = True must be a whole number"),
        ({**GAMING_PC, "token": "x"}, r"unknown key peers\[1\]\.token; keys are api_key, models, name"),
    ],
)
def test_a_wrong_peer_names_its_key(table: dict[str, Any], says: str) -> None:
    with pytest.raises(config.ConfigError, match=says):
        peers_of(table)


def test_the_error_names_the_file() -> None:
    with pytest.raises(config.ConfigError, match=r"^/etc/failsoft\.toml: peers\[1\]\.slots"):
        config.from_dict({"peers": [{**GAMING_PC, "slots": 0}]}, source="/etc/failsoft.toml")


def test_names_are_unique() -> None:
    other = {"name": "gaming-pc", "url": "http://10.0.0.3"}
    with pytest.raises(config.ConfigError, match=r"peers\[3\]\.name = 'gaming-pc' is taken by peers\[1\]"):
        peers_of(GAMING_PC, {"name": "laptop", "url": "http://10.0.0.2"}, other)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8750",
        "http://10.1.2.3",
        "http://172.16.0.1",
        "http://172.31.255.254:8750",
        "http://192.168.1.20:8750",
        "http://169.254.10.20",
        "http://[::1]:8750",
        "http://[fd12:3456::1]:8750",
        "http://[fe80::1]",
        "http://localhost:8750",
        "http://LOCALHOST",
        "http://gaming-pc:8750",
        "http://gaming-pc.local:8750",
        "http://ai-box.lan",
        "http://ai-box.home.arpa",
        "https://ai.example.org",
        "https://8.8.8.8:8443",
    ],
)
def test_plain_http_goes_to_the_local_network(url: str) -> None:
    [peer] = peers_of({"name": "p", "url": url})
    assert peer.url == url


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://8.8.8.8:8750", "8.8.8.8"),
        ("http://172.32.0.1", "172.32.0.1"),
        ("http://100.64.0.1", "100.64.0.1"),  # carrier-grade NAT: not a private range
        ("http://[2001:db8::1]:8750", "2001:db8::1"),
        ("http://ai.example.org", "ai.example.org"),
        ("http://box.local.example.org", "box.local.example.org"),
        ("http://0.0.0.0:8750", "0.0.0.0"),
    ],
)
def test_plain_http_elsewhere_needs_https(url: str, host: str) -> None:
    with pytest.raises(config.ConfigError) as raised:
        peers_of({"name": "p", "url": url})
    message = str(raised.value)
    assert "peers[1].url" in message and f"goes to {host}," in message
    assert "plain HTTP only on the local network; use https://" in message


def test_peers_are_set_in_the_file_only() -> None:
    assert ("peers", "*") in config.FILE_ONLY
    assert config.file_only({"peers": [GAMING_PC]}) == ["peers"]
    assert config.file_only({"models": [], "peers": []}) == ["models", "peers"]


def test_a_changed_peer_waits_for_a_restart() -> None:
    old = config.from_dict({})
    fresh = config.from_dict({"peers": [GAMING_PC]})
    merged, applied, needs_restart = config.with_live_changes(old, fresh)
    assert (merged.peers, applied, needs_restart) == ([], [], ["peers"])


def test_the_keys_stay_out_of_the_control_api() -> None:
    cfg = config.from_dict(
        {"peers": [{**GAMING_PC, "api_key": "sk-peer-secret"}, {"name": "laptop", "url": "http://10.0.0.2"}]}
    )
    shown = config.public_view(cfg)
    assert "sk-peer-secret" not in str(shown)
    assert [peer["api_key"] for peer in shown["peers"]] == ["(set)", ""]
    assert shown["peers"][0]["url"] == "http://192.168.1.20:8750"
    assert cfg.peers[0].api_key == "sk-peer-secret"  # the view is a copy


def test_a_saved_config_reads_back_its_peers(tmp_path: Path) -> None:
    cfg = config.from_dict({"peers": [{**GAMING_PC, "models": ["default"], "priority": 1}]})
    path = config.save(cfg, tmp_path / "config.toml")
    assert config.load(path).peers == cfg.peers
    cli_view = config.apply_overrides(config.load(path), {"server.port": 9000})
    assert cli_view.peers == cfg.peers


def test_a_file_holding_a_peer_key_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(tomli_w.dumps({"peers": [{**GAMING_PC, "api_key": "sk-peer"}]}), encoding="utf-8")
    os.chmod(path, 0o644)
    config.load(path)
    assert path.stat().st_mode & 0o777 == 0o600


def test_an_rpc_box_needs_no_url_and_is_read_with_its_memory_cap() -> None:
    [peer] = peers_of({"name": "nas", "rpc": "192.168.1.30:50052", "rpc_memory": "6GiB"})
    assert (peer.url, peer.rpc, peer.rpc_memory) == ("", "192.168.1.30:50052", "6GiB")
    [both] = peers_of({**GAMING_PC, "rpc": "gaming-pc.local:50052"})  # a peer and its device, one machine
    assert both.url == GAMING_PC["url"] and both.rpc == "gaming-pc.local:50052"


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"name": "nas"}, "peers[1].url is required"),
        ({"name": "nas", "rpc": "192.168.1.30"}, "peers[1].rpc = '192.168.1.30' must be host:port"),
        ({"name": "nas", "rpc": "192.168.1.30:0"}, "has port 0; use 1..65535"),
        ({"name": "nas", "rpc": "8.8.8.8:50052"}, "not a local address or a LAN name"),
        ({"name": "nas", "rpc": "ai.example.org:50052"}, "llama.cpp's RPC is for a LAN only"),
        ({"name": "nas", "rpc": "10.0.0.3:50052", "rpc_memory": "lots"}, "peers[1].rpc_memory = 'lots'"),
    ],
)
def test_a_wrong_rpc_box_names_its_key(table: dict[str, Any], says: str) -> None:
    with pytest.raises(config.ConfigError, match=re.escape(says)):
        peers_of(table)
