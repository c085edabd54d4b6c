"""Bounded by bytes, not by count (issue 36): the finished jobs the service holds in memory, and what the
journal keeps of a refused request."""

from __future__ import annotations

import json
import sqlite3
import time
import tracemalloc
from types import SimpleNamespace
from typing import Any

import pytest

from tests.security.conftest import StandInService, client_for
from tray_app.jobs import registry as jobs_registry
from tray_app.jobs.excerpt import EXCERPT
from tray_app.jobs.journal import Journal
from tray_app.jobs.registry import Job, new_id
from tray_app.jobs.weight import approx_bytes
from tray_app.server.routes import create_app

MIB = 1024 * 1024


def answer_with_logprobs(tokens: int, alternatives: int = 20) -> dict[str, Any]:
    """A chat answer as the router assembles it from llama-server's stream with `logprobs` asked for."""

    def entry(n: int) -> dict[str, Any]:
        return {"id": n, "token": f" word{n}", "bytes": [32, 119, 111, 114, 100], "logprob": -0.25 - n / 1000}

    content = [
        {**entry(n), "top_logprobs": [entry(n + k) for k in range(alternatives)]} for n in range(tokens)
    ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": " word" * tokens},
                "logprobs": {"content": content},
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": tokens + 5},
    }


def finished_job(service: StandInService, answer: dict[str, Any]) -> Job:
    job = Job(
        id=new_id("job"),
        request_id="req",
        kind="chat",
        body={"model": "model.gguf", "messages": [{"role": "user", "content": "Tell a story."}]},
        stream=False,
        background=True,
        body_hash="",
        idempotency_key=None,
        prompt_tokens=5,
        max_tokens=len(answer["choices"][0]["logprobs"]["content"]),
        deadline=time.monotonic() + 60,
    )
    service.registry.add(job)
    service.registry.set_state(job, "running")
    service.registry.start_attempt(job, "gpu")
    assert service.registry.complete(job, answer)
    return job


def test_an_answers_weight_is_what_it_holds_in_memory() -> None:
    """The registry's estimate of an answer with log probabilities, against what Python allocates for it."""
    encoded = json.dumps(answer_with_logprobs(400))
    tracemalloc.start()
    try:
        answer = json.loads(encoded)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert 0.75 * held <= approx_bytes(answer) <= 1.25 * held


def test_finished_jobs_are_held_up_to_a_byte_budget_and_read_back_from_the_journal(
    make_service: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The soak's serve process grew 559 MiB/h: 2000 finished jobs were kept in memory whatever they weighed,
    and an answer with log probabilities is several MiB. Now the oldest go once they weigh more than the
    budget; their answers are still read back, from the journal, by whoever holds the job's read token."""
    monkeypatch.setattr(jobs_registry, "KEEP_FINISHED_BYTES", 4 * MIB)
    service: StandInService = make_service()
    answer = answer_with_logprobs(150)
    one = approx_bytes(answer)
    assert one > MIB // 2  # each answer is a good part of the budget
    jobs = [finished_job(service, answer) for _ in range(12)]
    registry = service.registry
    assert registry.finished_bytes <= 4 * MIB
    held = [job for job in jobs if registry.get(job.id) is job]
    assert held == jobs[-len(held) :] and 2 <= len(held) < len(jobs)  # the latest, oldest let go first
    # Its rows are written by the journal's thread: in a service a job's row is in long before the job is let
    # go; here both happen within milliseconds.
    assert service.journal.flush()
    with client_for(create_app(service, manage_lifecycle=False), admin=False) as client:  # type: ignore[arg-type]
        for job in (jobs[0], jobs[-1]):
            got = client.get(f"/v1/jobs/{job.id}", headers={"X-Failsoft-Job-Token": job.read_token})
            assert got.status_code == 200
            assert got.json()["state"] == "completed"
            assert got.json()["result"] == answer


def test_the_job_just_finished_is_held_whatever_it_weighs(
    make_service: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobs_registry, "KEEP_FINISHED_BYTES", MIB // 4)
    service: StandInService = make_service()
    job = finished_job(service, answer_with_logprobs(100))
    assert service.registry.get(job.id) is job
    later = finished_job(service, answer_with_logprobs(100))
    assert service.registry.get(job.id) is None and service.registry.get(later.id) is later


def test_a_refused_request_is_journaled_as_an_excerpt_of_its_body(
    service: StandInService, client: Any, journal: Journal
) -> None:
    """A refused request kept its whole body in the journal (up to `server.max_body`, 4 MiB, each). Now its
    row holds the body's start and size, and the model its job is read back by."""
    service.executor.cpu_speed = SimpleNamespace(tokens_per_second=10.0)  # type: ignore[attr-defined]
    content = "a long pasted document " * 50_000  # 1.1 MiB
    body = {"model": "model.gguf", "messages": [{"role": "user", "content": content}], "max_tokens": 100_000}
    answer = client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "context_length_exceeded"
    assert journal.flush()
    connection = sqlite3.connect(journal.path)
    try:
        rows = connection.execute("SELECT id, state, body FROM jobs").fetchall()
    finally:
        connection.close()
    assert len(rows) == 1
    job_id, state, stored = rows[0]
    assert state == "failed"
    assert len(stored) <= 16 * 1024
    kept = json.loads(stored)
    assert kept["model"] == "model.gguf"
    assert kept[EXCERPT]["bytes"] >= len(content)
    assert '"content": "a long pasted document a long' in kept[EXCERPT]["start"]
    summary = client.get(f"/v1/jobs/{job_id}").json()  # the admin's read, from the journal
    assert summary["state"] == "failed" and summary["model"] == "model.gguf"
