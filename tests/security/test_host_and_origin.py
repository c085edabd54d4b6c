"""Issue 14, finding 1: any web page could drive the service (text/plain POSTs with a foreign Origin, and
DNS rebinding through a foreign Host). Now the outermost layer refuses them before any route runs."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.testclient import TestClient

from tests.security.conftest import StandInService, client_for
from tray_app import config
from tray_app.config.origins import normalize_origin, split_host
from tray_app.server.http import AuthAndErrors
from tray_app.server.origin_guard import HOST_VERDICTS, PASS, OriginGuard
from tray_app.server.routes import create_app

EVIL = "http://evil.example"


def assert_openai_error(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert error["code"] == code


def test_a_hostile_origin_cannot_approve_jobs_with_a_simple_request(
    client: TestClient, service: StandInService
) -> None:
    job = _awaiting_job(service)
    response = client.post(
        "/failsoft/jobs/approve-all",
        content=b"{}",
        headers={"Content-Type": "text/plain", "Origin": EVIL},
    )
    assert_openai_error(response, 403, "forbidden_origin")
    assert "access-control-allow-origin" not in response.headers
    assert service.executor.approved == []
    assert job.state == "awaiting_approval"


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]
)
def test_control_routes_take_only_json(
    client: TestClient, service: StandInService, content_type: str
) -> None:
    _awaiting_job(service)
    response = client.post(
        "/failsoft/jobs/approve-all", content=b"{}", headers={"Content-Type": content_type}
    )
    assert_openai_error(response, 415, "unsupported_media_type")
    assert service.executor.approved == []


def test_a_control_body_without_a_content_type_is_refused(client: TestClient) -> None:
    # fetch() with a Blob body of no type sends no Content-Type, and needs no preflight.
    response = client.post("/failsoft/config/reload", content=b'{"restart": true}')
    assert "content-type" not in response.request.headers
    assert_openai_error(response, 415, "unsupported_media_type")


def test_json_and_empty_control_posts_still_work(client: TestClient, service: StandInService) -> None:
    job = _awaiting_job(service)
    response = client.post("/failsoft/jobs/approve-all", json={})
    assert response.status_code == 200, response.text
    assert response.json() == {"approved": [job.id]}
    second = _awaiting_job(service)
    response = client.post(f"/failsoft/jobs/{second.id}/reject")  # no body at all: what the tray may send
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "rejected"
    charset = client.post(
        "/failsoft/jobs/approve-all",
        content=b"{}",
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert charset.status_code == 200


@pytest.mark.parametrize(
    "path",
    ["/failsoft/jobs", "/failsoft/status", "/v1/jobs/job-123", "/failsoft/events", "/metrics", "/health"],
)
@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:8750", "127.0.0.1.nip.io:8750"])
def test_a_rebinding_host_reads_nothing(client: TestClient, path: str, host: str) -> None:
    response = client.get(path, headers={"Host": host})
    assert_openai_error(response, 403, "forbidden_host")
    assert set(response.json()) == {"error"}


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "localhost:8750",
        "LOCALHOST:8750",
        "localhost.",
        "127.0.0.1",
        "127.0.0.1:8750",
        "[::1]:8750",
    ],
)
def test_loopback_hosts_pass(client: TestClient, host: str) -> None:
    response = client.get("/failsoft/jobs", headers={"Host": host})
    assert response.status_code == 200, response.text


def test_a_hostile_host_does_not_reach_the_generation_routes(service: StandInService) -> None:
    called: list[str] = []

    async def generate(request: Request) -> Response:
        called.append(request.url.path)
        return JSONResponse({"ok": True})

    app = AuthAndErrors(Starlette(routes=[]), "", direct={"/v1/chat/completions": generate})
    with client_for(app) as client:
        refused = client.post("/v1/chat/completions", json={}, headers={"Host": "attacker.example"})
        assert_openai_error(refused, 403, "forbidden_host")
        refused = client.post("/v1/chat/completions", content=b"{}", headers={"Origin": EVIL})
        assert_openai_error(refused, 403, "forbidden_origin")
        assert called == []
        assert client.post("/v1/chat/completions", json={}).status_code == 200
        assert called == ["/v1/chat/completions"]


def test_allowed_hosts_and_the_configured_host(make_service: Any) -> None:
    service = make_service(host="10.1.2.3", api_key="k", allowed_hosts=["ai-box.lan", "other.lan:9000"])
    headers = {"Authorization": "Bearer k"}
    with client_for(create_app(service, manage_lifecycle=False)) as client:
        for host in ("ai-box.lan", "ai-box.lan:8750", "10.1.2.3:8750", "other.lan:9000", "192.168.1.20:8750"):
            assert client.get("/failsoft/jobs", headers={**headers, "Host": host}).status_code == 200, host
        for host in ("other.lan:8750", "evil.lan", "ai-box.lan.evil.example"):
            refused = client.get("/failsoft/jobs", headers={**headers, "Host": host})
            assert_openai_error(refused, 403, "forbidden_host")


def test_other_address_literals_need_a_service_bound_beyond_loopback(client: TestClient) -> None:
    assert_openai_error(
        client.get("/failsoft/jobs", headers={"Host": "192.168.1.20:8750"}), 403, "forbidden_host"
    )


def test_origins_same_port_loopback_and_allowed(make_service: Any) -> None:
    service = make_service(allowed_origins=["http://localhost:3000", "https://webui.lan"])
    with client_for(create_app(service, manage_lifecycle=False)) as client:
        for origin in ("http://localhost:8750", "http://127.0.0.1:8750", "http://[::1]:8750"):
            response = client.get("/failsoft/jobs", headers={"Origin": origin})
            assert response.status_code == 200, origin
        allowed = client.get("/failsoft/jobs", headers={"Origin": "http://localhost:3000"})
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "Origin" in allowed.headers["vary"]
        assert "X-Failsoft-Job" in allowed.headers["access-control-expose-headers"]
        assert client.get("/failsoft/jobs", headers={"Origin": "https://webui.lan:443"}).status_code == 200
        for origin in (
            "http://localhost:3001",
            "http://localhost",
            "https://localhost:3000",
            "null",
            "file://",
            EVIL,
            "http://127.0.0.1:8751",
            "http://localhost:3000.evil.example",
        ):
            response = client.get("/failsoft/jobs", headers={"Origin": origin})
            assert_openai_error(response, 403, "forbidden_origin")
            assert "access-control-allow-origin" not in response.headers


def test_preflight_answers_allowed_origins_only(make_service: Any) -> None:
    service = make_service(api_key="k", allowed_origins=["http://localhost:3000"])
    with client_for(create_app(service, manage_lifecycle=False)) as client:
        preflight = {
            "Origin": "http://localhost:3000",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        }
        response = client.options("/v1/chat/completions", headers=preflight)  # no key: browsers send none
        assert response.status_code == 204, response.text
        assert response.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "POST" in response.headers["access-control-allow-methods"]
        assert response.headers["access-control-allow-headers"] == "authorization, content-type"
        hostile = client.options("/v1/chat/completions", headers={**preflight, "Origin": EVIL})
        assert_openai_error(hostile, 403, "forbidden_origin")
        assert "access-control-allow-origin" not in hostile.headers
        # The real request from the allowed origin still needs the key; its 401 is readable by the page.
        unauthorized = client.get("/failsoft/jobs", headers={"Origin": "http://localhost:3000"})
        assert_openai_error(unauthorized, 401, "invalid_api_key")
        assert unauthorized.headers["access-control-allow-origin"] == "http://localhost:3000"


def test_a_star_origin_needs_an_api_key() -> None:
    with pytest.raises(config.ConfigError, match="api_key"):
        config.from_dict({"server": {"allowed_origins": ["*"]}})
    with pytest.raises(config.ConfigError, match="api_key"):
        config.from_dict({"server": {"allowed_hosts": ["*"]}})
    cfg = config.from_dict({"server": {"allowed_origins": ["*"], "api_key": "k"}})
    assert cfg.server.allowed_origins == ["*"]
    # Even if a reload put "*" in place while the running service has no key, the guard ignores it.
    cfg.server.api_key = ""
    app = AuthAndErrors(Starlette(routes=[]), "", server=lambda: cfg.server)
    with client_for(app) as client:
        assert_openai_error(client.get("/x", headers={"Origin": EVIL}), 403, "forbidden_origin")


def test_a_star_origin_with_a_key_lets_pages_call_with_the_key(make_service: Any) -> None:
    service = make_service(api_key="k", allowed_origins=["*"])
    with client_for(create_app(service, manage_lifecycle=False)) as client:
        assert_openai_error(client.get("/failsoft/jobs", headers={"Origin": EVIL}), 401, "invalid_api_key")
        response = client.get("/failsoft/jobs", headers={"Origin": EVIL, "Authorization": "Bearer k"})
        assert response.status_code == 200
        assert response.headers["access-control-allow-origin"] == EVIL


@pytest.mark.parametrize(
    "value", [["localhost:3000"], ["http://x/path"], ["ftp://x"], [""], "http://x", [1], ["http://a b"]]
)
def test_bad_allowed_origins_are_config_errors(value: Any) -> None:
    with pytest.raises(config.ConfigError, match="allowed_origins"):
        config.from_dict({"server": {"allowed_origins": value}})


def test_non_ascii_bearer_tokens_are_401_not_500(make_service: Any) -> None:
    service = make_service(api_key="s3cret")
    with client_for(create_app(service, manage_lifecycle=False), raise_server_exceptions=False) as client:
        for token in ("Bearer ключ".encode(), b"Bearer \xff\xfe", "Bearer s3cretü".encode()):
            response = client.get("/failsoft/status", headers={"Authorization": token})  # type: ignore[dict-item]
            assert_openai_error(response, 401, "invalid_api_key")
        assert client.get("/failsoft/status", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_only_the_health_check_is_open_without_the_key(make_service: Any) -> None:
    service = make_service(api_key="s3cret")
    with client_for(create_app(service, manage_lifecycle=False)) as client:
        for path in ("/health", "/v1/health"):
            assert client.get(path).json()["workers"].keys() == {"gpu", "cpu"}
        for path in ("/models", "/v1/models", "/metrics", "/healthz", "/health/x"):
            assert_openai_error(client.get(path), 401, "invalid_api_key")
        assert_openai_error(client.post("/chat/completions", json={}), 401, "invalid_api_key")


def test_a_non_ascii_api_key_works_with_its_utf8_bytes(make_service: Any) -> None:
    service = make_service(api_key="schlüssel")
    with client_for(create_app(service, manage_lifecycle=False)) as client:
        good = {"Authorization": "Bearer schlüssel".encode()}
        assert client.get("/failsoft/status", headers=good).status_code == 200  # type: ignore[arg-type]
        wrong = client.get("/failsoft/status", headers={"Authorization": "Bearer x"})
        assert_openai_error(wrong, 401, "invalid_api_key")


def test_host_and_origin_parsing() -> None:
    assert split_host("LocalHost:8750") == ("localhost", 8750)
    assert split_host("[::1]:8750") == ("::1", 8750)
    assert split_host("[::1]") == ("::1", None)
    assert split_host("example.lan.") == ("example.lan", None)
    assert split_host("x:99999") is None
    assert split_host("x:abc") is None
    assert split_host("[::1") is None
    assert normalize_origin("http://LOCALHOST:3000/") == ("http", "localhost", 3000)
    assert normalize_origin("https://a.lan") == ("https", "a.lan", 443)
    assert normalize_origin("null") is None
    assert normalize_origin("http://a.lan/path") is None


def test_a_kept_host_verdict_follows_a_config_reload() -> None:
    """The guard keeps its verdict per Host for the config object it judged under; a reload (a new
    config object) judges again, so an allow-list change applies to the next request."""
    current = {"server": config.ServerConfig()}
    guard = OriginGuard(lambda: current["server"], "k")
    scope = {"type": "http", "method": "POST", "headers": [(b"host", b"ai-box.lan:8750")]}
    assert guard.check(scope).error is not None  # a name the config does not list
    assert guard.check(scope).error is not None  # the kept verdict
    current["server"] = config.ServerConfig(allowed_hosts=["ai-box.lan"])
    assert guard.check(scope) == PASS
    current["server"] = config.ServerConfig()
    refused = guard.check(scope).error
    assert refused is not None and refused.code == "forbidden_host"


def test_made_up_hosts_do_not_grow_the_kept_verdicts() -> None:
    fixed = config.ServerConfig()
    guard = OriginGuard(lambda: fixed, "")
    for number in range(HOST_VERDICTS * 3):
        scope = {"type": "http", "method": "GET", "headers": [(b"host", f"h{number}.example".encode())]}
        assert guard.check(scope).error is not None
    assert len(guard._host_verdicts) == HOST_VERDICTS
    # Past the bound, a new Host is still judged (not waved through).
    assert guard.check({"type": "http", "headers": [(b"host", b"localhost")]}) == PASS


def test_requests_without_origin_or_host_pass(service: StandInService) -> None:
    """Programs (the tray, curl, SDKs) send no Origin; HTTP/1.0 clients may send no Host."""
    app = create_app(service, manage_lifecycle=False)  # type: ignore[arg-type]
    with client_for(app) as client:
        assert client.get("/failsoft/jobs").status_code == 200
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    import asyncio

    scope = {"type": "http", "method": "GET", "path": "/failsoft/status", "headers": [], "query_string": b""}
    asyncio.run(AuthAndErrors(JSONResponse({"ok": True}), "")(scope, receive, send))
    assert sent[0]["status"] == 200


def _awaiting_job(service: StandInService) -> Any:
    from tray_app.jobs.registry import Job, new_id

    job = Job(
        id=new_id("job"),
        request_id="r",
        kind="chat",
        body={"messages": [{"role": "user", "content": "hi"}]},
        stream=False,
        background=True,
        body_hash="h",
        idempotency_key=None,
        prompt_tokens=1,
        max_tokens=1,
        deadline=1e12,
    )
    service.registry.add(job)
    service.registry.await_approval(job, 10.0, "cpu_too_slow")
    return job
