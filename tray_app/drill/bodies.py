"""What the drill sends: its prompts, request bodies and the tool its agent turn calls."""

from __future__ import annotations

from typing import Any

SEED = 7
BASE: dict[str, Any] = {"model": "default", "temperature": 0, "seed": SEED}
SEA = [{"role": "user", "content": "Write one short sentence about the sea."}]
# Asked so that the answer is one line: the request claims a large max_tokens, the answer stays short.
SKY = [{"role": "user", "content": "In one short sentence: why is the sky blue?"}]
STORY = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]
FAULT_REQUEST: dict[str, Any] = {**BASE, "messages": SEA, "max_tokens": 24}
PROMPT_ALLOWANCE = 64  # tokens the drill's short prompts take, chat template included (upper bound)
MID_GENERATION_TOKENS = 6  # a fault fires after this many generated tokens: text has reached the client
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
FORCE_ADD = {"type": "function", "function": {"name": "add"}}
ASK_TOKENS = 24  # the ladder's requests: short answers


def ask(model: str, max_tokens: int = ASK_TOKENS) -> dict[str, Any]:
    """A short chat request for `model` (the ladder's)."""
    return {**BASE, "model": model, "messages": SEA, "max_tokens": max_tokens}
