"""Parse and check an OpenAI request body before anything is spent on it: wrong types are a 400 here, not a
500 deep inside a worker."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from tray_app.engine.request_fields import BUDGET_ALIAS, engine_internal_field, fold_budget
from tray_app.library.catalog import resolve_name
from tray_app.library.keep_alive import parse_keep_alive
from tray_app.server.errors import ApiError, bad_request
from tray_app.server.input_bounds import check_openai

Kind = Literal["chat", "completion"]
ROLES = {"system", "user", "assistant", "tool", "function", "developer"}
_NUMBER_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p", "repeat_penalty")
_INT_FIELDS = ("seed", "top_k", "top_logprobs")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
NO_COMPLETION_LOGPROBS = (
    "log probabilities are served for chat completions (logprobs: true, top_logprobs: 0 to 20); llama-server "
    "does not give them in the legacy completions format"
)
MAX_TOP_LOGPROBS = 20  # OpenAI's limit


@dataclass
class ParsedRequest:
    kind: Kind
    body: dict[str, Any]
    stream: bool
    max_tokens: int | None
    raw: bytes

    @cached_property
    def body_hash(self) -> str:
        """Only an Idempotency-Key's record compares it (jobs.idempotency): hashed when one asks."""
        return body_hash(self.raw)

    @property
    def model(self) -> str | None:
        value = self.body.get("model")
        return value if isinstance(value, str) else None


