"""Ollama's requests as the OpenAI bodies the router already serves: /api/chat, /api/generate (a chat, or with
`raw` a plain completion), the load and unload calls, and the embeddings routes. Field names follow
Ollama's api/types.go."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from tray_app.server.errors import ApiError
from tray_app.server.input_bounds import check_messages, check_schema, check_tools
from tray_app.server.ollama.errors import OllamaError
from tray_app.server.ollama.options import map_format, map_options, think_fields
from tray_app.server.requests import body_problem, load_json

Kind = Literal["chat", "completion"]
NO_IMAGES = "this model reads text only: images are not supported"
_ZERO_DURATION = re.compile(r"^[+-]?0*(\.0*)?(ns|us|µs|ms|s|m|h)?$")


def parse_body(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise OllamaError(400, "missing request body")
    try:
        body = load_json(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise OllamaError(400, f"invalid JSON in the request body: {error}") from None
    if not isinstance(body, dict):
        raise OllamaError(400, "the request body must be a JSON object")
    problem = body_problem(raw, body)
    if problem is not None:
        raise OllamaError(400, problem[0])
    return body


def wants_stream(body: dict[str, Any]) -> bool:
    """Ollama streams unless told `"stream": false`."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise OllamaError(400, "'stream' must be true or false")
    return stream is not False


def is_zero_keep_alive(value: Any) -> bool:
    """`keep_alive` 0 in any of Ollama's spellings (0, 0.0, "0", "0s", "0m"): the client asks to unload."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, int | float):
        return value == 0
    return isinstance(value, str) and bool(_ZERO_DURATION.match(value.strip()))


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


def _check_bounds(body: dict[str, Any], chat: bool) -> None:
    """The bounds on what reaches the native parsers (server.input_bounds), in Ollama's error shape: checked
    before anything is translated, counted or rendered."""
    try:
        if chat:
            check_messages(body.get("messages"))
            check_tools(body.get("tools"), ("function", "parameters"))
        if isinstance(body.get("format"), dict):
            check_schema(body["format"], "format")
    except ApiError as error:
        raise OllamaError(error.status, error.message) from None


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


def _stream_and_think(body: dict[str, Any], thinks: bool, chat: bool) -> tuple[bool, dict[str, Any]]:
    """Both routes' first steps: the input bounds checked, then whether to stream and the thinking fields."""
    _check_bounds(body, chat=chat)
    return wants_stream(body), think_fields(body, str(body.get("model")), thinks)


def chat_request(body: dict[str, Any], model_id: str, thinks: bool = False) -> dict[str, Any]:
    """An Ollama /api/chat body (with messages) as an OpenAI chat completion body (`thinks`: the model's
    template thinks)."""
    stream, think = _stream_and_think(body, thinks, chat=True)
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
    stream, think = _stream_and_think(body, thinks, chat=False)
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
