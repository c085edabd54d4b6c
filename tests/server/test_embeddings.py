"""`/v1/embeddings` with the real openai client against a real service: the OpenAI shape (float and
base64, which the client asks for by default), the identity of who answered, bad input, and a GPU
embeddings worker that dies mid-request failing over to the CPU one exactly once; the GPU embeddings
worker's measured buffers kept for the planner apart from the chat worker's.

The tests embed with the bundled chat model (mean-pooled): no small embedding GGUF is published on PyPI;
`[embeddings] model` takes a dedicated one."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest

from tests.support.helpers import arm, base_settings, job_state, wait_until
from tests.support.service import ServiceHandle, module_service

pytestmark = pytest.mark.integration

TEXTS = ["The sea is blue.", "A violin has four strings.", "The sea is blue."]


svc = module_service(enable_faults=True, settings=base_settings())


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def test_embeddings_in_the_openai_shape(svc: ServiceHandle, client: openai.OpenAI) -> None:
    raw = client.embeddings.with_raw_response.create(model="default", input=TEXTS)  # base64 on the wire
    answer = raw.parse()
    vectors = [item.embedding for item in answer.data]
    assert [item.index for item in answer.data] == [0, 1, 2]
    assert len({len(vector) for vector in vectors}) == 1 and len(vectors[0]) >= 64
    assert cosine(vectors[0], vectors[2]) > 0.999  # the same text, the same vector
    assert cosine(vectors[0], vectors[1]) < 0.99
    assert answer.usage.prompt_tokens > 0 and answer.model == svc.status()["model"]["id"]
    assert raw.headers["x-failsoft-worker"] == "gpu" and raw.headers["x-failsoft-attempts"] == "1"
    floats = client.embeddings.create(model="default", input=TEXTS[0], encoding_format="float")
    assert cosine(floats.data[0].embedding, vectors[0]) > 0.999
    job = job_state(svc, raw.headers["x-failsoft-job"])
    assert (job["kind"], job["state"], job["worker"]) == ("embedding", "completed", "gpu")
    assert job["result"]["count"] == 3 and "data" not in job["result"]  # no vectors in the journal
    embed_workers = svc.status()["embedding_workers"]
    assert embed_workers["gpu-embed"]["state"] == "ready"  # started by the first request
    # Its buffers were kept for the planner apart from the chat worker's (its logits are a batch's).
    reported = embed_workers["gpu-embed"]["health"]["buffers"]
    kept = [
        record
        for path in (svc.data_dir / "calibration").rglob("*.json")
        if (record := json.loads(path.read_text()))["settings"]["embeddings"]
    ]
    assert [record["buffers"]["compute_bytes"] for record in kept] == [reported["compute_bytes"]]
    assert kept[0]["settings"]["n_ctx"] == embed_workers["gpu-embed"]["health"]["n_ctx"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input[0]"),
        ({"input": []}, "input"),
        ({"input": [1.5]}, "input[0]"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "dimensions": 64}, "dimensions"),
    ],
)
def test_bad_input_is_a_clear_400(svc: ServiceHandle, body: dict[str, object], param: str) -> None:
    response = httpx.post(svc.v1 + "/embeddings", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_an_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(model="nope", input="x")
    assert missing.value.code == "model_not_found"


def test_a_gpu_embeddings_worker_dying_mid_request_fails_over_once(
    svc: ServiceHandle, client: openai.OpenAI
) -> None:
    client.embeddings.create(model="default", input="warm")  # the GPU embeddings worker is up
    armed = arm(svc, "abort", after_tokens=0, role="gpu-embed")
    raw = client.embeddings.with_raw_response.create(model="default", input=TEXTS[:2])
    assert len(raw.parse().data) == 2
    assert (raw.headers["x-failsoft-worker"], raw.headers["x-failsoft-attempts"]) == ("cpu", "2")
    job = job_state(svc, raw.headers["x-failsoft-job"])
    assert job["fallback_reason"] == "crash_abort"
    assert [(a["worker"], a["outcome"]) for a in job["attempt_log"]] == [
        ("gpu", "failed"),
        ("cpu", "completed"),
    ]

    def replaced() -> bool:
        worker = svc.status()["embedding_workers"]["gpu-embed"]
        return worker["state"] == "ready" and worker["pid"] != armed["pid"]

    wait_until(replaced, what="the GPU embeddings worker restarted")
    again = client.embeddings.with_raw_response.create(model="default", input="after")
    assert again.headers["x-failsoft-worker"] == "gpu"
