"""Tool definitions the tests send: their own copies, so a change to the drill's requests changes no test."""

from __future__ import annotations

from typing import Any

WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "lookup_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

ADD_TOOL: Any = {
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
FORCE_ADD: Any = {"type": "function", "function": {"name": "add"}}
