"""Ollama's API in OpenAI's terms and back, as pure functions: an Ollama request becomes the OpenAI body the
router already serves; the router's answer (a server-sent-event stream, one JSON object or an error)
becomes Ollama's (NDJSON lines, one JSON object, `{"error": "..."}`).

Durations are nanoseconds, as in Ollama. Field names follow Ollama's api/types.go.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from tray_app.server.rewrite import event_object, events

Kind = Literal["chat", "completion"]

# Open WebUI takes the lowest version over its Ollama backends and turns features off below the versions
# that brought them (structured outputs in `format` came with 0.5, `think` with 0.9, tool calls while
# streaming with 0.8): a recent version keeps them on. Our shapes follow Ollama 0.12's API.
OLLAMA_VERSION = "0.12.0"
LATEST = ":latest"
MANAGED_IN_CONFIG = (
    "models are managed in Failsoft's config file ([model] path in config.toml, or the tray's settings), "
    "not through the Ollama API; this service serves {names}"
)
NO_IMAGES = "this model reads text only: images are not supported"
# Ollama option -> the name llama-server takes (OpenAI's own fields and llama.cpp's sampling extensions).
SAMPLING_OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "seed": "seed",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "mirostat": "mirostat",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
}
_INT_OPTIONS = {"top_k", "seed", "repeat_last_n", "mirostat", "num_predict", "num_ctx"}
# Set by the service's plan for every request (the worker's context, layers, threads, batch): accepted from
# a client and ignored, as a loaded Ollama model ignores them too until it is reloaded.
PLAN_OPTIONS = frozenset(
    {
        "num_ctx",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "low_vram",
        "num_thread",
        "numa",
        "use_mmap",
        "use_mlock",
        "vocab_only",
        "num_keep",
        "f16_kv",
        "logits_all",
        "embedding_only",
        "penalize_newline",
        "tfs_z",
    }
)
_ZERO_DURATION = re.compile(r"^[+-]?0*(\.0*)?(ns|us|µs|ms|s|m|h)?$")


class OllamaError(Exception):
    """An answer in Ollama's error shape: `{"error": message}` with an HTTP status."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}

    def body(self) -> dict[str, str]:
        return {"error": self.message}

    def body_bytes(self) -> bytes:
        return json.dumps(self.body()).encode()


