"""The terminal commands' failures, in words a user can act on: nothing listening, something else
listening, a key wanted, a refusal passed on as the service said it."""

from __future__ import annotations

import json

import pytest

from tests.support.http_server import http_server, silent_listener
from tray_app import cli
from tray_app.console.service_client import ServiceClient, ServiceError


def _closed_port() -> int:
    with silent_listener() as port:
        return port  # closed again once the block ends: nothing listens there


def test_nothing_listening_says_how_to_start_the_service() -> None:
    with pytest.raises(ServiceError) as raised:
        ServiceClient(f"http://127.0.0.1:{_closed_port()}").get("/failsoft/status")
    assert "no Failsoft service answers at" in str(raised.value)
    assert "failsoft serve" in str(raised.value)


def test_another_program_is_not_taken_for_the_service() -> None:
    with http_server(404) as port, pytest.raises(ServiceError) as raised:
        ServiceClient(f"http://127.0.0.1:{port}").get("/failsoft/status")
    assert (
        str(raised.value) == f"what answers at http://127.0.0.1:{port} is not a Failsoft service (HTTP 404)"
    )


def test_a_wanted_key_names_where_to_put_it() -> None:
    body = json.dumps({"error": {"message": "invalid API key", "code": "invalid_api_key"}}).encode()
    with http_server(401, body) as port, pytest.raises(ServiceError) as raised:
        ServiceClient(f"http://127.0.0.1:{port}").get("/failsoft/status")
    assert "wants an API key: set FAILSOFT_API_KEY, or [server] api_key in the config" in str(raised.value)


def test_a_refusal_is_passed_on_as_the_service_said_it() -> None:
    body = json.dumps({"error": {"message": "job job-1 is completed, not awaiting approval"}}).encode()
    with http_server(409, body) as port, pytest.raises(ServiceError) as raised:
        ServiceClient(f"http://127.0.0.1:{port}").get("/failsoft/jobs/job-1")
    assert str(raised.value) == "job job-1 is completed, not awaiting approval"


def test_the_commands_exit_1_when_the_service_is_not_there(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    for command in (
        ["status"],
        ["approvals"],
        ["approve", "job-1"],
        ["reject", "job-1"],
        ["approve", "--all"],
    ):
        assert cli.main([*command, "--url", url]) == 1
        assert "no Failsoft service answers at" in capsys.readouterr().err


def test_approve_wants_job_ids_or_all_but_not_both(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["approve"]) == 2
    assert cli.main(["approve", "job-1", "--all"]) == 2
    assert "name the jobs to approve, or --all" in capsys.readouterr().err
