"""The OpenAI and control APIs of a real `failsoft serve` with real workers, through the openai client."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.helpers import (
    CHAT,
    COUNTING,
    base_settings,
    events_until_completed,
    failsoft_of,
    job_state,
    wait_until,
)
from tests.support.service import ServiceHandle, module_service

pytestmark = pytest.mark.integration


svc = module_service(settings=base_settings(server={"max_body": "64KiB"}))


def test_chat_answers_and_says_who_served_it(svc: ServiceHandle, client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="SmolLM2-135M-Instruct.Q4_1.gguf",
        messages=CHAT,
        max_tokens=8,
        temperature=0,
        extra_headers={"X-Request-Id": "my-request-1"},
    )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens <= 8
    info = failsoft_of(completion)
    assert info["worker"] == "gpu" and info["attempts"] == 1 and info["fallback_reason"] is None
    assert raw.headers["x-request-id"] == "my-request-1"
    assert raw.headers["x-failsoft-job"] == info["job_id"]
    assert raw.headers["x-failsoft-worker"] == "gpu"
    assert raw.headers["x-failsoft-attempts"] == "1"
    stored = job_state(svc, info["job_id"])
    assert stored["state"] == "completed" and stored["request_id"] == "my-request-1"
    assert [a["worker"] for a in stored["attempt_log"]] == ["gpu"]


def test_stream_passes_chunks_and_ends_with_the_failsoft_chunk(
    svc: ServiceHandle, client: openai.OpenAI
) -> None:
    stream = client.chat.completions.create(
        messages=CHAT, max_tokens=8, temperature=0, model="default", stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    # Every chunk names the model as the service does (the worker's --alias), never by its file path.
    assert {c.model for c in chunks} == {svc.status()["model"]["id"]}
    assert not chunks[-1].choices
    info = failsoft_of(chunks[-1])
    assert info["worker"] == "gpu" and info["attempts"] == 1


def _timing(svc: ServiceHandle) -> dict[str, Any]:
    response = httpx.get(svc.base_url + "/failsoft/timing", headers=svc.headers(), timeout=10)
    response.raise_for_status()
    timing: dict[str, Any] = response.json()
    return timing


def test_the_router_times_its_own_part_of_each_streams_first_token(
    svc: ServiceHandle, client: openai.OpenAI
) -> None:
    before = _timing(svc)
    started = time.perf_counter()
    first_token_ms = None
    for chunk in client.chat.completions.create(
        messages=CHAT, max_tokens=8, temperature=0, model="default", stream=True
    ):
        if first_token_ms is None and chunk.choices and chunk.choices[0].delta.content:
            first_token_ms = (time.perf_counter() - started) * 1000
    client.chat.completions.create(messages=CHAT, max_tokens=2, model="default")  # not a stream: no figure
    after = _timing(svc)

    assert first_token_ms is not None
    assert after["recorded"] == before["recorded"] + 1
    to_worker, to_client = after["recent_ms"][-1]
    # Parts of what the client waited for its first token, measured inside the router: each takes some
    # time, together less than the whole wait (the worker's prompt reading and first token are between).
    assert to_worker > 0 and to_client > 0
    assert to_worker + to_client < first_token_ms
    assert after["requests"] == len(after["recent_ms"]) and after["total_ms"] is not None


def test_completions_plain_and_streamed_agree_at_temperature_zero(client: openai.OpenAI) -> None:
    plain = client.completions.create(model="default", prompt="1, 2, 3,", max_tokens=6, temperature=0)
    streamed = client.completions.create(
        model="default", prompt="1, 2, 3,", max_tokens=6, temperature=0, stream=True
    )
    text = "".join(c.choices[0].text for c in streamed if c.choices)
    assert plain.choices[0].text == text
    assert failsoft_of(plain)["worker"] == "gpu"


def test_models_lists_the_one_model(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]


def test_llama_servers_paths_without_v1_answer_as_llama_server_does(svc: ServiceHandle) -> None:
    # A client given llama-server's base URL without /v1 asks for /chat/completions, /models, /responses.
    bare = openai.OpenAI(base_url=svc.base_url, api_key="unused", max_retries=0, timeout=120)
    completion = bare.chat.completions.create(model="default", messages=CHAT, max_tokens=2)
    assert failsoft_of(completion)["worker"] == "gpu"
    assert [model.id for model in bare.models.list()] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    response = bare.responses.create(model="default", input="Hi", max_output_tokens=4)
    assert response.status in ("completed", "incomplete") and response.output
    # llama-server's own formats are not served; the answer says where OpenAI's is.
    native = httpx.post(svc.base_url + "/completions", json={"prompt": "Hi"}, timeout=10)
    assert native.status_code == 404
    assert native.json()["error"]["message"].endswith("under /v1 here: POST /v1/completions")
    assert httpx.get(svc.base_url + "/chat/completions", timeout=10).status_code == 405


def test_health_says_ok_with_the_workers_states(svc: ServiceHandle) -> None:
    for path in ("/health", "/v1/health"):
        answer = httpx.get(svc.base_url + path, timeout=10)
        assert answer.status_code == 200
        workers = {"gpu": "ready", "cpu": "ready"}
        assert answer.json() == {"status": "ok", "workers": workers, "simulated": True}


def test_unseeded_requests_get_a_pinned_seed(svc: ServiceHandle, client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model="default", messages=CHAT, max_tokens=4)
    response = httpx.get(f"{svc.base_url}/failsoft/jobs", timeout=10, headers=svc.headers())
    jobs = {job["id"]: job for job in response.json()["data"]}
    assert failsoft_of(completion)["job_id"] in jobs
    # The journal has the body as sent upstream; its seed was chosen before the first attempt.
    stored = job_state(svc, failsoft_of(completion)["job_id"])
    assert stored["state"] == "completed"
    assert isinstance(stored["seed"], int)


def test_idempotent_replay_mismatch_and_conflict(svc: ServiceHandle, client: openai.OpenAI) -> None:
    key = {"Idempotency-Key": "order-42"}
    first = client.chat.completions.with_raw_response.create(
        model="default", messages=CHAT, max_tokens=6, temperature=0, seed=3, extra_headers=key
    )
    again = client.chat.completions.with_raw_response.create(
        model="default", messages=CHAT, max_tokens=6, temperature=0, seed=3, extra_headers=key
    )
    assert again.headers.get("idempotent-replayed") == "true"
    assert again.parse().model_dump() == first.parse().model_dump()
    with pytest.raises(openai.UnprocessableEntityError) as mismatch:
        client.chat.completions.create(
            model="default", messages=CHAT, max_tokens=7, temperature=0, seed=3, extra_headers=key
        )
    assert mismatch.value.code == "idempotency_key_reused"

    # A long request holds a new key while a second one with the same key arrives: 409.
    busy_key = {"Idempotency-Key": "order-43"}
    results: dict[str, Any] = {}

    def long_request() -> None:
        results["long"] = client.completions.create(  # type: ignore[call-overload]
            **COUNTING, max_tokens=200, seed=1, extra_headers=busy_key
        )

    thread = threading.Thread(target=long_request)
    thread.start()
    wait_until(
        lambda: any(
            j["state"] == "running"
            for j in httpx.get(f"{svc.base_url}/failsoft/jobs?state=running", headers=svc.headers()).json()[
                "data"
            ]
        ),
        what="the long request to run",
    )
    with pytest.raises(openai.ConflictError) as conflict:
        client.completions.create(**COUNTING, max_tokens=200, seed=1, extra_headers=busy_key)  # type: ignore[call-overload]
    assert conflict.value.code == "idempotency_key_in_progress"
    thread.join(120)
    assert results["long"].choices[0].text


def _post(
    svc: ServiceHandle, path: str, content: bytes, headers: dict[str, str] | None = None
) -> httpx.Response:
    return httpx.post(
        svc.base_url + path,
        content=content,
        headers={"Content-Type": "application/json", **(headers or {})},
        timeout=60,
    )


def _assert_openai_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert "Traceback" not in response.text and 'File "' not in response.text
    if code is not None:
        assert error["code"] == code
    data: dict[str, Any] = error
    return data


def test_bad_input_gets_openai_errors(svc: ServiceHandle) -> None:
    _assert_openai_error(_post(svc, "/v1/chat/completions", b"{not json"), 400, "invalid_json")
    _assert_openai_error(_post(svc, "/v1/chat/completions", b'{"messages": "hello"}'), 400)
    error = _assert_openai_error(
        _post(svc, "/v1/chat/completions", json.dumps({"messages": CHAT, "max_tokens": "x"}).encode()), 400
    )
    assert error["param"] == "max_tokens"
    _assert_openai_error(_post(svc, "/v1/completions", b'{"prompt": 12}'), 400)
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 70_000}]}).encode()
    _assert_openai_error(_post(svc, "/v1/chat/completions", big), 413, "request_too_large")
    unknown = json.dumps({"model": "gpt-17", "messages": CHAT}).encode()
    _assert_openai_error(_post(svc, "/v1/chat/completions", unknown), 404, "model_not_found")
    _assert_openai_error(httpx.get(svc.base_url + "/v1/nothing-here", timeout=10), 404)
    _assert_openai_error(httpx.get(svc.base_url + "/v1/chat/completions", timeout=10), 405)
    # A request longer than every profile: a controlled error saying what would fit.
    too_long = json.dumps({"messages": CHAT, "max_tokens": 100_000}).encode()
    error = _assert_openai_error(_post(svc, "/v1/chat/completions", too_long), 400, "context_length_exceeded")
    assert "fits" in error["message"]


def test_without_enable_faults_the_debug_routes_do_not_exist(svc: ServiceHandle) -> None:
    response = httpx.post(
        svc.base_url + "/failsoft/debug/faults", json={"kind": "abort"}, timeout=10, headers=svc.headers()
    )
    _assert_openai_error(response, 404)
    _assert_openai_error(
        httpx.post(svc.base_url + "/failsoft/debug/pressure", json={}, timeout=10, headers=svc.headers()), 404
    )


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=10), children, max_size=3)
    ),
    max_leaves=8,
)
FIELDS = st.sampled_from(
    [
        "messages",
        "prompt",
        "max_tokens",
        "temperature",
        "stream",
        "seed",
        "stop",
        "tools",
        "n",
        "model",
        "top_p",
    ]
)
BODIES = st.dictionaries(FIELDS, JSON_VALUES, max_size=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/jobs"]),
    body=BODIES,
    max_tokens=st.integers(min_value=1, max_value=3),
)
def test_fuzzed_bodies_never_get_a_5xx(
    svc: ServiceHandle, path: str, body: dict[str, Any], max_tokens: int
) -> None:
    # Whatever else the body holds, keep generation tiny so the fuzz stays fast.
    if isinstance(body.get("max_tokens"), int) and not isinstance(body["max_tokens"], bool):
        body["max_tokens"] = max_tokens
    body.pop("stream", None)
    response = _post(svc, path, json.dumps(body).encode())
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        _assert_openai_error(response, response.status_code)


TOOL_F = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
# Mostly well-typed values, so that most examples get past the router's checks and reach a worker, where
# llama-cpp-python raises on some of them (an unknown tool, a bad grammar, a template that cannot cope).
OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "grammar": st.sampled_from(['root ::= "a" | "b"', "root ::= (", ""]) | st.text(max_size=12),
        "tools": st.sampled_from([[TOOL_F], [{"type": "function", "function": {}}], [{}], []]),
        "tool_choice": st.sampled_from(
            [
                "auto",
                "none",
                "required",
                {"type": "function", "function": {"name": "missing"}},
                {"type": "function", "function": {"name": "f"}},
                {"type": "function"},
            ]
        ),
        "response_format": st.sampled_from(
            [
                {"type": "json_object"},
                {"type": "json_object", "schema": {"type": "nonsense"}},
                {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
                {"type": "text"},
                {"type": "other"},
            ]
        ),
        "logit_bias": st.dictionaries(
            st.sampled_from(["0", "2", "-1", "99999999", "hello"]), st.integers(-100, 100)
        ),
        "logit_bias_type": st.sampled_from(["tokens", "input_ids", "other"]),
        "stop": st.lists(st.text(max_size=4), max_size=3),
        "top_k": st.integers(-5, 10**6),
        "temperature": st.floats(-2, 1e6, allow_nan=False),
        "min_tokens": st.integers(-1, 8),
        "seed": st.integers(-(2**63), 2**64),
        "mirostat_mode": st.integers(-1, 3),
        "mirostat_tau": st.floats(-1, 20, allow_nan=False),
        "messages": st.sampled_from(
            [
                [{"role": "system", "content": "Be brief."}, *CHAT],
                [*CHAT, {"role": "assistant", "content": None, "tool_calls": [{}]}],
                [{"role": "tool", "content": "4", "tool_call_id": "1"}],
                [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]}],
            ]
        ),
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(options=OPTIONS, stream=st.booleans())
def test_fuzzed_options_on_a_good_request_get_no_5xx_and_restart_no_worker(
    svc: ServiceHandle, options: dict[str, Any], stream: bool
) -> None:
    restarts = {role: worker["restarts"] for role, worker in svc.status()["workers"].items()}
    body = {"messages": CHAT, **options, "max_tokens": 2, "stream": stream}
    response = _post(svc, "/v1/chat/completions", json.dumps(body).encode())
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        _assert_openai_error(response, response.status_code)
    elif stream:
        # A refusal inside a stream is the client's error, never a failed worker or a failover.
        errors = [
            json.loads(line[6:])["error"]
            for line in response.text.splitlines()
            if line.startswith('data: {"error"')
        ]
        assert all(error["type"] == "invalid_request_error" for error in errors), errors
    assert {role: worker["restarts"] for role, worker in svc.status()["workers"].items()} == restarts


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200))
def test_fuzzed_bytes_never_get_a_5xx(svc: ServiceHandle, raw: bytes) -> None:
    response = _post(svc, "/v1/chat/completions", raw)
    assert response.status_code < 500, response.text


def test_status_has_the_documented_shape(svc: ServiceHandle) -> None:
    status = svc.status()
    assert status["simulated"] is True
    assert {
        "device",
        "plan",
        "cpu_plan",
        "caps",
        "workers",
        "queue",
        "approvals",
        "counters",
        "policy",
    } <= set(status)
    assert set(status["caps"]) == {"n_ctx", "n_ctx_per_seq", "n_parallel", "cpu_n_ctx"}
    for role in ("gpu", "cpu"):
        worker = status["workers"][role]
        assert {"state", "pid", "rss_bytes", "cpu_percent", "restarts", "last_failure"} <= set(worker)
        assert worker["state"] == "ready" and isinstance(worker["pid"], int)
    assert set(status["queue"]) == {"depth", "limit"}
    assert status["plan"]["simulated"] is True and status["plan"]["kv_bytes"] > 0
    assert status["counters"]["completed"] >= 1


def test_metrics_are_prometheus_text(svc: ServiceHandle, client: openai.OpenAI) -> None:
    client.chat.completions.create(model="default", messages=CHAT, max_tokens=2)
    text = httpx.get(svc.base_url + "/metrics", timeout=10).text
    assert 'failsoft_requests_total{outcome="completed",route="gpu"}' in text
    assert (
        "failsoft_queue_depth" in text and "failsoft_fallbacks" in text and "failsoft_worker_restarts" in text
    )


def test_events_stream_job_states(svc: ServiceHandle, client: openai.OpenAI) -> None:
    with events_until_completed(svc) as seen:
        client.chat.completions.create(model="default", messages=CHAT, max_tokens=2)
    types = [event_type for event_type, _ in seen]
    assert "route_decided" in types and "job_state" in types
    assert all(data["type"] == event_type for event_type, data in seen)


def test_background_job_runs_and_can_be_collected(svc: ServiceHandle) -> None:
    response = httpx.post(
        svc.base_url + "/v1/jobs", json={"messages": CHAT, "max_tokens": 6, "temperature": 0}, timeout=30
    )
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    done = wait_until(
        lambda: (s := job_state(svc, job_id))["state"] == "completed" and s, what="background job"
    )
    assert done["result"]["choices"][0]["message"]["content"]
    assert done["result"]["failsoft"]["job_id"] == job_id


def _worker_pids(svc: ServiceHandle) -> dict[str, int]:
    return {role: worker["pid"] for role, worker in svc.status()["workers"].items()}


def test_a_grammar_llama_cpp_cannot_parse_is_refused_and_no_worker_dies(
    svc: ServiceHandle, client: openai.OpenAI
) -> None:
    svc.wait_workers_ready()
    before = _worker_pids(svc)
    for grammar, code in (("root ::= (", "invalid_grammar"), ('x ::= "a"', "invalid_grammar"), (5, None)):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model="default", messages=CHAT, max_tokens=4, extra_body={"grammar": grammar}
            )
        assert refused.value.param == "grammar"
        assert code is None or refused.value.code == code

    # Nothing but the router reaches a worker: each has its own key, which no client is given.
    worker = svc.status()["workers"]["gpu"]["base_url"]
    body = {"messages": CHAT, "max_tokens": 4, "grammar": "root ::= ("}
    assert httpx.post(f"{worker}/v1/chat/completions", json=body, timeout=60).status_code == 401

    # A grammar llama.cpp accepts constrains the answer, whole and streamed.
    yes_no = {"grammar": 'root ::= "yes" | "no"'}
    answer = client.chat.completions.create(
        model="default", messages=CHAT, max_tokens=4, temperature=0, extra_body=yes_no
    )
    assert answer.choices[0].message.content in ("yes", "no")
    stream = client.chat.completions.create(
        model="default", messages=CHAT, max_tokens=4, temperature=0, extra_body=yes_no, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) in ("yes", "no")
    assert _worker_pids(svc) == before


def test_a_request_the_worker_refuses_is_the_clients_error_and_no_worker_restarts(
    svc: ServiceHandle, client: openai.OpenAI
) -> None:
    svc.wait_workers_ready()
    before = _worker_pids(svc)
    # A named tool_choice that names no tool in the list is refused up front.
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as unknown:
        client.chat.completions.create(
            model="default",
            messages=CHAT,
            max_tokens=4,
            tools=[tool],  # type: ignore[list-item]
            tool_choice={"type": "function", "function": {"name": "subtract"}},
        )
    assert "subtract" in unknown.value.message and unknown.value.param == "tool_choice"
    # Passes the router's checks; llama-server cannot make a parser of the tool's parameters.
    unparsable = {
        "model": "default",
        "messages": CHAT,
        "max_tokens": 4,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": "not a schema"}}],
    }
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**unparsable)
    assert "schema must be an object" in refused.value.message
    assert refused.value.response.headers["x-failsoft-attempts"] == "1"
    # A stream has its status line already: the refusal is its error event.
    with pytest.raises(openai.APIError, match="schema must be an object") as streamed:
        for _chunk in client.chat.completions.create(**unparsable, stream=True):
            pass
    assert streamed.value.body["code"] == "invalid_request"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as empty:
        client.completions.create(model="default", prompt="", max_tokens=4)
    assert empty.value.code == "empty_prompt"
    assert _worker_pids(svc) == before
    # The workers still answer.
    assert client.chat.completions.create(model="default", messages=CHAT, max_tokens=2).choices


def test_structured_output_with_a_json_schema(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
        "required": ["colour"],
    }
    answer = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Pick a colour."}],
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "pick", "schema": schema}},
    )
    content = answer.choices[0].message.content or ""
    assert json.loads(content)["colour"] in ("red", "green", "blue")


def test_a_stream_reports_token_counts_when_asked(client: openai.OpenAI) -> None:
    def usages(**options: Any) -> list[Any]:
        stream = client.chat.completions.create(
            model="default", messages=CHAT, max_tokens=5, temperature=0, stream=True, **options
        )
        return [chunk.usage for chunk in stream if chunk.usage is not None]

    (usage,) = usages(stream_options={"include_usage": True})
    assert usage.prompt_tokens > 0 and 1 <= usage.completion_tokens <= 5
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    answer = client.chat.completions.create(model="default", messages=CHAT, max_tokens=5, temperature=0)
    assert answer.usage is not None and answer.usage.prompt_tokens == usage.prompt_tokens
    assert usages() == []  # not asked: no counts, as OpenAI does


def test_chat_log_probabilities_whole_and_streamed(client: openai.OpenAI) -> None:
    options: dict[str, Any] = {"model": "default", "messages": CHAT, "max_tokens": 5, "temperature": 0}
    whole = client.chat.completions.create(**options, logprobs=True, top_logprobs=2)
    logprobs = whole.choices[0].logprobs
    assert logprobs is not None and logprobs.content
    assert "".join(item.token for item in logprobs.content) == whole.choices[0].message.content
    assert all(item.logprob <= 0 and len(item.top_logprobs) == 2 for item in logprobs.content)
    streamed = client.chat.completions.create(**options, logprobs=True, top_logprobs=2, stream=True)
    tokens = [
        item.token
        for chunk in streamed
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content
        for item in chunk.choices[0].logprobs.content
    ]
    assert "".join(tokens) == whole.choices[0].message.content  # the same seed at temperature 0
    zero = client.chat.completions.create(**options, logprobs=True, top_logprobs=0)
    assert zero.choices[0].logprobs is not None and zero.choices[0].logprobs.content  # 0: still the tokens'
    plain = client.chat.completions.create(**options)
    assert plain.choices[0].logprobs is None  # not asked for


def test_newer_openai_message_shapes_reach_the_model(client: openai.OpenAI) -> None:
    # The `developer` role and content as an array of text parts, as current OpenAI clients send them.
    messages: Any = [
        {"role": "developer", "content": [{"type": "text", "text": "Answer in one word."}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "What colour"}, {"type": "text", "text": "is the sky?"}],
        },
    ]
    answer = client.chat.completions.create(model="default", messages=messages, max_tokens=4, temperature=0)
    assert answer.choices[0].message.content
    stream = client.chat.completions.create(model="default", messages=messages, max_tokens=4, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


def test_a_reload_with_a_restart_that_is_not_a_boolean_is_refused(svc: ServiceHandle) -> None:
    response = httpx.post(
        svc.base_url + "/failsoft/config/reload", json={"restart": "yes"}, timeout=10, headers=svc.headers()
    )
    _assert_openai_error(response, 400)
    assert response.json()["error"]["param"] == "restart"


def test_background_job_can_be_cancelled(svc: ServiceHandle) -> None:
    response = httpx.post(svc.base_url + "/v1/jobs", json={**COUNTING, "max_tokens": 400}, timeout=30)
    job_id = response.json()["id"]
    wait_until(lambda: job_state(svc, job_id)["state"] == "running", what="job to run")
    cancelled = httpx.delete(f"{svc.base_url}/v1/jobs/{job_id}", timeout=10, headers=svc.headers())
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    # The worker is free again at once: a new request is answered quickly.
    assert httpx.post(
        svc.base_url + "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2}, timeout=30
    ).is_success
    assert job_state(svc, job_id)["state"] == "cancelled"
    assert (
        httpx.get(f"{svc.base_url}/v1/jobs/job-unknown", timeout=10, headers=svc.headers()).status_code == 404
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("id_slot", 0),
        ("n_cmpl", 2),
        ("n_predict", 60),
        ("n_probs", 50),
        ("t_max_predict_ms", 1),
        ("lora", []),
    ],
)
def test_llama_servers_own_fields_are_refused_by_name(
    svc: ServiceHandle, client: openai.OpenAI, field: str, value: Any
) -> None:
    """Review N2: `id_slot` pinned requests to one slot (both workers were then killed as hung), `n_cmpl`
    merged two answers, `n_predict` outran the `max_tokens` admission counted. Now a 400 names the field."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="default", messages=CHAT, max_tokens=5, extra_body={field: value}
        )
    assert refused.value.code == "unsupported_field"
    assert refused.value.param == field and field in str(refused.value.message)
    completions = httpx.post(
        svc.v1 + "/completions", json={"prompt": "Count: 1,", "max_tokens": 5, field: value}, timeout=30
    )
    assert completions.status_code == 400 and completions.json()["error"]["param"] == field


