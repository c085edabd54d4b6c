"""Anthropic's Messages API (`POST /v1/messages`, what Claude Code and the Anthropic SDKs speak) as the chat
completions the router serves, and the router's answers back in the Messages shape.

A request becomes a chat completion (`system` and content blocks as messages, `tool_use` blocks as tool
calls, `tool_result` blocks as tool messages, custom tools as functions), so admission, failover, approvals
and the journal apply to it as to any chat. Earlier `thinking` blocks are not sent back to the model (its
template decides what it keeps of earlier reasoning, and it gets none, as from the other APIs).
"""

from __future__ import annotations

import json
from typing import Any

from tray_app.contract.vocabulary import Reason
from tray_app.server.errors import ApiError, bad_request
from tray_app.server.input_bounds import check_count, check_messages, check_schema, check_tools
from tray_app.server.rewrite import cached_tokens

# A chat's finish reason as Anthropic's stop reason. "length" is "max_tokens" when the client's own budget
# cut the answer, "model_context_window_exceeded" when the slot's context did (see stop_reason).
STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}


def unsupported(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param, code="unsupported_value")


# ------------------------------------------------------------------------------------------- request
def chat_request(body: dict[str, Any], *, counting: bool = False) -> dict[str, Any]:
    """A Messages request body as a chat completion body; ApiError (400) naming the field otherwise.
    `counting`: for `count_tokens`, which has no `max_tokens` and does not stream."""
    if body.get("mcp_servers"):
        raise unsupported(
            "'mcp_servers' is not supported: the workers call no servers of their own", "mcp_servers"
        )
    system = body.get("system")
    blocks = 0 if system is None else len(system) if isinstance(system, list) else 1
    check_messages(
        body.get("messages"), extra=blocks, noun="messages and system blocks" if blocks else "messages"
    )
    check_tools(body.get("tools"), ("input_schema",))
    messages: list[dict[str, Any]] = []
    if system is not None:
        messages.append({"role": "system", "content": _text(system, "system")})
    conversation = body.get("messages")
    if not isinstance(conversation, list) or not conversation:
        raise bad_request("'messages' must be a non-empty array", "messages")
    for index, message in enumerate(conversation):
        messages += _turn(message, f"messages[{index}]")
    # Each tool result becomes a message of its own: the bound holds for what the template renders too.
    check_count(len(messages), "messages", "messages (each tool result counts as one)")
    out: dict[str, Any] = {"messages": messages}
    if body.get("model") is not None:
        out["model"] = body["model"]
    if body.get("tools"):
        tools = _tools(body["tools"])
        out["tools"] = tools
        out["parallel_tool_calls"] = True  # Anthropic's default: a turn may call several tools
    if body.get("tool_choice") is not None:
        out.update(_tool_choice(body["tool_choice"]))
    if counting:
        return out
    max_tokens = body.get("max_tokens")
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise bad_request("'max_tokens' must be a positive integer", "max_tokens")
        out["max_tokens"] = max_tokens
    out["stream"] = body.get("stream") is True
    if out["stream"]:
        out["stream_options"] = {"include_usage": True}  # for the usage of message_delta
    for name in ("temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            out[name] = body[name]
    stops = body.get("stop_sequences")
    if stops:
        if not isinstance(stops, list) or not all(isinstance(stop, str) for stop in stops):
            raise bad_request("'stop_sequences' must be an array of strings", "stop_sequences")
        out["stop"] = stops
    out.update(_output(body.get("output_config"), body.get("thinking")))
    return out


def counted_request(body: dict[str, Any]) -> dict[str, Any]:
    """A `count_tokens` body (no `max_tokens`, nothing to stream) as the chat whose prompt it counts."""
    return chat_request(body, counting=True)


def _turn(message: Any, where: str) -> list[dict[str, Any]]:
    """One Messages turn as chat messages: a user turn's tool results come first, as tool messages."""
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise bad_request(f"'{where}.role' must be user or assistant", f"{where}.role")
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise bad_request(f"'{where}.content' must be a string or an array of blocks", f"{where}.content")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for number, block in enumerate(content):
        at = f"{where}.content[{number}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "tool_use" and role == "assistant":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            function = {"name": str(block.get("name") or ""), "arguments": arguments}
            calls.append({"id": str(block.get("id") or ""), "type": "function", "function": function})
        elif kind == "tool_result" and role == "user":
            text = _text(block.get("content") or "", f"{at}.content")
            if block.get("is_error") and not text:
                text = "error"
            results.append(
                {"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""), "content": text}
            )
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue
        elif kind in ("image", "document", "search_result"):
            message_text = f"'{at}': {kind} blocks are not supported: the workers read text only"
            raise ApiError(400, message_text, param=at, code="unsupported_content")
        else:
            raise unsupported(f"'{at}': a {role} message cannot hold a block of type {kind!r}", at)
    out = results
    if role == "assistant":
        turn: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
        if calls:
            turn["tool_calls"] = calls
        out.append(turn)
    elif texts or not results:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _text(content: Any, where: str) -> str:
    """A string, or text blocks joined (as the router joins an OpenAI message's text parts)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"'{where}' must be a string or an array of text blocks", where)
    texts = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind in ("image", "document"):
            message = f"'{where}': {kind} blocks are not supported: the workers read text only"
            raise ApiError(400, message, param=where, code="unsupported_content")
        else:
            raise bad_request(f"'{where}' has a block of unknown type {kind!r}", where)
    return "\n".join(texts)


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise bad_request("'tools' must be an array", "tools")
    out = []
    for index, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or kind not in (None, "custom"):
            raise unsupported(
                f"'tools[{index}]': only client tools (a name and an input_schema) are supported here, "
                f"not {kind!r}",
                f"tools[{index}]",
            )
        if not isinstance(tool.get("name"), str):
            raise bad_request(f"'tools[{index}].name' must be a string", f"tools[{index}].name")
        function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> dict[str, Any]:
    kind = choice.get("type") if isinstance(choice, dict) else None
    out: dict[str, Any]
    if kind == "auto":
        out = {"tool_choice": "auto"}
    elif kind == "any":
        out = {"tool_choice": "required"}
    elif kind == "none":
        out = {"tool_choice": "none"}
    elif kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise bad_request("'tool_choice.name' must be a string", "tool_choice.name")
        out = {"tool_choice": {"type": "function", "function": {"name": choice["name"]}}}
    else:
        raise unsupported("'tool_choice.type' must be auto, any, tool or none", "tool_choice")
    if choice.get("disable_parallel_tool_use"):
        out["parallel_tool_calls"] = False
    return out


def _output(config: Any, thinking: Any) -> dict[str, Any]:
    """`output_config` (the answer's JSON schema, its effort) and `thinking` as the chat's fields."""
    out: dict[str, Any] = {}
    if isinstance(config, dict):
        fmt = config.get("format")
        if isinstance(fmt, dict):
            if fmt.get("type") != "json_schema":
                raise unsupported("'output_config.format.type' must be json_schema", "output_config.format")
            check_schema(fmt.get("schema"), "output_config.format.schema")
            schema = {"name": "output", "schema": fmt.get("schema") or {}}
            out["response_format"] = {"type": "json_schema", "json_schema": schema}
        if config.get("effort") in EFFORTS:
            out["reasoning_effort"] = EFFORTS[config["effort"]]
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        out["reasoning_effort"] = "none"  # a thinking model answers without its reasoning
    return out


# ------------------------------------------------------------------------------------------- answers
def message_id(job: str) -> str:
    """The job's id makes the message's: one id for one request, as X-Failsoft-Job names it."""
    return f"msg_{job.removeprefix('job-')}" if job else "msg_unknown"


def usage_of(usage: Any) -> dict[str, int]:
    """A chat's usage in Anthropic's terms: the prompt tokens a worker's cache held are read from the cache,
    not input (as llama-server counts them)."""
    usage = usage if isinstance(usage, dict) else {}
    cached = cached_tokens(usage)
    return {
        "input_tokens": int(usage.get("prompt_tokens") or 0) - cached,
        "output_tokens": int(usage.get("completion_tokens") or 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def stop_reason(finish_reason: str | None, request: dict[str, Any], output_tokens: int) -> str | None:
    """Anthropic's stop reason for a chat's finish reason. An answer cut short of the client's own
    `max_tokens` was cut by the context its slot had left (the router fits a larger budget to it)."""
    if finish_reason is None:
        return None
    reason = STOP_REASONS.get(finish_reason, "end_turn")
    asked = request.get("max_tokens")
    if reason == "max_tokens" and isinstance(asked, int) and output_tokens < asked:
        return "model_context_window_exceeded"
    return reason


def content_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole chat answer's message as Messages content blocks: thinking, text, then one per tool call."""
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        blocks.append(tool_use_block(call, tool_input((call.get("function") or {}).get("arguments"))))
    return blocks


def tool_use_block(call: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    return {
        "type": "tool_use",
        "id": str(call.get("id") or ""),
        "name": str(function.get("name") or ""),
        "input": arguments,
    }


def tool_input(arguments: Any) -> dict[str, Any]:
    """A tool call's JSON arguments as the object Anthropic's `input` is (the text as it came if it is no
    JSON object: what the model wrote is not hidden)."""
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return {"arguments": str(arguments)}
    return parsed if isinstance(parsed, dict) else {"arguments": parsed}


def message_of(request: dict[str, Any], result: dict[str, Any], message: str) -> dict[str, Any]:
    """A whole chat completion (the router's, with its `failsoft`) as a Message."""
    choice = (result.get("choices") or [{}])[0]
    usage = usage_of(result.get("usage"))
    answer: dict[str, Any] = {
        "id": message,
        "type": "message",
        "role": "assistant",
        "model": str(result.get("model") or ""),
        "content": content_blocks(choice.get("message") or {}),
        "stop_reason": stop_reason(choice.get("finish_reason"), request, usage["output_tokens"]),
        "stop_sequence": None,
        "usage": usage,
    }
    if result.get("failsoft"):
        answer["failsoft"] = result["failsoft"]
    return answer


def error_message(status: int, body: bytes) -> str:
    """The message of a router error answer (OpenAI's format). A prompt too long for the context says so
    in the words Anthropic's clients look for ("prompt is too long"), so they can compact and retry."""
    try:
        error = json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        return body.decode("utf-8", "replace") or f"HTTP {status}"
    message = str(error.get("message") or f"HTTP {status}") if isinstance(error, dict) else str(error)
    if isinstance(error, dict) and error.get("code") == Reason.CONTEXT_EXCEEDED:
        return f"prompt is too long: {message}"
    return message
