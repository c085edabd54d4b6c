"""`failsoft bench --against URL`: Failsoft's throughput beside another OpenAI-compatible server's (Ollama, LM
Studio, a llama-server of one's own, an older Failsoft) at the same numbers of concurrent clients,
interleaved in one run so both see the same machine, as ratios (Failsoft over the other)."""

from __future__ import annotations

from typing import Any

from tray_app.bench.measure import WORKER_STREAM_HEADERS
from tray_app.bench.throughput import Target, level_figures, paired_levels

REQUESTS_PER_CLIENT = 4  # each client's requests, one after another


def other_target(url: str, model: str) -> Target:
    """The other server at `url` (with or without its /v1), asked for `model`, a new connection a request:
    servers that end an event stream often close the connection they announced as kept alive. Each server
    keeps its own prompt cache as it comes (Failsoft's too: `failsoft_target`)."""
    return Target(url.rstrip("/").removesuffix("/v1"), dict(WORKER_STREAM_HEADERS), model, cache_prompt=None)


def failsoft_target(url: str, api_key: str) -> Target:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return Target(url.rstrip("/"), headers, cache_prompt=None)


async def against_figures(
    failsoft: Target, other: Target, *, levels: tuple[int, ...], rounds: int, max_tokens: int
) -> dict[str, Any]:
    measured = await paired_levels(
        other,
        failsoft,
        levels=levels,
        rounds=rounds,
        requests_per_client=REQUESTS_PER_CLIENT,
        max_tokens=max_tokens,
    )
    return {
        "failsoft": failsoft.base_url,
        "against": other.base_url,
        "model": other.model,
        "rounds": rounds,
        "requests_per_client": REQUESTS_PER_CLIENT,
        "max_tokens": max_tokens,
        "levels": [level_figures(c, o, f, ("other", "failsoft")) for c, o, f in measured],
    }
