"""The status page and the phone's action links over the real app: who may see and do what."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.security.conftest import ADMIN_TOKEN, StandInService, client_for
from tests.security.test_host_and_origin import _awaiting_job
from tray_app.reach.capability import Signer
from tray_app.server.routes import create_app
from tray_app.server.status_page.session import COOKIE


def page_client(service: StandInService, **kwargs: Any) -> TestClient:
    return client_for(create_app(service, manage_lifecycle=False), admin=False, **kwargs)  # type: ignore[arg-type]


def log_in(client: TestClient) -> None:
    answer = client.post("/ui/login", json={"token": ADMIN_TOKEN})
    assert answer.status_code == 200, answer.text
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie


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
    forged = Signer(b"another key".ljust(32, b".")).session_cookie()
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


def test_the_public_url_host_is_let_through(make_service: Any) -> None:
    service = make_service(public_url="https://ai.example.org")
    with page_client(service, base_url="https://ai.example.org") as client:
        assert client.get("/ui/").status_code == 200
        assert (
            client.post("/ui/login", json={"token": ADMIN_TOKEN}).headers["set-cookie"].count("Secure") == 1
        )
    with page_client(service, base_url="http://evil.example") as client:
        assert client.get("/ui/").status_code == 403
