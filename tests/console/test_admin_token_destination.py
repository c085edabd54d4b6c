"""Where the `failsoft` commands send the admin token (review 3, F12): the token found on this machine
($FAILSOFT_ADMIN_TOKEN, the data folder's file) only to the local service's own address, the config's host
and port; another address (`--url`) gets only a token named for it with `--admin-token`.

Each command runs as a user runs it (`python -m tray_app ...`) against a recorder: a loopback HTTP server
that keeps every request's headers and answers 404."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tests.support.http_server import serving
from tests.support.service import write_config
from tray_app.reach import admin_token

FILE_TOKEN = "token-in-the-data-folder"
ENV_TOKEN = "token-in-the-environment"
NAMED_TOKEN = "token-named-on-the-command-line"
COMMANDS = (
    ["status"],
    ["approvals"],
    ["approve", "job-1"],
    ["approve", "--all"],
    ["reject", "job-1"],
    ["worker", "restart", "gpu"],
    ["unload", "some-model"],
    ["yield"],
)


@dataclass
class Recorder:
    port: int = 0
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def admin_tokens(self) -> list[str | None]:
        """The admin header of every request received (None: not sent)."""
        with self.lock:
            return [
                next((v for k, v in headers.items() if k.lower() == admin_token.HEADER.lower()), None)
                for _method, _path, headers in self.seen
            ]


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    record = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            with record.lock:
                record.seen.append((self.command, self.path, dict(self.headers.items())))
            answer = b'{"error": {"message": "not here", "code": "not_found"}}'
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        do_GET = do_POST = _record

        def log_message(self, format: str, *args: object) -> None:
            return

    with serving(Handler) as port:
        record.port = port
        yield record


@pytest.fixture
def machine(tmp_path: Path) -> dict[str, str]:
    """The environment of a user whose data folder holds an admin token; its config: port 8750."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    (data / admin_token.FILE_NAME).write_text(FILE_TOKEN + "\n", encoding="ascii")
    write_config(tmp_path / "config.toml", {})
    env = {name: value for name, value in os.environ.items() if not name.startswith("FAILSOFT_")}
    env.update(FAILSOFT_CONFIG=str(tmp_path / "config.toml"), FAILSOFT_DATA_DIR=str(data))
    return env


def failsoft(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tray_app", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("found", ["data folder", "environment"])
def test_no_command_sends_the_token_found_here_to_another_address(
    recorder: Recorder, machine: dict[str, str], found: str
) -> None:
    if found == "environment":
        machine[admin_token.ENV_VARIABLE] = ENV_TOKEN
    for command in COMMANDS:
        done = failsoft(machine, *command, "--url", recorder.url)
        assert done.returncode == 1, (command, done.stderr)
    assert len(recorder.admin_tokens()) >= len(COMMANDS)  # every command did ask the recorder
    assert set(recorder.admin_tokens()) == {None}


def test_a_refusal_for_want_of_the_token_says_how_to_name_one(machine: dict[str, str]) -> None:
    refusal = {"error": {"message": "needs the admin token", "code": "admin_token_required"}}
    body = json.dumps(refusal).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    with serving(Handler) as port:
        done = failsoft(machine, "approvals", "--url", f"http://127.0.0.1:{port}")
    assert done.returncode == 1
    assert "wants its admin token: pass --admin-token" in done.stderr


def test_a_token_named_for_the_address_is_sent_there(recorder: Recorder, machine: dict[str, str]) -> None:
    failsoft(machine, "approvals", "--url", recorder.url, "--admin-token", NAMED_TOKEN)
    failsoft(machine, "--admin-token", NAMED_TOKEN, "approve", "job-1", "--url", recorder.url)
    assert recorder.admin_tokens() == [NAMED_TOKEN, NAMED_TOKEN]


def test_the_local_service_at_the_configs_address_gets_the_token_found_here(
    recorder: Recorder, machine: dict[str, str], tmp_path: Path
) -> None:
    write_config(tmp_path / "config.toml", {"server": {"port": recorder.port}})  # the recorder is "it"
    failsoft(machine, "approvals")  # the config's own address
    failsoft(machine, "approvals", "--url", f"http://localhost:{recorder.port}")  # the same, by name
    machine[admin_token.ENV_VARIABLE] = ENV_TOKEN
    failsoft(machine, "approvals", "--url", recorder.url)
    assert recorder.admin_tokens() == [FILE_TOKEN, FILE_TOKEN, ENV_TOKEN]


@pytest.mark.parametrize(
    ("url", "host", "port", "own"),
    [
        ("http://127.0.0.1:8750", "127.0.0.1", 8750, True),
        ("http://localhost:8750/", "127.0.0.1", 8750, True),
        ("http://[::1]:8750", "0.0.0.0", 8750, True),
        ("http://127.0.0.1:8750", "0.0.0.0", 8750, True),
        ("http://192.168.1.5:8750", "192.168.1.5", 8750, True),  # bound there: its own address
        ("http://127.0.0.1:8750", "192.168.1.5", 8750, False),  # bound elsewhere: not it on loopback
        ("http://127.0.0.1:8751", "127.0.0.1", 8750, False),  # another port: another program
        ("http://192.168.1.9:8750", "0.0.0.0", 8750, False),  # another machine
        ("https://127.0.0.1:8750", "127.0.0.1", 8750, False),  # a proxy in front, not the service
        ("http://user@127.0.0.1:8750", "127.0.0.1", 8750, False),
        ("http://127.0.0.1:99999", "127.0.0.1", 8750, False),
        ("http://127.0.0.1", "127.0.0.1", 80, True),
        ("not a url", "127.0.0.1", 8750, False),
    ],
)
def test_what_is_the_local_services_own_address(url: str, host: str, port: int, own: bool) -> None:
    assert admin_token.is_own_address(url, host, port) is own
