"""OpenAI's Responses API (`POST /v1/responses`, what the OpenAI Agents SDK and Codex-style clients speak) as
the chat completions the router serves, and the router's answers back in the Responses shape.

A request becomes a chat completion (input items as messages, function tools, `text.format` as
`response_format`, `reasoning.effort` as `reasoning_effort`), so admission, failover, approvals and the
journal apply to it as to any chat. The journal keeps each answer with its job, so a request may continue a
stored one (`previous_response_id`, see `history_of`) unless it was made with `store: false`; server-side
`conversation` objects are a 400.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from tray_app.contract.vocabulary import RESPONSE_NOTE
from tray_app.server.errors import ApiError, bad_request
from tray_app.server.input_bounds import check_count, check_messages, check_schema, check_tools
from tray_app.server.rewrite import cached_tokens

# What an answer's echo of its request keeps as it was asked (the fields a client may read back).
ECHOED = ("instructions", "max_output_tokens", "temperature", "top_p")
# Every field of the request a Response echoes (see response_shell).
SHELL_FIELDS = (
    *ECHOED,
    "tools",
    "tool_choice",
    "text",
    "reasoning",
    "store",
    "parallel_tool_calls",
    "metadata",
    "previous_response_id",
)
# A stored job's state as a Response's status.
STATUS_OF_STATE = {"queued": "queued", "failed": "failed", "rejected": "failed", "cancelled": "cancelled"}


def unsupported(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param, code="unsupported_value")


# ------------------------------------------------------------------------------------------- request
def chat_request(body: dict[str, Any], history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Responses request body as a chat completion body; ApiError (400) naming the field otherwise.
    `history`: the messages of the stored response it continues (`previous_response_id`), before its input."""
    if body.get("conversation"):
        message = "'conversation' is not supported: use 'previous_response_id', or send the conversation"
        raise unsupported(message + " in 'input'", "conversation")
    if body.get("background"):
        raise unsupported(
            "'background' is not supported: use POST /v1/jobs for background work", "background"
        )
    check_messages(body.get("input"), "input", noun="items")
    check_tools(body.get("tools"), ("parameters",))
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request("'instructions' must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    messages += history or []
    messages += _messages(body.get("input"))
    # With the stored conversation it continues, the bound holds for what the template renders.
    check_count(len(messages), "input", "messages with the instructions and the conversation it continues")
    out: dict[str, Any] = {"messages": messages, "stream": body.get("stream") is True}
    # What a later request continuing this one takes from the stored body: the messages up to here (the
    # router may add its own after them, e.g. a forced tool call's opening tag), after the instructions;
    # and what a retrieved response echoes of its request.
    out[RESPONSE_NOTE] = {
        "instructions": instructions is not None,
        "messages": len(messages),
        "store": body.get("store") is not False,
        "request": {name: body[name] for name in SHELL_FIELDS if name in body},
    }
    if out["stream"]:
        out["stream_options"] = {"include_usage": True}  # for the usage of response.completed
    if body.get("model") is not None:
        out["model"] = body["model"]
    for name in ("temperature", "top_p", "parallel_tool_calls", "seed"):  # seed: llama.cpp's, if sent
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    if body.get("tools"):
        out["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    response_format = _format(body.get("text"))
    if response_format is not None:
        out["response_format"] = response_format
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
        out["reasoning_effort"] = reasoning["effort"]
    return out


def history_of(chat_body: dict[str, Any], result: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation a stored response ends: its request's messages without its instructions (OpenAI's
    rule: a response's instructions are not carried over to the next), then its answer. Its reasoning is
    left out, as the earlier reasoning items a client sends back are (see `_messages`)."""
    note = chat_body.get(RESPONSE_NOTE) or {}
    messages = list(chat_body.get("messages") or [])
    first = 1 if note.get("instructions") else 0
    messages = messages[first : note.get("messages", len(messages))]
    message = ((result.get("choices") or [{}])[0]).get("message") or {}
    answer: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        answer["tool_calls"] = message["tool_calls"]
    return [*messages, answer]


def stored_response(chat_body: dict[str, Any]) -> bool:
    """Whether a job's body is a Responses request made to be kept (not `store: false`)."""
    note = chat_body.get(RESPONSE_NOTE)
    return isinstance(note, dict) and note.get("store") is True


def _messages(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_request("'input' must be a string or a non-empty array of items", "input")
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise bad_request(f"'{where}' must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = {
                "id": str(item.get("call_id") or ""),
                "type": "function",
                "function": {
                    "name": str(item.get("name") or ""),
                    "arguments": str(item.get("arguments") or ""),
                },
            }
            previous = messages[-1] if messages else None
            if previous is not None and previous["role"] == "assistant" and "tool_calls" in previous:
                previous["tool_calls"].append(call)  # parallel calls of one turn: one assistant message
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, where)
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id") or ""), "content": text})
        elif kind == "reasoning":
            continue  # a model's earlier reasoning: its template decides what it keeps, and it gets none
        else:
            raise unsupported(f"'{where}': items of type {kind!r} are not supported", where)
    return messages


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise bad_request(f"'{where}.role' must be user, assistant, system or developer", f"{where}.role")
    return {"role": role, "content": _text(item.get("content"), f"{where}.content")}


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or its text parts joined (images are refused: text models here)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"'{where}' must be a string or an array of content parts", where)
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            texts.append(str(part.get("text") or ""))
        elif kind in ("input_image", "input_file", "input_audio"):
            message = f"'{where}': {kind} parts are not supported: the workers read text only"
            raise ApiError(400, message, param=where, code="unsupported_content")
        else:
            raise bad_request(f"'{where}' has a content part of unknown type {kind!r}", where)
    return "".join(texts)


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise bad_request("'tools' must be an array", "tools")
    out = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise unsupported(f"'tools[{index}]': only function tools are supported (not {kind!r})", "tools")
        function = {"name": tool.get("name"), "parameters": tool.get("parameters") or {"type": "object"}}
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if choice in ("auto", "none", "required"):
        return choice
    raise unsupported("'tool_choice' must be auto, none, required or a function", "tool_choice")


def _format(text: Any) -> dict[str, Any] | None:
    if not isinstance(text, dict) or not isinstance(text.get("format"), dict):
        return None
    fmt = text["format"]
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        check_schema(fmt.get("schema"), "text.format.schema")
        schema = {"name": fmt.get("name") or "format", "schema": fmt.get("schema") or {}}
        if fmt.get("strict") is not None:
            schema["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": schema}
    raise unsupported(f"'text.format.type' {kind!r} is not supported", "text.format")


# ------------------------------------------------------------------------------------------- answers
def new_item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def response_shell(request: dict[str, Any], response_id: str, model: str, status: str) -> dict[str, Any]:
    """A Response object without its output: what the request asked, echoed as OpenAI does."""
    shell: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": [],
        "error": None,
        "incomplete_details": None,
        "tools": request.get("tools") or [],
        "tool_choice": request.get("tool_choice") or "auto",
        "text": request.get("text") or {"format": {"type": "text"}},
        "reasoning": request.get("reasoning") or {},
        "store": request.get("store") is not False,
        "usage": None,
    }
    for name in ECHOED:
        shell[name] = request.get(name)
    shell["previous_response_id"] = request.get("previous_response_id")
    shell["parallel_tool_calls"] = request.get("parallel_tool_calls", True)
    shell["metadata"] = request.get("metadata") or {}
    return shell


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": [part]}


def call_item(item_id: str, call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    function = call.get("function") or {}
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": str(call.get("id") or ""),
        "name": str(function.get("name") or ""),
        "arguments": str(function.get("arguments") or ""),
        "status": status,
    }


def usage_of(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached_tokens(usage)},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def finish(shell: dict[str, Any], finish_reason: str | None) -> None:
    """The answer's status from the chat's finish reason: cut by its token budget is "incomplete"."""
    if finish_reason == "length":
        shell["status"] = "incomplete"
        shell["incomplete_details"] = {"reason": "max_output_tokens"}
    else:
        shell["status"] = "completed"


def response_of(request: dict[str, Any], result: dict[str, Any], response_id: str) -> dict[str, Any]:
    """A whole chat completion (the router's, with its `failsoft`) as a Response."""
    shell = response_shell(request, response_id, str(result.get("model") or ""), "completed")
    if isinstance(result.get("created"), int):
        shell["created_at"] = result["created"]  # when its answer began: the same when it is retrieved
    choice = (result.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    if message.get("reasoning_content"):
        shell["output"].append(reasoning_item(new_item_id("rs"), message["reasoning_content"]))
    if message.get("content"):
        shell["output"].append(message_item(new_item_id("msg"), message["content"]))
    for call in message.get("tool_calls") or []:
        shell["output"].append(call_item(new_item_id("fc"), call))
    finish(shell, choice.get("finish_reason"))
    shell["usage"] = usage_of(result.get("usage"))
    if result.get("failsoft"):
        shell["failsoft"] = result["failsoft"]
    return shell


def retrieved(
    chat_body: dict[str, Any],
    state: str,
    result: dict[str, Any] | None,
    error: dict[str, Any] | str | None,
    response_id: str,
    created_at: float,
) -> dict[str, Any]:
    """A stored job as the Response `GET /v1/responses/{id}` returns: whole once completed, else its status
    (queued, in progress, failed with the error, cancelled) with no output yet."""
    echo = (chat_body.get(RESPONSE_NOTE) or {}).get("request") or {}
    if state == "completed" and result is not None:
        return response_of(echo, result, response_id)
    status = STATUS_OF_STATE.get(state, "in_progress")
    answer = response_shell(echo, response_id, str(chat_body.get("model") or ""), status)
    answer["created_at"] = int(created_at)
    if status == "failed":
        fault = error if isinstance(error, dict) else {"message": error or "the request failed"}
        answer["error"] = {"code": fault.get("code") or "server_error", "message": fault.get("message")}
    return answer


def error_of(status: int, body: bytes) -> bytes:
    """A router error answer, already in OpenAI's error format: passed on as it is."""
    try:
        json.loads(body)
    except ValueError:
        return ApiError(status, body.decode("utf-8", "replace") or f"HTTP {status}").body_bytes()
    return body
