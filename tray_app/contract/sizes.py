"""Human-readable byte sizes: parse "4GiB" / "512 MB", format 47185920 as "45.00 MiB", and draw a size as its
share of a total in text (`failsoft plan`, `failsoft status`)."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
BAR_WIDTH = 32
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes from "4GiB", "1.5 GB", "512M" or a plain integer; ValueError names what is allowed."""
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must not be negative, got {text}")
        return text
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use a number with B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)")
    return int(float(match.group(1)) * _UNITS[unit])


def format_size(num_bytes: int | float) -> str:
    """Binary units with two decimals, the way llama.cpp prints its buffers."""
    value = float(num_bytes)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{sign}{value:.0f} B" if unit == "B" else f"{sign}{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def text_bar(part: int, total: int) -> str:
    """A bar of BAR_WIDTH characters, "#" for `part` of `total`."""
    filled = round(BAR_WIDTH * part / total) if total > 0 else 0
    if part > 0:
        filled = max(filled, 1)  # a small part still shows
    return "#" * min(filled, BAR_WIDTH) + "." * (BAR_WIDTH - min(filled, BAR_WIDTH))
