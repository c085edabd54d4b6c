"""Tool definitions the tests send (the drill's `add` tool lives in tray_app.drill.scenarios)."""

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
