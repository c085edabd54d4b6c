"""Which fields of a client's request reach llama-server.

llama-server reads many fields of its own besides OpenAI's, and some of them defeat what the router counted
or decided: `id_slot` pins a request to one slot (a busy one defers it, and the router's slot count no longer
matches the worker's), `n_cmpl` starts child answers on other slots (merged into one by the assembler),
`n_predict` generates past the `max_tokens` admission counted. So a worker gets an allow-list, per route:
OpenAI's fields and the sampling extensions the README documents. The engine's internal fields are refused
with a 400 naming them; any other field is dropped, as OpenAI-compatible servers ignore what they do not know.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

Kind = Literal["chat", "completion"]

# OpenAI's fields for both routes (the router reads `stream` and `stream_options` itself, see
# jobs.registry.ROUTER_FIELDS; the rest is the worker's).
_OPENAI_COMMON = frozenset(
    {
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "seed",
        "stop",
        "stream",
        "user",
    }
)
_OPENAI_CHAT = frozenset(
    {
        "messages",
        "logprobs",
        "top_logprobs",
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning_effort",
    }
)
_OPENAI_COMPLETION = frozenset({"prompt"})
# llama.cpp's sampling extensions (README, "HTTP API"): they change how tokens are drawn, never how many
# slots or tokens a request takes. `cache_prompt` only says whether the worker may reuse a cached prefix.
SAMPLING_EXTENSIONS = frozenset(
    {
        "top_k",
        "min_p",
        "typical_p",
        "repeat_penalty",
        "repeat_last_n",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
        "dynatemp_range",
        "dynatemp_exponent",
        "xtc_probability",
        "xtc_threshold",
        "dry_multiplier",
        "dry_base",
        "dry_allowed_length",
        "dry_penalty_last_n",
        "dry_sequence_breakers",
        "top_n_sigma",
        "ignore_eos",
        "reasoning_budget_tokens",  # a thinking model's reasoning, cut after this many tokens
        "grammar",
        "logit_bias_type",
        "cache_prompt",
    }
)
# OpenAI's newer name for `max_tokens` (chat only, but sent to both routes by some clients). llama-server
# reads it before `max_tokens`, so a body carrying both would generate to the client's figure rather than
# the budget admission counted: the router folds it into `max_tokens` (fold_budget) and never forwards it.
BUDGET_ALIAS = "max_completion_tokens"
FORWARDED: Mapping[Kind, frozenset[str]] = {
    "chat": _OPENAI_COMMON | _OPENAI_CHAT | SAMPLING_EXTENSIONS,
    "completion": _OPENAI_COMMON | _OPENAI_COMPLETION | SAMPLING_EXTENSIONS,
}
# llama-server's own fields that would undo the router's accounting or the answer's shape: refused by name.
ENGINE_INTERNAL: Mapping[str, str] = {
    "id_slot": "the router chooses the slot",
    "n_cmpl": "one answer per request ('n' = 1)",
    "n_predict": "use 'max_tokens'",
    "n_keep": "the worker's context is managed by the router",
    "n_discard": "the worker's context is managed by the router",
    "n_indent": "not served through the router",
    "n_probs": "use 'logprobs' and 'top_logprobs'",
    "post_sampling_probs": "use 'logprobs' and 'top_logprobs'",
    "t_max_predict_ms": "use 'max_tokens' or X-Failsoft-Deadline",
    "t_max_prompt_ms": "use X-Failsoft-Deadline",
    "timings_per_token": "the router measures the answer itself",
    "return_progress": "the router asks for prompt progress itself",
    "return_tokens": "not served through the router",
    "response_fields": "the answer's shape is the API's",
    "sse_ping_interval": "the router sends its own keep-alives",
    "lora": "adapters are part of the model's configuration",
    "chat_format": "the chat template is part of the model's configuration",
    "grammar_type": "use 'grammar', 'response_format' or 'tools'",
    "grammar_lazy": "use 'grammar', 'response_format' or 'tools'",
    "grammar_triggers": "use 'grammar', 'response_format' or 'tools'",
    "preserved_tokens": "use 'grammar', 'response_format' or 'tools'",
    "reasoning_format": "the router reads the reasoning in one format",
    "thinking_forced_open": "use 'reasoning_effort'",
    "parse_tool_calls": "the router reads tool calls itself",
    "samplers": "the sampling order is the engine's",
}


def engine_internal_field(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first engine-internal field `body` carries, with what to use instead; None if it has none."""
    for name in body:
        why = ENGINE_INTERNAL.get(name)
        if why is not None:
            return name, why
    return None


def fold_budget(body: dict[str, Any]) -> None:
    """`body` with one budget field, in place: its `max_completion_tokens` becomes `max_tokens` (and wins
    over a `max_tokens` beside it, as in llama-server), so every route, the journal and every resume carry
    the budget under the one name the router writes."""
    if BUDGET_ALIAS in body:
        value = body.pop(BUDGET_ALIAS)
        if value is not None:
            body["max_tokens"] = value


def forwarded(kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """`body` as a worker may see it: the fields of `kind`'s allow-list only (an unknown kind: unchanged).
    Never `max_completion_tokens`: a body journaled before the budget was folded at parse time has its
    figure as `max_tokens` when it has no `max_tokens` of its own (as jobs.resume counts it)."""
    allowed = FORWARDED.get(kind)  # type: ignore[call-overload]
    if allowed is None:
        return dict(body)
    out = {name: value for name, value in body.items() if name in allowed}
    if out.get("max_tokens") is None and body.get(BUDGET_ALIAS) is not None:
        out["max_tokens"] = body[BUDGET_ALIAS]
    return out