def now_iso() -> str:
    """`created_at` as Ollama writes it: RFC 3339 in UTC with nanoseconds."""
    now = time.time_ns()
    stamp = datetime.fromtimestamp(now // 1_000_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{now % 1_000_000_000:09d}Z"


def iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")


# ---------------------------------------------------------------------------------------------- names
def model_name(model_id: str) -> str:
    """The name the service's model goes by in Ollama's lists: the file's name without `.gguf`, `:latest`."""
    base = model_id[: -len(".gguf")] if model_id.lower().endswith(".gguf") else model_id
    return base + LATEST


def matches_model(name: str, known: set[str]) -> bool:
    """Whether an Ollama model name means the service's model: one of its names (the file name, its stem,
    the path, "default"), with or without a `:latest` tag, letter case aside (Ollama's names are too)."""
    wanted = name.strip().lower()
    if wanted.endswith(LATEST):
        wanted = wanted[: -len(LATEST)]
    return any(wanted == candidate.lower() for candidate in known)


def public_names(known: set[str]) -> str:
    return ", ".join(sorted(name for name in known if "/" not in name and "\\" not in name))


def not_found(name: str) -> OllamaError:
    return OllamaError(404, f"model '{name}' not found")


def require_model(body: dict[str, Any], known: set[str]) -> str:
    """The model the request names (`model`, or the older `name`); 400 when absent, 404 when unknown."""
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise OllamaError(400, "model is required")
    if not matches_model(name, known):
        raise not_found(name)
    return name


def managed_in_config(known: set[str]) -> OllamaError:
    """pull, push, create, copy, delete: 501 Not Implemented, not 400: the request is well formed, this
    server just does not manage models over HTTP, and no change to the request would make it."""
    return OllamaError(501, MANAGED_IN_CONFIG.format(names=public_names(known)))


# -------------------------------------------------------------------------------------- requests
def parse_body(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise OllamaError(400, "missing request body")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise OllamaError(400, f"invalid JSON in the request body: {error}") from None
    if not isinstance(body, dict):
        raise OllamaError(400, "the request body must be a JSON object")
    return body


def is_zero_keep_alive(value: Any) -> bool:
    """`keep_alive` 0 in any of Ollama's spellings (0, 0.0, "0", "0s", "0m"): the client asks to unload."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, int | float):
        return value == 0
    return isinstance(value, str) and bool(_ZERO_DURATION.match(value.strip()))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def map_options(options: Any) -> dict[str, Any]:
    """Ollama's `options` as OpenAI/llama-server fields.

    num_predict -> max_tokens (-1, -2 or 0: no limit of its own; the router then gives what fits the
    context); stop -> stop; the sampling options by their llama-server names. num_ctx and the other
    load-time options (PLAN_OPTIONS) are accepted and ignored: one context size is planned for every request
    (see README, "Ollama API"). Unknown options are ignored, as Ollama ignores them (with a warning)."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise OllamaError(400, "'options' must be an object")
    mapped: dict[str, Any] = {}
    for name, value in options.items():
        if value is None:
            continue
        if name in _INT_OPTIONS and not _is_int(value):
            raise OllamaError(400, f"option '{name}' must be an integer")
        if name == "num_predict":
            if value > 0:
                mapped["max_tokens"] = value
        elif name == "stop":
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(stop, str) for stop in value):
                raise OllamaError(400, "option 'stop' must be a list of strings")
            if value:
                mapped["stop"] = value
        elif name in SAMPLING_OPTIONS:
            if not _is_number(value):
                raise OllamaError(400, f"option '{name}' must be a number")
            mapped[SAMPLING_OPTIONS[name]] = value
    return mapped


def map_format(value: Any) -> dict[str, Any] | None:
    """`format`: "json" -> json_object; a JSON schema object -> json_schema; "" or absent -> none."""
    if value is None or value == "":
        return None
    if value == "json":
        return {"type": "json_object"}
    if isinstance(value, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": value, "strict": True}}
    raise OllamaError(400, f'invalid format {value!r}: use "json" or a JSON schema object')


THINK_LEVELS = ("low", "medium", "high")


def capabilities(thinks: bool) -> list[str]:
    """What /api/show says a model can do (Ollama's names)."""
    return ["completion", "tools", *(["thinking"] if thinks else [])]


def _think(body: dict[str, Any], model: str, thinks: bool) -> dict[str, Any]:
    """Ollama's `think` as the OpenAI fields llama-server takes: off is `reasoning_effort: "none"`, a level
    (gpt-oss) is that effort; on (or unset) is what a thinking model does anyway."""
    think = body.get("think")
    if think is None or think is True:
        if think is True and not thinks:
            # Ollama's own answer for a model without the thinking capability.
            raise OllamaError(400, f'"{model}" does not support thinking')
        return {}
    if think is False or think in ("", "false", "none"):
        return {"reasoning_effort": "none"} if thinks else {}
    if think in THINK_LEVELS:
        if not thinks:
            raise OllamaError(400, f'"{model}" does not support thinking')
        return {"reasoning_effort": think}
    levels = ", ".join(THINK_LEVELS)
    raise OllamaError(400, f"invalid think value {think!r}: use true, false, or one of {levels}")


def _arguments_text(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments if arguments is not None else {})


def _openai_message(message: Any, index: int, pending: list[str]) -> dict[str, Any]:
    """One Ollama message as OpenAI's; `pending` holds the ids of tool calls not yet answered, so a tool
    message without `tool_call_id` (Ollama's have `tool_name` at most) answers the oldest one."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise OllamaError(400, f"'{where}' must be an object")
    role = message.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        raise OllamaError(400, f"'{where}.role' must be system, user, assistant or tool")
    if message.get("images"):
        raise OllamaError(400, NO_IMAGES)
    content = message.get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise OllamaError(400, f"'{where}.content' must be a string")
    out: dict[str, Any] = {"role": role, "content": content}
    calls = message.get("tool_calls")
    if role == "assistant" and calls:
        if not isinstance(calls, list):
            raise OllamaError(400, f"'{where}.tool_calls' must be an array")
        out["tool_calls"] = []
        pending.clear()
        for number, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise OllamaError(400, f"'{where}.tool_calls[{number}]' must have function.name")
            call_id = call.get("id") or f"call_{index}_{number}"
            pending.append(call_id)
            out["tool_calls"].append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": function["name"],
                        "arguments": _arguments_text(function.get("arguments")),
                    },
                }
            )
    if role == "tool":
        call_id = message.get("tool_call_id") or (pending.pop(0) if pending else None)
        if call_id:
            out["tool_call_id"] = call_id
        if isinstance(message.get("tool_name"), str):
            out["name"] = message["tool_name"]
    return out


def _common(body: dict[str, Any], model_id: str, stream: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"model": model_id, "stream": stream}
    out.update(map_options(body.get("options")))
    response_format = map_format(body.get("format"))
    if response_format is not None:
        out["response_format"] = response_format
    if body.get("logprobs"):
        out["logprobs"] = True  # checked by the router, as an OpenAI request's
        if body.get("top_logprobs") is not None:
            out["top_logprobs"] = body["top_logprobs"]
    if stream:
        out["stream_options"] = {"include_usage": True}  # the counts for the last line
    return out


def wants_stream(body: dict[str, Any]) -> bool:
    """Ollama streams unless told `"stream": false`."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise OllamaError(400, "'stream' must be true or false")
    return stream is not False


def chat_request(body: dict[str, Any], model_id: str, thinks: bool = False) -> dict[str, Any]:
    """An Ollama /api/chat body (with messages) as an OpenAI chat completion body (`thinks`: the model's
    template thinks)."""
    stream = wants_stream(body)
    think = _think(body, str(body.get("model")), thinks)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise OllamaError(400, "'messages' must be an array")
    pending: list[str] = []
    out = _common(body, model_id, stream)
    out["messages"] = [_openai_message(message, index, pending) for index, message in enumerate(messages)]
    out.update(think)
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
            raise OllamaError(400, "'tools' must be an array of objects")
        # Ollama's tool definitions are OpenAI's (type "function", function{name, description, parameters}).
        out["tools"] = [{"type": tool.get("type") or "function", **tool} for tool in tools]
    return out


def generate_request(
    body: dict[str, Any], model_id: str, thinks: bool = False
) -> tuple[Kind, dict[str, Any]]:
    """An Ollama /api/generate body (with a prompt) as an OpenAI body: a chat of `system` and `prompt`, or
    with `raw` a plain completion of the prompt as it is."""
    stream = wants_stream(body)
    think = _think(body, str(body.get("model")), thinks)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise OllamaError(400, "'prompt' must be a string")
    if body.get("images"):
        raise OllamaError(400, NO_IMAGES)
    if body.get("context"):
        raise OllamaError(
            400, "'context' (deprecated in Ollama) is not supported: send the conversation to /api/chat"
        )
    if body.get("suffix"):
        raise OllamaError(400, "'suffix' (fill in the middle) is not supported by this service")
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        raise OllamaError(400, "'system' must be a string")
    if body.get("template"):
        # Ollama's templates are Go templates; the workers apply the model's own chat template.
        raise OllamaError(
            400, "'template' is not supported: the model's own chat template applies (or use raw)"
        )
    out = _common(body, model_id, stream)
    if body.get("raw"):
        if system:
            raise OllamaError(400, "raw mode does not support template, system, or context")
        if body.get("logprobs"):
            # A raw prompt is a plain completion, and llama-server gives log probabilities for chats only.
            raise OllamaError(400, "log probabilities are not available in raw mode: leave raw off")
        out["prompt"] = prompt
        return "completion", out
    messages = [{"role": "system", "content": system}] if system else []
    out["messages"] = [*messages, {"role": "user", "content": prompt}]
    out.update(think)
    return "chat", out


def is_load_request(path_kind: Literal["chat", "generate"], body: dict[str, Any]) -> bool:
    """No messages (chat) or no prompt (generate): Ollama's "load the model" call (unload: keep_alive 0)."""
    if path_kind == "chat":
        return not body.get("messages")
    return not body.get("prompt") and not body.get("images")


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


# ------------------------------------------------------------------------------------- responses
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


def _final(
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
    answer = _answer_text(path_kind, model, text, thinking)
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


def _answer_text(
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
    answer = _final(
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


def openai_error(status: int, body: bytes) -> OllamaError:
    """An OpenAI error answer (`{"error": {"message": ...}}`) as Ollama's, with the same status."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        data = None
    message = None
    if isinstance(data, dict):
        error = data.get("error")
        message = error.get("message") if isinstance(error, dict) else error
    if not isinstance(message, str) or not message:
        message = body.decode("utf-8", "replace").strip() or f"HTTP {status}"
    return OllamaError(status, message)


class StreamTranslator:
    """The router's server-sent events for one request, as Ollama's NDJSON lines.

    Feed it the bytes as they come (`feed`), then `finish`; each returns the lines to send. Content goes
    out as it comes; tool calls (whose arguments stream in pieces) go out whole in one line when the call is
    complete; the last line is `done: true` with the counts and durations. An error event becomes Ollama's
    `{"error": "..."}` line and ends the stream."""

    def __init__(self, path_kind: Literal["chat", "generate"], model: str, timing: Timing) -> None:
        self.path_kind = path_kind
        self.model = model
        self.timing = timing
        self.buffer = b""
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.calls_sent = False
        self.finish_reason: str | None = None
        self.tokens = 0
        self.ended = False

    def feed(self, data: bytes) -> bytes:
        found, self.buffer = events(self.buffer + data)
        out: list[bytes] = []
        for event in found:
            if not self.ended:
                out.extend(self._event(event))
        return b"".join(out)

    def finish(self) -> bytes:
        """Whatever is left when the router's stream ended; a stream cut short without its last event still
        ends with a line (an error: the client must not take a cut answer for a whole one)."""
        out = self.feed(b"\n\n") if self.buffer.strip() else b""
        if not self.ended:
            self.ended = True
            out += _line({"error": "the answer ended before it was complete"})
        return out

    def _event(self, event: bytes) -> list[bytes]:
        obj = event_object(event)
        if obj is None:
            return []
        if "error" in obj:
            self.ended = True
            error = obj["error"]
            message = error.get("message") if isinstance(error, dict) else error
            return [_line({"error": str(message or "the request failed")})]
        out: list[bytes] = []
        for choice in obj.get("choices") or []:
            out.extend(self._choice(choice))
        self.timing.note_answer(obj)
        if "failsoft" in obj:  # the router's last chunk: who served it, the counts
            self.ended = True
            self.timing.ended = time.monotonic_ns()
            out.extend(self._calls_line())
            final = _final(
                self.path_kind,
                self.model,
                "",
                [],
                self.finish_reason,
                obj.get("usage"),
                self.tokens,
                self.timing,
                obj.get("failsoft"),
            )
            out.append(_line(final))
        return out

    def _choice(self, choice: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        delta = choice.get("delta")
        thinking = (delta or {}).get("reasoning_content")
        if thinking:
            self.timing.token()
            self.tokens += 1
            out.append(_line(self._partial("", thinking)))
        text = choice.get("text") if delta is None else delta.get("content")
        if text:
            self.timing.token()
            self.tokens += 1
            self.text.append(text)
            line = self._partial(text)
            logprobs = ollama_logprobs(choice)
            if logprobs:
                line["logprobs"] = logprobs  # for this line's token, as Ollama streams them
            out.append(_line(line))
        for call in (delta or {}).get("tool_calls") or []:
            self.timing.token()
            index = int(call.get("index", 0))
            entry = self.calls.setdefault(index, {"id": "", "function": {"name": "", "arguments": ""}})
            if call.get("id"):
                entry["id"] = call["id"]
            function = call.get("function") or {}
            entry["function"]["name"] += function.get("name") or ""
            entry["function"]["arguments"] += function.get("arguments") or ""
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
            out.extend(self._calls_line())
        return out

    def _calls_line(self) -> list[bytes]:
        if not self.calls or self.calls_sent:
            return []
        self.calls_sent = True
        calls = [self.calls[index] for index in sorted(self.calls)]
        line = self._partial("")
        line["message"]["tool_calls"] = ollama_tool_calls(calls)
        return [_line(line)]

    def _partial(self, text: str, thinking: str = "") -> dict[str, Any]:
        line = _answer_text(self.path_kind, self.model, text, thinking)
        line["done"] = False
        return line


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


# ------------------------------------------------------------------------------------ embeddings
def embed_request(body: dict[str, Any], model_id: str) -> dict[str, Any]:
    """/api/embed: `input` (a string or a list of strings) -> the OpenAI /v1/embeddings body."""
    value = body.get("input")
    if isinstance(value, str):
        inputs: list[str] = [value]
    elif isinstance(value, list) and all(isinstance(item, str) for item in value):
        inputs = list(value)
    else:
        raise OllamaError(400, "'input' must be a string or an array of strings")
    return {"model": model_id, "input": inputs}


def embeddings_request(body: dict[str, Any], model_id: str) -> dict[str, Any]:
    """/api/embeddings (the older route): `prompt`, one string -> the OpenAI /v1/embeddings body."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise OllamaError(400, "'prompt' must be a string")
    return {"model": model_id, "input": [prompt]}


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
