"""Bad input gets a refusal in the caller's API's shape, never a 500; Ollama's model names are taken on every
route; embeddings are bounded by their tokens, and their time allowance grows with them (fast tier: the
ASGI app over the stand-in service, and the pieces themselves)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.security.answering import AnsweringService, answering_client, answering_service, tokens  # noqa: F401
from tests.security.conftest import StandInService, client_for
from tray_app import config
from tray_app.config import ConfigError
from tray_app.contract.events import EventBus
from tray_app.jobs import policy
from tray_app.jobs.admission import SlotPool
from tray_app.jobs.assemble import chat_chunk
from tray_app.jobs.context import JobsContext
from tray_app.jobs.embeddings import (
    ANSWER_SECONDS,
    SLOWEST_TOKENS_PER_SECOND,
    EmbeddingRunner,
    answer_seconds,
)
from tray_app.jobs.journal import Journal
from tray_app.jobs.registry import Job, JobRegistry, new_id
from tray_app.jobs.worker_port import ExecutorSettings
from tray_app.library.catalog import Catalog, ModelEntry, resolve_name
from tray_app.library.errors import LoadRefused
from tray_app.library.keep_alive import FOREVER, parse_keep_alive
from tray_app.server.embedding_requests import check_tokens, input_token_limit
from tray_app.server.errors import ApiError
from tray_app.server.ollama.answer import Timing
from tray_app.server.ollama.names import model_name
from tray_app.server.ollama.stream import StreamTranslator
from tray_app.server.routes import create_app
from tray_app.server.streaming import failsoft_chunk, sse

CHAT = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}


# ------------------------------------------------------------------------------------------ N10
@pytest.mark.parametrize(
    ("path", "body", "shape"),
    [
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "a\ud800b"}]}, "openai"),
        ("/v1/messages", {**CHAT, "system": "\udfff"}, "anthropic"),
        ("/api/chat", {"model": "default", "messages": [{"role": "user", "content": "\ud800"}]}, "ollama"),
        ("/v1/embeddings", {"input": ["ok", "\ud800"]}, "openai"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(
    client: TestClient, path: str, body: dict[str, Any], shape: str
) -> None:
    raw = json.dumps(body).encode()  # the lone surrogate as the escape a client sends
    assert b"\\ud" in raw
    response = client.post(path, content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    message = error if shape == "ollama" else error["message"]
    assert "surrogate" in message
    if shape == "openai":
        assert error["param"] in ("messages[0].content", "input[1]") and error["code"] == "invalid_unicode"


def test_a_surrogate_pair_is_text(client: TestClient) -> None:
    body = {**CHAT, "messages": [{"role": "user", "content": "\U0001f600"}]}
    raw = json.dumps(body).encode()  # written as the pair \ud83d\ude00
    assert b"\\ud83d" in raw
    response = client.post("/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code != 400, response.text


def test_json_nested_past_the_limit_is_a_400_naming_the_field(client: TestClient) -> None:
    for depth in (150, 5000):  # within the interpreter's recursion limit, and far past it
        raw = (
            b'{"messages": [{"role": "user", "content": "x"}], "tools": ' + b"[" * depth + b"]" * depth + b"}"
        )
        response = client.post(
            "/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 400, response.text
        assert "nested more than" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (10**400, FOREVER),
        (2**63, FOREVER),
        (9e18, FOREVER),
        ("9" * 30 + "h", FOREVER),
        (300, 300.0),
        ("5m", 300.0),
    ],
)
def test_a_keep_alive_past_any_duration_keeps_the_model_for_good(value: Any, seconds: float) -> None:
    assert parse_keep_alive(value) == seconds


def test_an_empty_max_body_is_a_config_error_naming_the_file_and_key() -> None:
    with pytest.raises(ConfigError) as refused:
        config.from_dict({"server": {"max_body": ""}}, source="/etc/failsoft/config.toml")
    assert "/etc/failsoft/config.toml" in str(refused.value) and "server.max_body" in str(refused.value)


class RefusingLibrary:
    """A library whose model fits on neither device now."""

    def __init__(self) -> None:
        self.tried: list[str] = []

    def roles(self, entry: ModelEntry) -> dict[str, str]:
        return {"gpu": f"gpu@{entry.name}", "cpu": f"cpu@{entry.name}"}

    async def load(self, entry: ModelEntry, device: str, wait: float) -> bool:
        self.tried.append(device)
        raise LoadRefused(f"{entry.name} does not fit on the {device.upper()} now: too big")

    def touch(self, name: str, keep_alive: float | None = None) -> None:
        return None


def test_an_ollama_load_refused_on_both_devices_is_a_503_in_ollamas_shape(service: StandInService) -> None:
    big = ModelEntry("big", Path("big.gguf"), (), main=False)
    service.catalog = Catalog([service.catalog.main, big])
    service.model_names = {*service.model_names, "big"}
    library = RefusingLibrary()
    service.library = library  # type: ignore[assignment]
    with client_for(create_app(service, manage_lifecycle=False)) as client:  # type: ignore[arg-type]
        response = client.post("/api/generate", json={"model": "big:latest"})  # Ollama's "load the model"
    assert response.status_code == 503, response.text
    assert library.tried == ["gpu", "cpu"]
    message = response.json()["error"]
    assert "GPU now" in message and "CPU now" in message and response.headers["retry-after"]


# ------------------------------------------------------------------------------------------ Ollama's names
def test_ollama_names_mean_the_librarys_models() -> None:
    known = {"SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1", "default", "qwen2.5:7b"}
    assert resolve_name("SmolLM2-135M-Instruct.Q4_1:latest", known) == "SmolLM2-135M-Instruct.Q4_1"
    assert resolve_name("smollm2-135m-instruct.q4_1", known) == "SmolLM2-135M-Instruct.Q4_1"
    assert resolve_name("default:latest", known) == "default"
    assert resolve_name("qwen2.5:7b", known) == "qwen2.5:7b"  # a tag the library knows
    assert resolve_name("registry.ollama.ai/library/qwen2.5:7b", known) == "qwen2.5:7b"
    for unknown in ("qwen2.5", "qwen2.5:latest", "default:7b", "SmolLM2:135m", ""):
        assert resolve_name(unknown, known) is None, unknown
    assert model_name("qwen2.5:7b") == "qwen2.5:7b" and model_name("m.gguf") == "m:latest"


@pytest.mark.parametrize(
    ("path", "body", "named"),
    [
        ("/v1/chat/completions", {**CHAT, "stream": False}, lambda answer: answer["model"]),
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 4}, lambda answer: answer["model"]),
        ("/v1/messages", CHAT, lambda answer: answer["model"]),
        ("/v1/embeddings", {"input": "Hi"}, lambda answer: answer["model"]),
        ("/v1/messages/count_tokens", {"messages": CHAT["messages"]}, None),
        ("/v1/responses/input_tokens", {"input": "Hi"}, None),
    ],
)
def test_an_ollama_tag_name_is_taken_where_a_model_name_is_and_answered_as_asked(
    answering_client: TestClient,  # noqa: F811  (the fixture)
    model_path: Path,
    path: str,
    body: dict[str, Any],
    named: Any,
) -> None:
    for name in (model_path.stem + ":latest", "Default:latest", model_path.name.upper()):
        response = answering_client.post(path, json={**body, "model": name})
        assert response.status_code == 200, (name, response.text)
        if named is not None:
            assert named(response.json()) == name  # as Ollama's own OpenAI routes name it
    missing = answering_client.post(path, json={**body, "model": model_path.stem + ":7b"})
    assert missing.status_code == 404, missing.text


def test_a_streamed_answer_names_the_model_as_asked_in_every_chunk(
    answering_client: TestClient,  # noqa: F811  (the fixture)
    model_path: Path,
) -> None:
    name = model_path.stem + ":latest"
    response = answering_client.post("/v1/chat/completions", json={**CHAT, "model": name, "stream": True})
    chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    assert len(chunks) >= 2 and {chunk["model"] for chunk in chunks} == {name}
    assert response.text.rstrip().endswith("data: [DONE]")


# ------------------------------------------------------------------------------------------ N9
def test_an_embeddings_input_is_bounded_by_what_a_worker_reads_at_once() -> None:
    cfg = config.from_dict({"embeddings": {"n_ctx": 2048, "n_parallel": 2}, "budget": {"n_ubatch": 512}})
    assert input_token_limit(cfg) == 512
    assert check_tokens([512, 3], cfg) == 515
    with pytest.raises(ApiError) as long:
        check_tokens([3, 513], cfg)
    assert (long.value.status, long.value.code, long.value.param) == (
        400,
        "context_length_exceeded",
        "input[1]",
    )
    small = config.from_dict({"embeddings": {"n_ctx": 512, "n_parallel": 4}})
    assert input_token_limit(small) == 128  # a slot's share of the context


def test_an_embeddings_request_is_bounded_in_tokens_in_all() -> None:
    cfg = config.from_dict({"embeddings": {"max_request_tokens": 1000}})
    assert check_tokens([500, 500], cfg) == 1000
    with pytest.raises(ApiError) as many:
        check_tokens([500, 500, 1], cfg)
    assert (many.value.status, many.value.code) == (400, "max_tokens_per_request")
    assert "embeddings.max_request_tokens" in many.value.message
    assert config.EmbeddingsConfig().max_request_tokens >= 8 * 8192  # a sane default: many large inputs


def test_an_embeddings_answers_allowance_grows_with_its_tokens() -> None:
    assert answer_seconds(0, 0.0) == ANSWER_SECONDS
    assert answer_seconds(50_000, 0.0) == ANSWER_SECONDS + 50_000 / SLOWEST_TOKENS_PER_SECOND
    # Measured at 1000 tokens a second: a quarter of that speed is allowed.
    assert answer_seconds(50_000, 1000.0) == pytest.approx(ANSWER_SECONDS + 200.0)


class TimedRelay:
    def __init__(self) -> None:
        self.timeouts: list[float] = []

    async def post(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> bytes:
        self.timeouts.append(timeout)
        count = len(json.loads(body)["input"])
        data = [{"object": "embedding", "index": i, "embedding": [0.1]} for i in range(count)]
        return json.dumps({"object": "list", "data": data, "usage": {"prompt_tokens": 1}}).encode()


async def test_a_large_embeddings_batch_is_given_the_time_its_tokens_take(journal: Journal) -> None:
    worker = SimpleNamespace(
        state="ready", base_url="http://gpu", pid=1, request_headers={}, note_tokens=lambda count: None
    )
    registry = JobRegistry(journal, EventBus())
    relay = TimedRelay()
    settings = ExecutorSettings(policy.Settings(), 5.0, 5.0, 0.0, model_id="model.gguf")
    slots = SlotPool({"gpu-embed": 1, "cpu-embed": 1}, queue_limit=4)
    workers: Any = lambda role: worker  # noqa: E731
    context = JobsContext(registry, journal, slots, relay, EventBus(), workers, config.Config)
    runner = EmbeddingRunner(context, settings)
    for count in (10, 60_000):
        job = Job(new_id("job"), "r", "embedding", {"input": ["x"]}, False, False, "", None, count, 0, 1e12)
        registry.add(job)
        await runner.run(job)
    assert relay.timeouts[0] == pytest.approx(answer_seconds(10, 0.0))
    assert relay.timeouts[1] > 600  # not a fixed 120 s: 60k tokens on an unmeasured device


# ------------------------------------------------------------------------------------------ N11
def test_ollamas_tool_calls_are_delivered_when_their_line_is_written() -> None:
    written: list[int] = []
    translator = StreamTranslator("chat", "m:latest", Timing(), lambda: written.append(1))
    call = {"index": 0, "id": "c1", "function": {"name": "add", "arguments": '{"a": 1}'}}
    out = translator.feed(sse(chat_chunk("c", 1, "m", {"tool_calls": [call]}, None)))
    assert out == b"" and written == []  # held until the call is whole: nothing the client could act on
    out = translator.feed(sse(chat_chunk("c", 1, "m", {}, "tool_calls")))
    assert b'"tool_calls"' in out and written == [1]
    translator.feed(sse(failsoft_chunk("chat", "c", 1, "m", {"worker": "gpu"})))
    assert written == [1]


def test_ollamas_tool_calls_cut_by_an_error_are_not_delivered() -> None:
    written: list[int] = []
    translator = StreamTranslator("chat", "m:latest", Timing(), lambda: written.append(1))
    call = {"index": 0, "id": "c1", "function": {"name": "add", "arguments": '{"a": 1}'}}
    translator.feed(sse(chat_chunk("c", 1, "m", {"tool_calls": [call]}, None)))
    out = translator.feed(sse({"error": {"message": "the GPU worker crashed"}})) + translator.finish()
    assert b"tool_calls" not in out and written == []


def test_ollamas_tool_calls_are_delivered_once_their_line_reaches_the_client(
    answering_client: TestClient,  # noqa: F811  (the fixture)
    answering_service: AnsweringService,  # noqa: F811  (the fixture)
) -> None:
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    body = {"model": "default", "messages": [{"role": "user", "content": "Add."}], "tools": [tool]}
    response = answering_client.post("/api/chat", json=body, headers={"Idempotency-Key": "k-1"})
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert any(line.get("message", {}).get("tool_calls") for line in lines), lines
    job = answering_service.registry.get(response.headers["x-failsoft-job"])
    assert job is not None and job.holds_tool_calls and job.effects_delivered
