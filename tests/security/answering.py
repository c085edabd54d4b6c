"""A stand-in service on which every generation route runs to an answer (fast tier): the security tests'
stand-in (tests/security/conftest.py) with a real model file and its tokenizer (templates, counts and grammar
checks as the service makes them), an executor that answers every job at once, whole or streamed ("Hi", or a
tool call when the request offers tools), and the real embeddings runner over a stand-in relay."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from starlette.testclient import TestClient

from tests.security.conftest import StandInExecutor, StandInService, client_for, make_config
from tests.support.in_process_prompts import CounterPrompts
from tray_app.contract.roles import EMBED_ROLES
from tray_app.contract.vocabulary import Reason
from tray_app.jobs import policy
from tray_app.jobs.admission import SlotPool
from tray_app.jobs.assemble import chat_chunk, completion_chunk
from tray_app.jobs.context import JobsContext
from tray_app.jobs.embeddings import EmbeddingRunner
from tray_app.jobs.journal import Journal
from tray_app.jobs.outcomes import Ended, Finished, JobError, Outcome, Piece
from tray_app.jobs.registry import Job, JobRegistry
from tray_app.jobs.worker_port import ExecutorSettings
from tray_app.library.catalog import Catalog, ModelEntry
from tray_app.server.routes import create_app
from tray_app.tokenizer.counter import TokenCounter

MAX_BODY = 64 * 1024
TOOL_CALL = {
    "index": 0,
    "id": "call_1",
    "type": "function",
    "function": {"name": "add", "arguments": '{"a": 1}'},
}


class AnsweringExecutor(StandInExecutor):
    """Answers each job at once as a worker would, "Hi" or (a chat offering tools) a tool call, and gives
    back the slot it was handed."""

    def __init__(self, registry: JobRegistry, spawned: list[str], slots: SlotPool) -> None:
        super().__init__(registry, spawned)
        self.slots = slots
        self.settings = SimpleNamespace(policy=policy.Settings(), stall_seconds=15.0)

    async def drain(self, job: Job, held_slot: float | None = None) -> None:
        async for _ in self.run(job, False, held_slot):
            pass

    async def run(self, job: Job, deliver: bool, held_slot: float | None = None) -> AsyncIterator[Outcome]:
        try:
            if not self.registry.start_attempt(job, job.route):
                return
            created, model = int(time.time()), job.model
            if job.kind == "chat" and job.body.get("tools"):
                delta = {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}
                yield Piece(chat_chunk("c1", created, model, delta, None), None, True)
                yield Piece(chat_chunk("c1", created, model, {}, "tool_calls"))
                call = {key: value for key, value in TOOL_CALL.items() if key != "index"}
                message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
                choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": "tool_calls"}
                kind = "chat.completion"
            elif job.kind == "chat":
                delta = {"role": "assistant", "content": "Hi"}
                yield Piece(chat_chunk("c1", created, model, delta, None), None, True)
                message = {"role": "assistant", "content": "Hi"}
                choice = {"index": 0, "message": message, "finish_reason": "stop"}
                kind = "chat.completion"
            else:
                yield Piece(completion_chunk("c1", created, model, "Hi", None), None, True)
                choice = {"index": 0, "text": "Hi", "finish_reason": "stop"}
                kind = "text_completion"
            usage = {
                "prompt_tokens": job.prompt_tokens,
                "completion_tokens": 1,
                "total_tokens": job.prompt_tokens + 1,
            }
            result = {"id": "c1", "object": kind, "created": created, "model": model, "choices": [choice]}
            result.update(usage=usage, failsoft=job.failsoft())
            if self.registry.complete(job, result):
                yield Finished(result, "c1", created, model)
        finally:
            role = job.worker_role(job.route)
            if held_slot is not None and role is not None:
                self.slots.release(role, held_slot)

    async def wait_for_final(self, job: Job, deliver: bool, reason: str) -> AsyncIterator[Outcome]:
        error = JobError(503, "rejected", "the CPU run was rejected", type="service_unavailable")
        self.registry.fail(job, "rejected", error.record(), Reason.REJECTED)
        yield Ended(error)


class StandInEmbeddingsWorker:
    state = "ready"
    base_url = "http://127.0.0.1:9"
    pid = 1
    last_failure = None
    request_headers: ClassVar[dict[str, str]] = {}

    async def ensure_ready(self, timeout: float) -> bool:
        return True

    def mark_unhealthy(self, reason: str, kind: str, *, pid: int | None = None) -> None:
        raise AssertionError(f"an embeddings worker was marked unhealthy: {kind}: {reason}")

    async def failure_of(self, pid: int, timeout: float) -> dict[str, Any] | None:
        return None

    def note_tokens(self, count: int) -> None:
        return None


class StandInRelay:
    """An embeddings worker's answer: a vector per input."""

    async def post(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> bytes:
        inputs = json.loads(body)["input"]
        data = [{"object": "embedding", "index": i, "embedding": [0.5, -0.5]} for i in range(len(inputs))]
        usage = {"prompt_tokens": len(inputs), "total_tokens": len(inputs)}
        return json.dumps({"object": "list", "model": "m", "data": data, "usage": usage}).encode()


class Counter:
    def labels(self, **labels: str) -> Counter:
        return self

    def inc(self) -> None:
        return None


class AnsweringService(StandInService):
    """The stand-in service with what every generation route uses: a real model file (its template says
    whether it thinks) and its tokenizer, an executor that answers, embeddings, metrics."""

    model_file: Path = Path()
    counter: TokenCounter

    def __post_init__(self) -> None:
        super().__post_init__()
        aliases = (self.model_file.stem, "default")  # as the service names its main model (less the path)
        self.catalog = Catalog([ModelEntry(self.model_id, self.model_file, aliases, main=True)])
        self.slots = SlotPool({"gpu": 4, "cpu": 4, **dict.fromkeys(EMBED_ROLES.values(), 2)}, 8)
        self.executor = AnsweringExecutor(self.registry, self.spawned, self.slots)
        self.jobs = self.facade()
        worker = StandInEmbeddingsWorker()
        relay: Any = StandInRelay()
        embeddings = JobsContext(
            self.registry, self.journal, self.slots, relay, self.bus, lambda role: worker, lambda: self.cfg
        )
        settings = ExecutorSettings(policy.Settings(), 15.0, 5.0, 0.0, model_id=self.model_id)
        self.jobs.embeddings = EmbeddingRunner(embeddings, settings)
        self.metrics = SimpleNamespace(requests=Counter())
        self.started_at = time.time()

    # Counted and checked as the service does: the model's own tokenizer, chat template and grammar parser
    # (here in this process; the service asks its tokenizer helper).
    def prompts(self, model: str = "") -> Any:
        return CounterPrompts(self.counter)

    def file_prompts(self, model_file: str) -> Any:
        return CounterPrompts(self.counter)


@pytest.fixture(scope="module")
def tokens(model_path: Path) -> TokenCounter:
    return TokenCounter(model_path)  # loaded once for every example


@pytest.fixture
def answering_service(journal: Journal, model_path: Path, tokens: TokenCounter) -> AnsweringService:
    AnsweringService.model_file = model_path
    names = {"default", model_path.name, model_path.stem}
    config = make_config(max_body=f"{MAX_BODY}B")
    service = AnsweringService(config, journal, model_names=names, model_id=model_path.name)
    service.counter = tokens
    return service


@pytest.fixture
def answering_client(answering_service: AnsweringService) -> Iterator[TestClient]:
    app = create_app(answering_service, manage_lifecycle=False)  # type: ignore[arg-type]
    with client_for(app) as client:
        yield client
