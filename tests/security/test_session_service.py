"""The status page's login through a real `failsoft serve`: the session is the service's to end. After a
logout the cookie is worth nothing (wherever a copy of it is), a restart keeps a session and a new admin token
ends it; the cookie alone, as a program would send it, reads but never changes the config; and no cookie,
action link or login body is a 500 (review 3, F8 and F6)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.helpers import base_settings
from tests.support.service import ServiceHandle, running_service
from tray_app.paths import private_dir
from tray_app.reach import admin_token
from tray_app.server.status_page.session import COOKIE, SECURE_COOKIE

pytestmark = pytest.mark.integration

API_KEY = "sk-session-test"
PATCH = {"changes": {"failover": {"deadline": 95}}, "restart": False}


@pytest.fixture(scope="module")
def svc(module_root: Path) -> Iterator[ServiceHandle]:
    with running_service(module_root, settings=base_settings(server={"api_key": API_KEY})) as handle:
        yield handle


def own_origin(svc: ServiceHandle) -> dict[str, str]:
    return {"Origin": svc.base_url}


def log_in(svc: ServiceHandle) -> str:
    """A login as the page makes it; the session id its cookie carries."""
    answer = httpx.post(svc.base_url + "/ui/login", json={"token": svc.admin_token}, timeout=10)
    assert answer.status_code == 200, answer.text
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    return str(answer.cookies[COOKIE])


def with_cookie(
    svc: ServiceHandle, method: str, path: str, session_id: str, **options: Any
) -> httpx.Response:
    """A request carrying only the cookie (no API key, no admin token): the page's, or a copy's."""
    headers = {"Cookie": f"{COOKIE}={session_id}", **options.pop("headers", {})}
    return httpx.request(method, svc.base_url + path, headers=headers, timeout=30, **options)


def test_the_cookie_alone_reads_but_cannot_change_the_config(svc: ServiceHandle) -> None:
    session_id = log_in(svc)
    assert with_cookie(svc, "GET", "/failsoft/config", session_id).status_code == 200
    refused = with_cookie(svc, "PATCH", "/failsoft/config", session_id, json=PATCH)
    assert refused.status_code == 401, refused.text
    config = httpx.get(svc.base_url + "/failsoft/config", headers=svc.headers(), timeout=10).json()
    assert config["config"]["failover"]["deadline"] != 95  # nothing changed
    from_page = with_cookie(svc, "PATCH", "/failsoft/config", session_id, json=PATCH, headers=own_origin(svc))
    assert from_page.status_code == 200, from_page.text  # the page itself: its Origin goes with it


def test_after_logout_the_cookie_is_refused_everywhere(svc: ServiceHandle) -> None:
    session_id = log_in(svc)
    assert with_cookie(svc, "GET", "/failsoft/view", session_id).status_code == 200
    logout = with_cookie(svc, "POST", "/ui/logout", session_id, headers=own_origin(svc))
    assert logout.status_code == 200
    for method, path, extra in (
        ("GET", "/failsoft/view", {}),
        ("GET", "/failsoft/config", {}),
        ("GET", "/v1/models", {}),  # nor does it stand for the API key any more
        ("PATCH", "/failsoft/config", {"json": PATCH, "headers": own_origin(svc)}),
    ):
        answer = with_cookie(svc, method, path, session_id, **extra)
        assert answer.status_code == 401, (method, path, answer.text)


BIG_LOGIN = json.dumps({"token": "x" * 5000}).encode()


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "status"),
    [
        ("GET", "/v1/models", {"Cookie": f"{COOKIE}=1.a.\xe9"}, None, 401),
        ("GET", "/failsoft/view", {"Cookie": f"{SECURE_COOKIE}=\xe9\xff"}, None, 401),
        ("GET", "/ui/act/job-1.approve.99999999999.n.%C3%A9", {}, None, 403),
        ("POST", "/ui/act/job-1.approve.99999999999.n.%C3%A9", {}, None, 403),
        ("POST", "/ui/login", {}, json.dumps({"token": "é"}).encode(), 401),
        ("POST", "/ui/login", {}, b'{"token": "\\ud800"}', 401),
        ("POST", "/ui/login", {}, BIG_LOGIN, 413),
    ],
    ids=["cookie-any-route", "host-cookie", "link-get", "link-post", "login-token", "login-surrogate", "5kb"],
)
def test_no_cookie_link_or_login_is_a_500(
    svc: ServiceHandle, method: str, path: str, headers: dict[str, str], body: bytes | None, status: int
) -> None:
    raw = [(name.encode(), value.encode("latin-1")) for name, value in headers.items()]
    answer = httpx.request(method, svc.base_url + path, headers=raw, content=body, timeout=10)
    assert answer.status_code == status, answer.text
    assert "internal_error" not in answer.text


def test_a_restart_keeps_the_session_and_a_new_admin_token_ends_it(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    settings = base_settings()
    with running_service(tmp_path / "first", settings=settings, data_dir=data_dir) as first:
        kept = log_in(first)
        assert with_cookie(first, "GET", "/failsoft/config", kept).status_code == 200
    with running_service(tmp_path / "second", settings=settings, data_dir=data_dir) as second:
        assert second.admin_token == first.admin_token
        assert with_cookie(second, "GET", "/failsoft/config", kept).status_code == 200
    # The owner makes a new admin token: removes the file; the next start writes a new one.
    admin_token.token_path(private_dir(data_dir)).unlink()
    with running_service(tmp_path / "third", settings=settings, data_dir=data_dir) as third:
        assert third.admin_token != first.admin_token
        refused = with_cookie(third, "GET", "/failsoft/config", kept)
        assert refused.status_code == 401, refused.text
        assert with_cookie(third, "GET", "/failsoft/config", log_in(third)).status_code == 200
