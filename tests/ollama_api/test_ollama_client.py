"""Ollama's API with the real `ollama` client against a real `failsoft serve` (one for the module): models,
chat and generate streamed and not, tools, JSON mode, errors, and a GPU failure mid-stream that fails over
to the CPU exactly once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from tests.support.helpers import arm, base_settings, job_state, wait_replaced, wait_until
from tests.support.service import ServiceHandle, running_service
from tests.support.tools import ADD_TOOL

pytestmark = pytest.mark.integration

# Replays always go to the CPU, however slow a busy test machine makes it (as in test_failover).
SETTINGS = base_settings(failover={"auto_approve_seconds": 3600})
SEA = [{"role": "user", "content": "Write one short sentence about the sea."}]
GREEDY: dict[str, Any] = {"temperature": 0, "seed": 11, "num_predict": 24}
TOOL_OPTIONS: dict[str, Any] = {**GREEDY, "num_predict": 60}  # room for the whole call


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceHandle]:
    root = tmp_path_factory.mktemp("service")
    with running_service(root, enable_faults=True, settings=SETTINGS) as handle:
        yield handle


class Recorder:
    """The response headers of each request the client makes (the ollama client does not show them)."""

    def __init__(self) -> None:
        self.headers: list[httpx.Headers] = []

    def __call__(self, response: httpx.Response) -> None:
        self.headers.append(response.headers)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def client(svc: ServiceHandle, recorder: Recorder) -> ollama.Client:
    return ollama.Client(host=svc.base_url, timeout=180, event_hooks={"response": [recorder]})


@pytest.fixture(scope="module")
def name(svc: ServiceHandle) -> str:
    """The model's name as /api/tags lists it."""
    listed = ollama.Client(host=svc.base_url, timeout=30).list()
    (model,) = listed.models
    assert model.model is not None
    return model.model


def test_root_and_version(svc: ServiceHandle) -> None:
    root = httpx.get(svc.base_url + "/", timeout=10)
    assert (root.status_code, root.text) == (200, "Ollama is running")
    assert httpx.head(svc.base_url + "/", timeout=10).status_code == 200
    version = httpx.get(svc.base_url + "/api/version", timeout=10).json()["version"]
    assert tuple(int(part) for part in version.split(".")) >= (0, 12, 0)


def test_list_show_and_ps_describe_the_model(svc: ServiceHandle, client: ollama.Client, name: str) -> None:
    status = svc.status()
    assert name == Path(status["model"]["id"]).stem + ":latest"
    (listed,) = client.list().models
    model_file = Path(status["model"]["path"])
    assert listed.size == model_file.stat().st_size
    assert listed.digest is not None and len(listed.digest) == 64
    assert listed.details is not None
    assert (listed.details.format, listed.details.family) == ("gguf", "llama")
    assert listed.details.quantization_level == "Q4_1" and listed.details.parameter_size == "134.52M"

    shown = client.show(name)
    assert shown.capabilities == ["completion", "tools"]
    assert shown.modelinfo is not None and shown.modelinfo["llama.context_length"] == 8192
    assert shown.template is not None and "<|im_start|>" in shown.template
    assert shown.details == listed.details
    assert shown.parameters is not None and str(status["caps"]["n_ctx_per_seq"]) in shown.parameters
    # The tag is optional; names match with or without it, letter case aside.
    assert client.show("default").details == listed.details
    assert client.show(name.removesuffix(":latest").lower()).details == listed.details

    (loaded,) = client.ps().models
    plan = status["plan"]
    assert loaded.name == name and loaded.digest == listed.digest
    assert loaded.size_vram == plan["weights_bytes"] + plan["kv_bytes"] + plan["compute_bytes"] > 0
    assert loaded.context_length == status["caps"]["n_ctx_per_seq"]
    assert loaded.expires_at is not None and loaded.expires_at.year > 2100  # kept loaded


def test_log_probabilities_whole_and_streamed(client: ollama.Client, name: str) -> None:
    whole = client.chat(name, messages=SEA, options=GREEDY, stream=False, logprobs=True, top_logprobs=2)
    assert whole.logprobs and "".join(item.token for item in whole.logprobs) == whole.message.content
    assert all(item.logprob <= 0 and len(item.top_logprobs or []) == 2 for item in whole.logprobs)
    parts = list(client.chat(name, messages=SEA, options=GREEDY, stream=True, logprobs=True, top_logprobs=2))
    tokens = [item.token for part in parts for item in part.logprobs or []]
    assert "".join(tokens) == whole.message.content  # the same seed at temperature 0, token by token
    assert client.chat(name, messages=SEA, options=GREEDY, stream=False).logprobs is None  # not asked


