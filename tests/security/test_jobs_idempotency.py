"""Issue 14, finding 3: `POST /v1/jobs` ignored `Idempotency-Key` (two job ids, two executions). It now has
chat's semantics: same key and body -> the same job and no second execution; another body -> 422; a key whose
job ended without an answer may run again."""

from __future__ import annotations

from typing import Any

from starlette.testclient import TestClient

from tests.security.conftest import JOB_BODY, StandInService, client_for
from tray_app.jobs.registry import Job
from tray_app.server.routes import create_app


def post_job(client: TestClient, key: str | None, body: dict[str, Any] = JOB_BODY) -> Any:
    headers = {"Idempotency-Key": key} if key else {}
    return client.post("/v1/jobs", json=body, headers=headers)


def test_the_same_key_and_body_give_the_same_job_and_one_execution(
    client: TestClient, service: StandInService
) -> None:
    first = post_job(client, "key-1")
    assert first.status_code == 202, first.text
    job_id = first.json()["id"]
    again = post_job(client, "key-1")
    assert again.status_code == 202, again.text
    assert again.json()["id"] == job_id
    assert again.headers["x-failsoft-job"] == job_id
    assert again.headers["idempotent-replayed"] == "true"
    assert service.spawned == [job_id]
    assert service.registry.counters["accepted"] == 1


def test_without_a_key_each_post_is_a_new_job(client: TestClient, service: StandInService) -> None:
    ids = {post_job(client, None).json()["id"] for _ in range(2)}
    assert len(ids) == 2
    assert len(service.spawned) == 2


def test_the_same_key_with_another_body_is_422(client: TestClient, service: StandInService) -> None:
    assert post_job(client, "key-2").status_code == 202
    other = {**JOB_BODY, "max_tokens": 5}
    response = post_job(client, "key-2", other)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert error["param"] == "Idempotency-Key"
    assert len(service.spawned) == 1


def test_a_completed_job_is_returned_not_run_again(client: TestClient, service: StandInService) -> None:
    job_id = post_job(client, "key-3").json()["id"]
    job = service.registry.get(job_id)
    assert job is not None
    finish(service, job)
    response = post_job(client, "key-3")
    assert response.status_code == 200, response.text
    assert response.json()["id"] == job_id
    assert response.json()["state"] == "completed"
    assert response.json()["result"]["choices"][0]["message"]["content"] == "done"
    assert service.spawned == [job_id]


def test_a_job_that_ended_without_an_answer_may_be_tried_again(
    client: TestClient, service: StandInService
) -> None:
    job_id = post_job(client, "key-4").json()["id"]
    job = service.registry.get(job_id)
    assert job is not None
    service.registry.fail(job, "cancelled", {"message": "cancelled by request"})
    retry = post_job(client, "key-4")
    assert retry.status_code == 202
    assert retry.json()["id"] != job_id
    assert len(service.spawned) == 2


def test_the_key_holds_across_a_restart(make_service: Any) -> None:
    """A new service on the same journal (no live jobs, no key map) still finds the job under its key."""
    first_service = make_service()
    with client_for(create_app(first_service, manage_lifecycle=False)) as client:
        job_id = post_job(client, "key-5").json()["id"]
        job = first_service.registry.get(job_id)
        finish(first_service, job)
        first_service.journal.flush()
    restarted = make_service()
    with client_for(create_app(restarted, manage_lifecycle=False)) as client:
        response = post_job(client, "key-5")
        assert response.status_code == 200, response.text
        assert response.json()["id"] == job_id
        assert response.json()["state"] == "completed"
        assert post_job(client, "key-5", {**JOB_BODY, "max_tokens": 7}).status_code == 422
    assert restarted.spawned == []


def test_a_key_a_chat_request_used_is_not_a_background_job(
    client: TestClient, service: StandInService
) -> None:
    response = post_job(client, "key-6")
    job = service.registry.get(response.json()["id"])
    assert job is not None
    job.background = False  # as if a chat completion had used this key with the same body
    refused = post_job(client, "key-6")
    assert refused.status_code == 422
    assert refused.json()["error"]["code"] == "idempotency_key_reused"


def finish(service: StandInService, job: Job | None) -> None:
    assert job is not None
    assert service.registry.start_attempt(job, "gpu") == 1
    result = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "done"}}]}
    assert service.registry.complete(job, result)


def test_unfinished_background_jobs_are_bounded(make_service: Any) -> None:
    """Issue 14, bounds: `POST /v1/jobs` had no limit; beyond `server.jobs_max` unfinished jobs it is 429,
    a retry under a known key still finds its job, and a finished job makes room."""
    service = make_service(jobs_max=2)
    with client_for(create_app(service, manage_lifecycle=False)) as client:
        first, second = post_job(client, "a"), post_job(client, "b")
        assert (first.status_code, second.status_code) == (202, 202)
        refused = post_job(client, "c")
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_jobs"
        assert refused.headers["retry-after"]
        assert post_job(client, "a").json()["id"] == first.json()["id"]  # its own job, not refused
        job = service.registry.get(first.json()["id"])
        assert job is not None
        service.registry.fail(job, "cancelled", {"message": "cancelled by request", "code": "cancelled"})
        assert post_job(client, "c").status_code == 202
    assert len(service.spawned) == 3
