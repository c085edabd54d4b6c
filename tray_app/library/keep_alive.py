"""Keep-alive durations as Ollama takes them: seconds as a number, or a string such as "5m", "1h30m",
"300", "300s"; any negative value keeps the model loaded for good (as does one longer than Ollama's longest
duration); 0 unloads it once its requests end."""

from __future__ import annotations

import math
import re

FOREVER = -1.0
# Go's longest duration (Ollama's keep-alive is one), in seconds: a longer one keeps the model for good.
LONGEST_SECONDS = (2**63 - 1) / 1e9
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: object) -> float:
    """Seconds (FOREVER for a negative value); ValueError naming what is accepted otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"keep_alive {value!r} is not a duration")
    if isinstance(value, int | float):
        # An int is compared as it is: one past a float's range is a duration too (JSON has no bound).
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"keep_alive {value!r} is not a duration")
        return FOREVER if value < 0 or value > LONGEST_SECONDS else float(value)
    if not isinstance(value, str):
        raise ValueError(f"keep_alive {value!r} is not a duration")
    text = value.strip()
    try:
        return parse_keep_alive(float(text))
    except ValueError:
        pass
    if text.startswith("-"):
        return FOREVER
    if not text or _PART.sub("", text):
        raise ValueError(f'keep_alive {value!r} is not a duration (e.g. 300, "5m", "1h", -1 for always)')
    seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in _PART.findall(text))
    return FOREVER if seconds > LONGEST_SECONDS else seconds
