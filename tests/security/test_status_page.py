"""The status page and the phone's action links over the real app: who may see and do what."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.security.conftest import ADMIN_TOKEN, StandInService, client_for
from tests.security.test_host_and_origin import _awaiting_job
from tray_app.reach.capability import Signer
from tray_app.server.routes import create_app
from tray_app.server.status_page.session import COOKIE, SECURE_COOKIE

OWN_ORIGIN = {"Origin": "http://127.0.0.1:8750"}


def page_client(service: StandInService, **kwargs: Any) -> TestClient:
    return client_for(create_app(service, manage_lifecycle=False), admin=False, **kwargs)  # type: ignore[arg-type]


def log_in(client: TestClient) -> str:
    """Logs `client` in; the session id its cookie carries."""
    answer = client.post("/ui/login", json={"token": ADMIN_TOKEN})
    assert answer.status_code == 200, answer.text
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert cookie.startswith(f"{COOKIE}=") and "Secure" not in cookie  # plain HTTP: no __Host- cookie
    return str(client.cookies[COOKIE])


def test_the_page_is_served_without_a_key_and_shows_nothing_until_login(make_service: Any) -> None:
    with page_client(make_service(api_key="sk-test")) as client:
        page = client.get("/ui/")
        assert page.status_code == 200 and "<title>Failsoft</title>" in page.text
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert client.get("/ui/app.js").headers["content-type"].startswith("text/javascript")
        assert client.get("/ui/secrets.txt").status_code == 404
        assert client.get("/failsoft/view").status_code == 401  # neither the key nor a login
        assert client.post("/ui/login", json={"token": "guess"}).status_code == 401


def test_the_login_cookie_stands_for_the_key_and_the_admin_token(make_service: Any) -> None:
    service = make_service(api_key="sk-test")
    job = _awaiting_job(service)
    with page_client(service) as client:
        log_in(client)
        view = client.get("/failsoft/view")
        assert view.status_code == 200, view.text
        assert [row["id"] for row in view.json()["approvals"]] == [job.id]
        assert client.get("/v1/jobs/job-unknown").status_code == 404  # past the API key
        approved = client.post(
            f"/failsoft/jobs/{job.id}/approve", headers={"Origin": "http://127.0.0.1:8750"}
        )
        assert approved.status_code == 200 and job.state == "queued"
        client.post("/ui/logout")
        assert client.get("/failsoft/view").status_code == 401


def test_the_cookie_does_not_work_for_another_origin_even_an_allowed_one(make_service: Any) -> None:
    service = make_service(allowed_origins=["http://localhost:3000"])
    job = _awaiting_job(service)
    with page_client(service) as client:
        log_in(client)
        refused = client.post(f"/failsoft/jobs/{job.id}/approve", headers={"Origin": "http://localhost:3000"})
        assert refused.status_code == 401 and job.state == "awaiting_approval"


def test_a_forged_cookie_is_no_login(service: StandInService) -> None:
    forged = Signer(b"another key".ljust(32, b"."), owner=ADMIN_TOKEN).start_session()
    with page_client(service, cookies={COOKIE: forged}) as client:
        assert client.get("/failsoft/view").status_code == 401


def test_an_action_link_decides_its_job_once(make_service: Any) -> None:
    service = make_service(api_key="sk-test")  # the link needs neither the key nor the admin token
    job = _awaiting_job(service)
    approve = service.signer.link_token(job.id, "approve")
    reject = service.signer.link_token(job.id, "reject")
    with page_client(service) as client:
        look = client.get(f"/ui/act/{approve}", headers={"Accept": "text/html"})
        assert look.status_code == 200 and "<form method='post'" in look.text
        assert job.state == "awaiting_approval"  # a preview opening the link decides nothing
        pressed = client.post(f"/ui/act/{approve}")
        assert pressed.status_code == 200
        assert pressed.text.strip() == f"approved: {job.id} runs on the CPU, about 10 s"
        assert service.executor.approved == [job.id]
        again = client.post(f"/ui/act/{approve}")
        assert again.status_code == 403 and "used already" in again.text
        late = client.post(f"/ui/act/{reject}")
        assert late.status_code == 409 and "already decided" in late.text
        assert service.executor.approved == [job.id] and job.state == "queued"


@pytest.mark.parametrize("how", ["other job", "other decision", "changed signature", "expired"])
def test_forged_and_expired_links_change_nothing(service: StandInService, how: str) -> None:
    job, other = _awaiting_job(service), _awaiting_job(service)
    token = service.signer.link_token(job.id, "approve", ttl=-1 if how == "expired" else 3600)
    parts = token.split(".")
    if how == "other job":
        parts[0] = other.id
    elif how == "other decision":
        parts[1] = "reject"
    elif how == "changed signature":
        parts[4] = parts[4][::-1]
    with page_client(service) as client:
        answer = client.post("/ui/act/" + ".".join(parts))
    assert answer.status_code == 403 and answer.text.startswith("refused:")
    assert job.state == other.state == "awaiting_approval" and service.executor.approved == []


def test_the_public_url_host_is_let_through_with_a_key_and_gets_a_host_only_secure_cookie(
    make_service: Any,
) -> None:
    service = make_service(public_url="https://ai.example.org", api_key="sk-test")
    with page_client(service, base_url="https://ai.example.org") as client:
        assert client.get("/ui/").status_code == 200
        cookie = client.post("/ui/login", json={"token": ADMIN_TOKEN}).headers["set-cookie"]
        assert cookie.startswith(f"{SECURE_COOKIE}=") and cookie.count("Secure") == 1
        assert "Domain" not in cookie and "Path=/" in cookie and "Max-Age=604800" in cookie
        assert client.get("/failsoft/view").status_code == 200
    # Behind a proxy that speaks plain HTTP to the service: its Host, or its X-Forwarded-Proto, says HTTPS.
    with page_client(service, base_url="http://ai.example.org:443") as client:
        login = client.post("/ui/login", json={"token": ADMIN_TOKEN})
        assert login.headers["set-cookie"].startswith(f"{SECURE_COOKIE}=")
    with page_client(service) as client:
        login = client.post("/ui/login", json={"token": ADMIN_TOKEN}, headers={"X-Forwarded-Proto": "https"})
        assert login.headers["set-cookie"].startswith(f"{SECURE_COOKIE}=")
    with page_client(service, base_url="http://evil.example") as client:
        assert client.get("/ui/").status_code == 403


def test_without_an_api_key_the_public_url_host_is_refused(make_service: Any) -> None:
    """`failsoft serve` refuses that config at start; a reload that sets it does not open the service."""
    service = make_service(public_url="https://ai.example.org")
    with client_for(create_app(service, manage_lifecycle=False), base_url="https://ai.example.org") as client:
        assert client.get("/failsoft/status").status_code == 403
        assert client.get("/ui/").status_code == 403
    with client_for(create_app(service, manage_lifecycle=False)) as client:
        assert client.get("/failsoft/status").status_code == 200  # loopback as before


def test_logout_ends_the_session_for_every_copy_of_the_cookie(make_service: Any) -> None:
    service = make_service(api_key="sk-test")
    with page_client(service) as client:
        session_id = log_in(client)
    with page_client(service, cookies={COOKIE: session_id}) as copy:  # another program holding a copy
        assert copy.get("/failsoft/view").status_code == 200
        with page_client(service, cookies={COOKIE: session_id}) as browser:
            logout = browser.post("/ui/logout", headers=OWN_ORIGIN)
            assert logout.status_code == 200 and f'{COOKIE}=""' in logout.headers["set-cookie"]
        assert copy.get("/failsoft/view").status_code == 401
        assert copy.get("/v1/models").status_code == 401  # nor does it stand for the API key any more


def test_a_login_replaces_the_session_the_browser_had(service: StandInService) -> None:
    with page_client(service) as client:
        first = log_in(client)
        second = log_in(client)
    assert first != second
    assert not service.signer.session_valid(first) and service.signer.session_valid(second)


@pytest.mark.parametrize(
    ("headers", "acts"),
    [
        ({}, False),  # the cookie alone: a program, not the page
        ({"Sec-Fetch-Site": "same-site"}, False),  # a page on another port of this host
        ({"Sec-Fetch-Site": "cross-site"}, False),
        (OWN_ORIGIN, True),  # the page: a browser sends its Origin with every POST
        ({"Sec-Fetch-Site": "same-origin"}, True),
        ({**OWN_ORIGIN, "Sec-Fetch-Site": "same-site"}, False),
    ],
)
def test_the_cookie_changes_something_only_from_the_page_itself(
    make_service: Any, headers: dict[str, str], acts: bool
) -> None:
    service = make_service()
    job = _awaiting_job(service)
    with page_client(service) as client:
        log_in(client)
        approved = client.post(f"/failsoft/jobs/{job.id}/approve", headers=headers)
    assert (approved.status_code, job.state) == ((200, "queued") if acts else (401, "awaiting_approval"))


@pytest.mark.parametrize(
    ("headers", "reads"),
    [({}, True), ({"Sec-Fetch-Site": "none"}, True), ({"Sec-Fetch-Site": "same-site"}, False)],
)
def test_the_cookie_alone_reads(make_service: Any, headers: dict[str, str], reads: bool) -> None:
    with page_client(make_service(api_key="sk-test")) as client:
        log_in(client)
        assert client.get("/failsoft/view", headers=headers).status_code == (200 if reads else 401)


def test_a_new_admin_token_ends_the_sessions(make_service: Any) -> None:
    service = make_service()
    with page_client(service) as client:
        session_id = log_in(client)
    service.signer.sessions.owner = "the digest of another token"  # as a restart with a new token has it
    assert not service.signer.session_valid(session_id)


BIG_LOGIN = b'{"token": "' + b"x" * 5000 + b'"}'


@pytest.mark.parametrize(
    ("request_args", "status"),
    [
        ({"method": "GET", "url": "/v1/models", "headers": {"Cookie": f"{COOKIE}=1.a.\xe9"}}, 401),
        ({"method": "GET", "url": "/failsoft/view", "headers": {"Cookie": f"{SECURE_COOKIE}=\xe9\xff"}}, 401),
        ({"method": "GET", "url": "/ui/act/job-1.approve.1.n.%C3%A9"}, 403),
        ({"method": "POST", "url": "/ui/act/job-1.approve.99999999999.n.%C3%A9"}, 403),
        ({"method": "POST", "url": "/ui/act/%ED%A0%80.approve.1.n.x"}, 403),
        ({"method": "POST", "url": "/ui/login", "json": {"token": "é"}}, 401),
        ({"method": "POST", "url": "/ui/login", "content": b'{"token": "\\ud800"}'}, 401),
        ({"method": "POST", "url": "/ui/login", "content": BIG_LOGIN}, 413),
        ({"method": "POST", "url": "/ui/logout", "headers": {"Cookie": f"{COOKIE}=\xe9"}}, 200),
    ],
)
def test_no_cookie_link_or_login_text_is_a_500(
    make_service: Any, request_args: dict[str, Any], status: int
) -> None:
    """F6's rows of the status page: each of these gave 500 (a TypeError, an unmapped 413)."""
    with page_client(make_service(api_key="sk-test")) as client:
        headers = request_args.pop("headers", {})
        raw = {k: v.encode("latin-1") for k, v in headers.items()}
        answer = client.request(**request_args, headers=raw)  # type: ignore[arg-type]
    assert answer.status_code == status, answer.text
