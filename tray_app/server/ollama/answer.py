"""The router's answers in Ollama's shape: one JSON answer from an OpenAI one, the pieces a streamed line is
made of (`answer_start`, `final_answer`, `ndjson_line`), the load answer and the embeddings answers.
Durations are nanoseconds, as in Ollama."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from tray_app.server.ollama.request import is_zero_keep_alive


def now_iso() -> str:
    """`created_at` as Ollama writes it: RFC 3339 in UTC with nanoseconds."""
    now = time.time_ns()
    stamp = datetime.fromtimestamp(now // 1_000_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{now % 1_000_000_000:09d}Z"


def iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")


DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop", "content_filter": "stop"}


def done_reason(finish_reason: str | None) -> str:
    return DONE_REASONS.get(finish_reason or "stop", "stop")


def ollama_tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI tool calls (arguments: a JSON string) as Ollama's (arguments: an object)."""
    out = []
    for index, call in enumerate(calls):
        function = call.get("function") or {}
        text = function.get("arguments") or "{}"
        try:
            arguments = json.loads(text) if isinstance(text, str) else text
        except ValueError:
            arguments = {}  # the model wrote something that is not JSON: no arguments rather than a crash
        if not isinstance(arguments, dict):
            arguments = {"value": arguments}
        entry: dict[str, Any] = {
            "function": {"index": index, "name": function.get("name") or "", "arguments": arguments}
        }
        if call.get("id"):
            entry["id"] = call["id"]
        out.append(entry)
    return out


@dataclass
class Timing:
    """When the request came in, when its first token went out and when it ended (monotonic ns), and the
    worker's own timings of the attempt that answered (llama-server's `timings`, in its last chunk)."""

    started: int = field(default_factory=time.monotonic_ns)
    first_token: int | None = None
    ended: int | None = None
    worker: dict[str, Any] | None = None
    attempts: int = 0

    def token(self) -> None:
        if self.first_token is None:
            self.first_token = time.monotonic_ns()

    def note_answer(self, obj: dict[str, Any]) -> None:
        """Take the worker's timings and the attempt count from a chunk or an answer that has them."""
        if isinstance(obj.get("timings"), dict):
            self.worker = obj["timings"]
        failsoft = obj.get("failsoft")
        if isinstance(failsoft, dict):
            self.attempts = int(failsoft.get("attempts") or 0)

    def durations(self) -> dict[str, int]:
        """Ollama's durations. Reading the prompt and generating are the worker's own figures when one
        attempt made the whole answer; else the client's view: up to the first token, and after it. Without
        a first token seen (a whole answer), the answering attempt's prompt time, and the rest. Never a
        zero time for work that was done: clients divide by these."""
        ended = self.ended or time.monotonic_ns()
        total = ended - self.started
        prompt_ms, predicted_ms = _worker_ms(self.worker)
        if prompt_ms is not None and predicted_ms is not None and self.attempts == 1:
            prompt, evaluation = round(prompt_ms * 1e6), round(predicted_ms * 1e6)
        elif self.first_token is not None:
            prompt, evaluation = self.first_token - self.started, ended - self.first_token
        elif prompt_ms is not None:
            prompt = min(round(prompt_ms * 1e6), total)
            evaluation = total - prompt
        else:
            prompt, evaluation = 0, total
        # The model is loaded before the service takes requests: no request ever waits for a load.
        return {
            "total_duration": total,
            "load_duration": 0,
            "prompt_eval_duration": prompt,
            "eval_duration": evaluation,
        }


def _worker_ms(timings: dict[str, Any] | None) -> tuple[float | None, float | None]:
    def number(name: str) -> float | None:
        value = (timings or {}).get(name)
        return float(value) if isinstance(value, int | float) and value >= 0 else None

    return number("prompt_ms"), number("predicted_ms")


def ollama_logprobs(choice: dict[str, Any]) -> list[dict[str, Any]]:
    """An OpenAI choice's `logprobs.content` in Ollama's shape: token, logprob and top_logprobs per token
    (OpenAI's byte lists are left out, as Ollama has none)."""
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        return []
    return [
        {
            "token": item.get("token", ""),
            "logprob": item.get("logprob", 0.0),
            "top_logprobs": [
                {"token": top.get("token", ""), "logprob": top.get("logprob", 0.0)}
                for top in item.get("top_logprobs") or []
            ],
        }
        for item in content
        if isinstance(item, dict)
    ]