def test_concurrent_requests_with_engine_fields_leave_the_workers_alone(
    svc: ServiceHandle, client: openai.OpenAI
) -> None:
    """The review's reproduction: three concurrent streams pinned to slot 0. All are refused up front; the
    workers keep their pids, and a plain request is served at once."""
    before = {role: svc.status()["workers"][role]["pid"] for role in ("gpu", "cpu")}
    body = {"prompt": "Count: 1,", "max_tokens": 200, "ignore_eos": True, "stream": True, "id_slot": 0}
    answers: list[int] = []

    def ask() -> None:
        answers.append(httpx.post(svc.v1 + "/completions", json=body, timeout=60).status_code)

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert answers == [400, 400, 400]
    answer = client.chat.completions.create(model="default", messages=CHAT, max_tokens=4)
    assert failsoft_of(answer)["worker"] == "gpu"
    assert {role: svc.status()["workers"][role]["pid"] for role in ("gpu", "cpu")} == before


def test_fields_the_router_does_not_forward_are_dropped_and_extensions_still_work(
    client: openai.OpenAI,
) -> None:
    """An unknown field is ignored (not forwarded); llama.cpp's sampling extensions still reach the worker:
    `ignore_eos` makes it write exactly max_tokens, which `max_tokens` bounds."""
    answer = client.chat.completions.create(
        model="default",
        messages=CHAT,
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True, "top_k": 5, "min_p": 0.1, "some_client_field": {"x": 1}},
    )
    assert answer.usage is not None and answer.usage.completion_tokens == 12