def body_hash(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array", "messages")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise bad_request(f"'{where}' must be an object", where)
        role = message.get("role")
        if role not in ROLES:
            raise bad_request(f"'{where}.role' must be one of {', '.join(sorted(ROLES))}", f"{where}.role")
        content = message.get("content")
        if content is None and role != "assistant":
            raise bad_request(f"'{where}.content' is required for a {role} message", f"{where}.content")
        if content is not None and not isinstance(content, str | list):
            raise bad_request(f"'{where}.content' must be a string, an array or null", f"{where}.content")
        if isinstance(content, list):
            _check_parts(content, f"{where}.content")
        tool_calls = message.get("tool_calls")
        if tool_calls is not None and not isinstance(tool_calls, list):
            raise bad_request(f"'{where}.tool_calls' must be an array", f"{where}.tool_calls")


def _check_parts(parts: list[Any], where: str) -> None:
    for index, part in enumerate(parts):
        if not isinstance(part, dict) or not isinstance(part.get("text", ""), str):
            raise bad_request(f"'{where}' parts must be objects with text", where)
        kind = part.get("type", "text")
        if kind != "text":
            raise bad_request(
                f"'{where}[{index}]' is a {kind!r} part: this model reads text only",
                f"{where}[{index}]",
                code="unsupported_content",
            )


def _check_common(body: dict[str, Any]) -> int | None:
    internal = engine_internal_field(body)
    if internal is not None:
        name, instead = internal
        raise bad_request(
            f"'{name}' is one of llama-server's own fields and is not taken here: {instead}",
            name,
            code="unsupported_field",
        )
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("'stream' must be true or false", "stream")
    for name in _NUMBER_FIELDS:
        if body.get(name) is not None and not _is_number(body[name]):
            raise bad_request(f"'{name}' must be a number", name)
    for name in _INT_FIELDS:
        if body.get(name) is not None and not _is_int(body[name]):
            raise bad_request(f"'{name}' must be an integer", name)
    seed = body.get("seed")
    if seed is not None and not INT64_MIN <= seed <= INT64_MAX:
        # The journal keeps the seed a replay samples with as an SQLite integer (64 bits).
        raise bad_request(f"'seed' must be between {INT64_MIN} and {INT64_MAX}", "seed")
    n = body.get("n")
    if n is not None and n != 1:
        raise bad_request("only 'n' = 1 is supported", "n", code="unsupported_value")
    stop = body.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise bad_request("'stop' must be a string or an array of strings", "stop")
    for name in ("max_tokens", BUDGET_ALIAS):
        value = body.get(name)
        if value is not None and (not _is_int(value) or value < 1):
            raise bad_request(f"'{name}' must be an integer >= 1", name)
    # One budget field from here on (every route, the journal, each resume): the one admission counts.
    fold_budget(body)
    max_tokens: int | None = body.get("max_tokens")
    grammar = body.get("grammar")
    if grammar is not None and not isinstance(grammar, str):
        raise bad_request("'grammar' must be a string (GBNF)", "grammar")
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    return max_tokens


def _check_tools(body: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(tool, dict) for tool in tools)):
        raise bad_request("'tools' must be an array of objects", "tools")
    for index, tool in enumerate(tools or []):
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            where = f"tools[{index}].function"
            raise bad_request(f"'{where}' must be an object with a string 'name'", where)
    choice = body.get("tool_choice")
    if choice is not None and not isinstance(choice, str | dict):
        raise bad_request("'tool_choice' must be a string or an object", "tool_choice")
    if isinstance(choice, str) and choice not in ("none", "auto", "required"):
        raise bad_request("'tool_choice' must be 'none', 'auto', 'required' or an object", "tool_choice")
    if (choice == "required" or isinstance(choice, dict)) and not tools:
        raise bad_request("'tool_choice' asks for a tool call but 'tools' is empty", "tool_choice")
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise bad_request("'tool_choice.function.name' must be a string", "tool_choice")
        names = {tool["function"]["name"] for tool in tools or []}  # each a string: checked above
        if name not in names:
            raise bad_request(
                f"'tool_choice' names a function that is not in 'tools': {name!r}", "tool_choice"
            )
    response_format = body.get("response_format")
    if response_format is not None and not isinstance(response_format, dict):
        raise bad_request("'response_format' must be an object", "response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        json_schema = response_format.get("json_schema")
        if not isinstance(json_schema, dict) or not isinstance(json_schema.get("schema"), dict):
            raise bad_request(
                "'response_format.json_schema.schema' must be an object", "response_format.json_schema"
            )


def _check_logit_bias(body: dict[str, Any]) -> None:
    bias = body.get("logit_bias")
    if bias is None:
        return
    if not isinstance(bias, dict) or not all(_is_number(value) for value in bias.values()):
        raise bad_request("'logit_bias' must be an object of token ids to numbers", "logit_bias")
    # llama-cpp-python's own extension: logit_bias_type "tokens" keys the biases by text.
    if body.get("logit_bias_type") != "tokens" and not all(_is_token_id(key) for key in bias):
        raise bad_request("'logit_bias' keys must be token ids (whole numbers)", "logit_bias")


def _is_token_id(key: str) -> bool:
    return key.isascii() and key.lstrip("-").isdigit()


def _check_logprobs(kind: Kind, body: dict[str, Any]) -> None:
    """Chat asks with `logprobs: true` (and `top_logprobs`), which llama-server serves; completions ask with
    `logprobs: <count>`, which it does not give in that API's format."""
    logprobs = body.get("logprobs")
    if kind == "chat":
        if logprobs is not None and not isinstance(logprobs, bool):
            raise bad_request("'logprobs' must be true or false", "logprobs")
        if logprobs is True and body.get("tools"):
            # llama-server gives none with tools in a stream, and the router always streams from it.
            raise bad_request(
                "log probabilities cannot be combined with tools here: llama-server gives none for a "
                "tool-calling answer streamed to the router",
                "logprobs",
                code="unsupported_value",
            )
        top = body.get("top_logprobs")
        if top is not None:
            if logprobs is not True:
                raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
            if not 0 <= top <= MAX_TOP_LOGPROBS:  # an integer: checked with the other integer fields
                raise bad_request(f"'top_logprobs' must be 0 to {MAX_TOP_LOGPROBS}", "top_logprobs")
        return
    if logprobs is not None and not _is_int(logprobs):
        raise bad_request("'logprobs' must be an integer", "logprobs")
    if logprobs is not None:
        raise bad_request(NO_COMPLETION_LOGPROBS, "logprobs", code="unsupported_value")


# The deepest JSON nesting a body may have: far past any request's (tool schemas included), and far short of
# the interpreter's recursion limit, which every later json.dumps of the body would run into.
MAX_DEPTH = 100


def load_json(raw: bytes) -> Any:
    """The JSON value of a body; ValueError saying why it is not one (too deeply nested included). UTF-8
    only, as RFC 8259 asks: json.loads would also read UTF-16 and UTF-32 (where a `\\ud800` escape hides
    from body_problem's look at the raw bytes) and lets UTF-8-encoded surrogates through."""
    encoding = json.detect_encoding(raw)
    if encoding not in ("utf-8", "utf-8-sig"):
        raise ValueError(f"it is encoded as {encoding.upper()}, and a JSON body must be UTF-8")
    try:
        return json.loads(raw.decode(encoding))
    except RecursionError:
        raise ValueError(f"it is nested more than {MAX_DEPTH} deep") from None


def body_problem(raw: bytes, body: Any) -> tuple[str, str, str] | None:
    """What makes a parsed body unfit however its fields are read, as (message, where, code): a string with
    a lone UTF-16 surrogate (JSON lets `"\\ud800"` through, but no tokenizer, worker or UTF-8 encoder takes
    it), or nesting deeper than MAX_DEPTH. Looked for only where the raw text can hold it: only an escape
    makes a surrogate (raw surrogate bytes are not UTF-8: load_json refuses them, and other encodings), only
    many brackets deep nesting."""
    surrogates = b"\\ud" in raw or b"\\uD" in raw
    if not surrogates and raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return None
    stack: list[tuple[str, Any, int]] = [("", body, 0)]
    while stack:
        where, item, depth = stack.pop()
        if isinstance(item, str):
            if surrogates and not _is_text(item):
                return _surrogate(where)
        elif isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                field = _printable(where.partition("[")[0].partition(".")[0])  # the top-level field
                return f"'{field}' is nested more than {MAX_DEPTH} deep", field, "invalid_json"
            if isinstance(item, list):
                stack.extend((f"{where}[{index}]", child, depth + 1) for index, child in enumerate(item))
                continue
            for key, child in item.items():
                if surrogates and not _is_text(key):
                    return _surrogate(f"{where} (a key)" if where else "a key")
                stack.append((f"{where}.{key[:40]}" if where else key[:40], child, depth + 1))
    return None


def _is_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _printable(where: str) -> str:
    """A place in the body fit for a message (ASCII; a lone surrogate in a key as its escape)."""
    return where.encode("utf-8", "backslashreplace").decode("ascii", "replace")[:200] or "the body"


def _surrogate(where: str) -> tuple[str, str, str]:
    place = _printable(where)
    message = f"'{place}' holds a lone UTF-16 surrogate (such as \\ud800): it is not Unicode text"
    return message, place, "invalid_unicode"


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = load_json(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise bad_request(f"the request body is not valid JSON: {error}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_json")
    problem = body_problem(raw, body)
    if problem is not None:
        raise bad_request(*problem)
    return body


def parse_request(kind: Kind, raw: bytes) -> ParsedRequest:
    """A checked request; ApiError(400) naming the field when something is wrong."""
    body = parse_json_object(raw)
    check_openai(body, chat=kind == "chat")  # before anything reads its messages, tools or grammar
    max_tokens = _check_common(body)
    _check_logit_bias(body)
    _check_logprobs(kind, body)
    if kind == "chat":
        _check_messages(body.get("messages"))
        _check_tools(body)
    else:
        prompt = body.get("prompt")
        if not (
            isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(p, str) for p in prompt))
        ):
            raise bad_request("'prompt' must be a string or an array of strings", "prompt")
        if isinstance(prompt, list) and len(prompt) != 1:
            raise bad_request("'prompt' as an array must hold exactly one string", "prompt")
    return ParsedRequest(kind, body, bool(body.get("stream")), max_tokens, raw)


