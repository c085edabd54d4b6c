"""Ollama's `options`, `format` and `think` as the OpenAI and llama-server fields the router takes."""

from __future__ import annotations

from typing import Any

from tray_app.server.ollama.errors import OllamaError

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


def think_fields(body: dict[str, Any], model: str, thinks: bool) -> dict[str, Any]:
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