def test_chat_whole_and_streamed(client: ollama.Client, recorder: Recorder, name: str) -> None:
    whole = client.chat(name, messages=SEA, options=GREEDY, stream=False)
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.message.role == "assistant" and whole.message.content
    assert whole.model == name
    assert whole.eval_count and 0 < whole.eval_count <= 24
    assert whole.prompt_eval_count and whole.prompt_eval_count > 5
    assert whole.total_duration and whole.eval_duration and whole.total_duration >= whole.eval_duration
    # Reading the prompt took time, and the client is told how much (it divides the prompt's tokens by it).
    assert whole.prompt_eval_duration
    assert whole.prompt_eval_duration + whole.eval_duration <= whole.total_duration
    headers = recorder.headers[-1]
    assert headers["content-type"].startswith("application/json")
    assert headers["x-failsoft-worker"] == "gpu" and headers["x-failsoft-job"].startswith("job")

    parts = list(client.chat(name, messages=SEA, options=GREEDY, stream=True))
    assert recorder.headers[-1]["content-type"] == "application/x-ndjson"
    assert recorder.headers[-1]["x-failsoft-job"].startswith("job")
    *pieces, last = parts
    assert pieces and not any(piece.done for piece in pieces)
    assert last.done and last.done_reason == whole.done_reason and last.message.content == ""
    assert last.eval_count == whole.eval_count and last.prompt_eval_count == whole.prompt_eval_count
    assert last.prompt_eval_duration and last.eval_duration
    # The same seed at temperature 0 on the same worker: the same words.
    assert "".join(piece.message.content or "" for piece in pieces) == whole.message.content


def test_generate_whole_and_streamed(client: ollama.Client, name: str) -> None:
    streamed = client.generate(
        name, prompt="Name three colours.", system="Answer briefly.", options=GREEDY, stream=True
    )
    text = "".join(part.response or "" for part in streamed)
    final = client.generate(
        name, prompt="Name three colours.", system="Answer briefly.", options=GREEDY, stream=False
    )
    assert final.done and final.response == text and text
    assert final.eval_count and final.eval_count <= 24

    raw = client.generate(
        name, prompt="1, 2, 3, 4,", raw=True, options={**GREEDY, "num_predict": 6}, stream=True
    )
    pieces = list(raw)
    assert pieces[-1].done and pieces[-1].eval_count == 6 and pieces[-1].done_reason == "length"
    assert "5" in "".join(piece.response or "" for piece in pieces)


def test_load_and_unload_calls_answer_at_once(client: ollama.Client, name: str) -> None:
    loaded = client.generate(name)
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    unloaded = client.generate(name, keep_alive=0)
    assert unloaded.done and unloaded.done_reason == "unload"
    chat_loaded = client.chat(name, messages=[])
    assert chat_loaded.done and chat_loaded.done_reason == "load"