def _counts(usage: dict[str, Any] | None, tokens: int) -> dict[str, int]:
    usage = usage or {}
    return {
        "prompt_eval_count": int(usage.get("prompt_tokens") or 0),
        "eval_count": int(usage.get("completion_tokens") or tokens),
    }


def final_answer(
    path_kind: Literal["chat", "generate"],
    model: str,
    text: str,
    calls: list[dict[str, Any]],
    finish_reason: str | None,
    usage: dict[str, Any] | None,
    tokens: int,
    timing: Timing,
    failsoft: dict[str, Any] | None,
    thinking: str = "",
) -> dict[str, Any]:
    answer = answer_start(path_kind, model, text, thinking)
    if path_kind == "chat" and calls:
        answer["message"]["tool_calls"] = ollama_tool_calls(calls)
    durations = timing.durations()
    counts = _counts(usage, tokens)
    answer.update(
        done=True,
        done_reason=done_reason(finish_reason),
        total_duration=durations["total_duration"],
        load_duration=durations["load_duration"],
        prompt_eval_count=counts["prompt_eval_count"],
        prompt_eval_duration=durations["prompt_eval_duration"],
        eval_count=counts["eval_count"],
        eval_duration=durations["eval_duration"],
    )
    if failsoft:
        answer["failsoft"] = failsoft  # who served it, as in the OpenAI answers (Ollama clients ignore it)
    return answer


def answer_start(
    path_kind: Literal["chat", "generate"], model: str, text: str, thinking: str
) -> dict[str, Any]:
    """The start of an answer line: the text, and a thinking model's reasoning as Ollama's `thinking`."""
    answer: dict[str, Any] = {"model": model, "created_at": now_iso()}
    if path_kind == "chat":
        answer["message"] = {"role": "assistant", "content": text}
        if thinking:
            answer["message"]["thinking"] = thinking
    else:
        answer["response"] = text
        if thinking:
            answer["thinking"] = thinking
    return answer


def openai_result(
    path_kind: Literal["chat", "generate"], model: str, result: dict[str, Any], timing: Timing
) -> dict[str, Any]:
    """A whole OpenAI answer (chat.completion or text_completion) as Ollama's single JSON answer, timed by
    the worker's own figures where it gives them (see Timing.durations)."""
    choice = (result.get("choices") or [{}])[0]
    thinking = ""
    if "message" in choice:
        message = choice.get("message") or {}
        text, calls = message.get("content") or "", list(message.get("tool_calls") or [])
        thinking = message.get("reasoning_content") or ""
    else:
        text, calls = choice.get("text") or "", []
    timing.note_answer(result)
    answer = final_answer(
        path_kind,
        model,
        text,
        calls,
        choice.get("finish_reason"),
        result.get("usage"),
        0,
        timing,
        result.get("failsoft"),
        thinking,
    )
    logprobs = ollama_logprobs(choice)
    if logprobs:
        answer["logprobs"] = logprobs
    return answer


def load_answer(path_kind: Literal["chat", "generate"], model: str, body: dict[str, Any]) -> dict[str, Any]:
    """What Ollama answers a load (or unload) call. The model here stays loaded either way: both workers
    keep it for as long as the service runs."""
    reason = "unload" if is_zero_keep_alive(body.get("keep_alive")) else "load"
    answer: dict[str, Any] = {"model": model, "created_at": now_iso()}
    if path_kind == "chat":
        answer["message"] = {"role": "assistant", "content": ""}
    else:
        answer["response"] = ""
    answer.update(done=True, done_reason=reason)
    return answer


def ndjson_line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


def _vectors(answer: dict[str, Any]) -> list[list[float]]:
    data = sorted(answer.get("data") or [], key=lambda item: int(item.get("index", 0)))
    return [list(item.get("embedding") or []) for item in data]


def embed_answer(model: str, answer: dict[str, Any], timing: Timing) -> dict[str, Any]:
    """An OpenAI embeddings answer as /api/embed's: the vectors in input order, the prompt's token count."""
    timing.ended = timing.ended or time.monotonic_ns()
    usage = answer.get("usage") or {}
    return {
        "model": model,
        "embeddings": _vectors(answer),
        "total_duration": timing.ended - timing.started,
        "load_duration": 0,
        "prompt_eval_count": int(usage.get("prompt_tokens") or 0),
    }


def embeddings_answer(answer: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI embeddings answer as the older /api/embeddings': one vector."""
    vectors = _vectors(answer)
    return {"embedding": vectors[0] if vectors else []}
