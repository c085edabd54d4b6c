"""What the tray finds where it would start its service: nothing, another program, or Failsoft itself (which
it then shows instead of failing to bind)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.http_server import http_server, silent_listener
from tests.support.service import free_port, running_service
from tray_app.host.service_probe import local_url, probe_service


def test_a_free_port_is_nothing() -> None:
    assert probe_service(f"http://127.0.0.1:{free_port()}").found == "nothing"


def test_another_web_server_is_named_with_its_answer() -> None:
    with http_server(404) as port:
        probe = probe_service(f"http://127.0.0.1:{port}")
    assert probe.found == "other"
    assert probe.detail == f"another program answers at http://127.0.0.1:{port} (HTTP 404)"


def test_a_json_answer_that_is_not_failsofts_status_is_another_program() -> None:
    with http_server(200, b'{"version": "1.0", "status": "ok"}') as port:
        assert probe_service(f"http://127.0.0.1:{port}").found == "other"


def test_a_listener_that_never_answers_is_given_up_on_after_the_wait() -> None:
    with silent_listener() as port:
        started = time.monotonic()
        probe = probe_service(f"http://127.0.0.1:{port}", wait=1.0)
    assert probe.found == "other"
    assert "gives no HTTP answer" in probe.detail
    assert time.monotonic() - started < 10


@pytest.mark.integration
def test_a_running_failsoft_is_found_and_one_with_another_key_is_named(tmp_path: Path) -> None:
    with running_service(tmp_path, settings={"server": {"api_key": "sk-home"}}) as svc:
        found = probe_service(svc.base_url, "sk-home")
        refused = probe_service(svc.base_url, "sk-wrong")
        anonymous = probe_service(svc.base_url)
    assert found.found == "failsoft"
    assert found.detail.startswith("Failsoft ") and found.detail.endswith(f" at {svc.base_url}")
    assert refused.found == anonymous.found == "refused"
    assert refused.detail == f"the Failsoft service at {svc.base_url} refuses this config's API key"


def test_wildcard_binds_are_reached_on_loopback() -> None:
    assert local_url("0.0.0.0", 8750) == "http://127.0.0.1:8750"
    assert local_url("192.168.1.5", 9000) == "http://192.168.1.5:9000"
    assert local_url("::1", 8750) == "http://[::1]:8750"