def test_a_tool_call_in_ollama_shape_and_its_result_back(client: ollama.Client, name: str) -> None:
    """Ollama has no tool_choice: the model calls a tool when it wants to. A first turn in history (in
    Ollama's shape: arguments as an object, the result as a tool message) shows the small model how."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "What is 1 plus 1? Use the add tool."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1, "b": 1}}}],
        },
        {"role": "tool", "content": "2", "tool_name": "add"},
        {"role": "user", "content": "What is 2 plus 3? Use the add tool."},
    ]
    answer = client.chat(name, messages=messages, tools=[ADD_TOOL], options=TOOL_OPTIONS, stream=False)
    calls = answer.message.tool_calls
    assert calls, f"no tool call: {answer.message.content!r}"
    assert calls[0].function.name == "add"
    assert calls[0].function.arguments == {"a": 2, "b": 3}  # an object, as Ollama gives it

    streamed = list(client.chat(name, messages=messages, tools=[ADD_TOOL], options=TOOL_OPTIONS, stream=True))
    streamed_calls = [call for part in streamed for call in part.message.tool_calls or []]
    assert [call.function.name for call in streamed_calls] == ["add"]
    assert streamed_calls[0].function.arguments == calls[0].function.arguments
    assert streamed[-1].done and streamed[-1].done_reason == "stop"


def test_json_mode_gives_json(client: ollama.Client, name: str) -> None:
    answer = client.chat(
        name,
        messages=[{"role": "user", "content": "Describe a cat as a JSON object."}],
        format="json",
        options={"temperature": 0, "num_predict": 40},
        stream=False,
    )
    text = answer.message.content or ""
    assert text.lstrip().startswith("{")
    if answer.done_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_an_unknown_model_is_404_in_ollama_words(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as error:
        client.chat("llama3:8b", messages=SEA, stream=False)
    assert error.value.status_code == 404 and error.value.error == "model 'llama3:8b' not found"
    with pytest.raises(ollama.ResponseError) as streamed:
        list(client.generate("llama3:8b", prompt="hi", stream=True))
    assert streamed.value.status_code == 404


def test_pull_and_delete_say_models_are_set_in_the_config(client: ollama.Client, name: str) -> None:
    with pytest.raises(ollama.ResponseError) as pulled:
        client.pull("llama3.2")
    assert pulled.value.status_code == 501 and "config file" in pulled.value.error
    with pytest.raises(ollama.ResponseError) as deleted:
        client.delete(name)
    assert deleted.value.status_code == 501 and "config file" in deleted.value.error


def test_images_are_refused(client: ollama.Client, name: str) -> None:
    with pytest.raises(ollama.ResponseError) as error:
        client.chat(name, messages=[{"role": "user", "content": "What is this?", "images": [b"\x89PNG"]}])
    assert error.value.status_code == 400 and "images" in error.value.error


def test_a_hostile_origin_is_refused_and_curl_style_bodies_pass(svc: ServiceHandle, name: str) -> None:
    body = {"model": name, "messages": SEA, "stream": False, "options": {"num_predict": 2}}
    refused = httpx.post(
        svc.base_url + "/api/chat", json=body, headers={"Origin": "https://evil.example"}, timeout=30
    )
    assert refused.status_code == 403 and "Origin" in refused.json()["error"]
    refused_host = httpx.get(svc.base_url + "/api/tags", headers={"Host": "evil.example"}, timeout=30)
    assert refused_host.status_code == 403
    # `curl -d` labels its body as a form, and Ollama takes it: so does this service, on Ollama's routes.
    form = httpx.post(
        svc.base_url + "/api/chat",
        content=json.dumps(body),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        timeout=120,
    )
    assert form.status_code == 200 and form.json()["done"] is True


def test_a_gpu_failure_mid_stream_fails_over_once_to_the_cpu(
    svc: ServiceHandle, client: ollama.Client, recorder: Recorder, name: str
) -> None:
    gpu = client.chat(name, messages=SEA, options=GREEDY, stream=False)
    assert recorder.headers[-1]["x-failsoft-worker"] == "gpu"
    gpu_text = gpu.message.content or ""

    armed = arm(svc, "abort", after_tokens=6)
    parts = list(client.chat(name, messages=SEA, options=GREEDY, stream=True))
    job_id = recorder.headers[-1]["x-failsoft-job"]
    text = "".join(part.message.content or "" for part in parts)
    assert parts[-1].done and parts[-1].done_reason in ("stop", "length")
    assert not any(part.done for part in parts[:-1])
    # One uninterrupted stream: what the GPU sent, then the CPU's continuation of it, prompted with the
    # workers' own template: greedy, it goes on with the GPU's words.
    assert text == gpu_text

    stored = job_state(svc, job_id)
    assert stored["worker"] == "cpu" and stored["attempts"] == 2
    assert stored["fallback_reason"] == "crash_abort"
    assert [(a["worker"], a["outcome"]) for a in stored["attempt_log"]] == [
        ("gpu", "failed"),
        ("cpu", "completed"),
    ]
    assert wait_replaced(svc, armed["pid"])["workers"]["gpu"]["restarts"] >= 1


def test_embed_and_the_older_embeddings_route(
    svc: ServiceHandle, client: ollama.Client, name: str, recorder: Recorder
) -> None:
    texts = ["The sea is blue.", "A violin has four strings.", "The sea is blue."]
    answer = client.embed(model=name, input=texts)
    vectors = [list(vector) for vector in answer.embeddings]

    def distance(a: list[float], b: list[float]) -> float:
        return max(abs(x - y) for x, y in zip(a, b, strict=True))

    assert len(vectors) == 3 and len(vectors[0]) >= 64
    assert distance(vectors[0], vectors[2]) < 1e-4  # the same text (batched apart: not bit for bit)
    assert distance(vectors[0], vectors[1]) > 1e-2 and (answer.prompt_eval_count or 0) > 0
    assert recorder.headers[-1]["x-failsoft-worker"] == "gpu"
    job = job_state(svc, recorder.headers[-1]["x-failsoft-job"])
    assert (job["kind"], job["state"]) == ("embedding", "completed")
    legacy = client.embeddings(model=name, prompt=texts[0])
    assert len(legacy.embedding) == len(vectors[0])
    assert distance(list(legacy.embedding), vectors[0]) < 1e-4


def test_embed_fails_over_when_the_gpu_embeddings_worker_dies(
    svc: ServiceHandle, client: ollama.Client, name: str, recorder: Recorder
) -> None:
    client.embed(model=name, input="warm")  # the GPU embeddings worker is up
    armed = arm(svc, "abort", after_tokens=0, role="gpu-embed")  # fires as the request is sent
    answer = client.embed(model=name, input=["one", "two"])
    assert len(answer.embeddings) == 2
    headers = recorder.headers[-1]
    assert (headers["x-failsoft-worker"], headers["x-failsoft-attempts"]) == ("cpu", "2")
    job = job_state(svc, headers["x-failsoft-job"])
    assert job["fallback_reason"] == "crash_abort"
    assert [a["outcome"] for a in job["attempt_log"]] == ["failed", "completed"]
    wait_until(
        lambda: svc.status()["embedding_workers"]["gpu-embed"]["pid"] not in (None, armed["pid"]),
        what="the GPU embeddings worker restarted",
    )