def _public_names(known: set[str]) -> list[str]:
    """Model names fit to show a client: the accepted file path stays out of error messages."""
    return sorted(name for name in known if "/" not in name and "\\" not in name)


def check_model(request: ParsedRequest, known: set[str]) -> str | None:
    """The name the service knows the request's model by, written into its body (an Ollama client's
    `name:latest` becomes the library's name); 404 in the OpenAI format for a model this service does not
    serve (no model given: the default)."""
    name = check_model_name(request.model, known)
    if name != request.model:
        request.body["model"] = name
    return name


def check_model_name(model: str | None, known: set[str]) -> str | None:
    """The name in `known` that `model` means (also as Ollama's clients name it: library.resolve_name)."""
    if model is None:
        return None
    name = resolve_name(model, known)
    if name is None:
        raise ApiError(
            404,
            f"The model '{model}' does not exist; this service serves {', '.join(_public_names(known))}",
            code="model_not_found",
            param="model",
        )
    return name


def keep_alive_option(value: Any) -> float | None:
    """A request's `keep_alive` (Ollama's field, also taken on the OpenAI routes): how long its model
    stays loaded after it; None when the request sets none. 400 when it is not a duration."""
    if value is None:
        return None
    try:
        return parse_keep_alive(value)
    except ValueError as error:
        raise bad_request(str(error), "keep_alive") from None


STAND_IN_REFUSED = ("no", "false", "0", "never", "refuse")


def stand_in_allowed(header: str | None, option: Any) -> bool:
    """Whether the request lets a smaller model answer in its model's place (the ladder): allowed unless
    the `X-Failsoft-Stand-In` header says no, or the body's `stand_in` is false."""
    if option is not None and not isinstance(option, bool):
        raise bad_request("'stand_in' must be true or false", "stand_in")
    if option is False:
        return False
    return header is None or header.strip().lower() not in STAND_IN_REFUSED
