"""The tray's client sends the admin token found on this machine only to the local service's own address
(the config's host and port); a tray attached elsewhere (`--attach URL`) sends one only when named for it
(`--admin-token`). Review 3, F12."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from tests.support.service import write_config
from tray_app.reach import admin_token
from tray_app.ui.api_client import ServiceClient

FOUND = "token-found-on-this-machine"


@pytest.fixture
def found_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(tmp_path / "config.toml", {"server": {"port": 8750}})
    monkeypatch.setenv("FAILSOFT_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setenv(admin_token.ENV_VARIABLE, FOUND)


def sent(client: ServiceClient, path: str = "/failsoft/jobs?state=awaiting_approval") -> str:
    return bytes(client.request(path).rawHeader(admin_token.HEADER).data()).decode()


@pytest.mark.usefixtures("found_here")
@pytest.mark.parametrize(
    ("url", "named", "expected"),
    [
        ("http://127.0.0.1:8750", "", FOUND),  # the local service: the token found here
        ("http://localhost:8750", "", FOUND),
        ("http://192.168.1.9:8750", "", ""),  # --attach to another machine: nothing
        ("http://127.0.0.1:8751", "", ""),  # another port: another program
        ("https://ai.example.org", "", ""),
        ("http://192.168.1.9:8750", "named-for-it", "named-for-it"),  # --admin-token
    ],
)
def test_the_token_found_here_goes_to_the_local_service_only(
    qtbot: QtBot, url: str, named: str, expected: str
) -> None:
    client = ServiceClient(url, admin=named)
    assert sent(client) == expected
    assert sent(client, "/failsoft/status") == ""  # a read-only view never carries it
