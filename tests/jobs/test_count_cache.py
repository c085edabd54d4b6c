"""The token counter's caches are bounded by the bytes their keys hold (issue 36): they were bounded by count
(4096 texts, 256 role shapes), each key a whole prompt text, so a few huge prompts held what they weighed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tray_app.tokenizer import counter as counter_module
from tray_app.tokenizer.count_cache import CountCache, text_bytes
from tray_app.tokenizer.counter import TokenCounter

KIB = 1024


def test_huge_prompts_cannot_make_the_count_caches_hold_more_than_their_bytes(
    model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(counter_module, "CONTENT_CACHE_BYTES", 256 * KIB)
    monkeypatch.setattr(counter_module, "FRAMING_CACHE_BYTES", 64 * KIB)
    counter = TokenCounter(model_path)
    bound = 256 * KIB + 64 * KIB
    for n in range(12):  # 12 texts of 30 KiB: each small enough to keep, together beyond the bound
        text = f"turn {n}: " + "a river ran by " * 2000
        first = counter.count_chat({"messages": [{"role": "user", "content": text}]})
        assert counter.count_chat({"messages": [{"role": "user", "content": text}]}) == first
        assert counter.cached_bytes <= bound
    huge = "the whole book " * 40_000  # 600 KiB: beyond the bound alone
    counter.count_chat({"messages": [{"role": "user", "content": huge}]})
    assert counter.cached_bytes <= bound
    for n in range(6):  # long conversations: role shapes of 600 messages each
        roles = ["user", "assistant"] * 300
        roles[n] = "system"
        counter.count_chat({"messages": [{"role": role, "content": ""} for role in roles]})
        assert counter.cached_bytes <= bound


def test_the_least_recently_used_goes_first_and_a_heavy_key_is_not_kept() -> None:
    cache: CountCache[str] = CountCache(8 * KIB, text_bytes)
    texts = [f"{n}" * 900 for n in range(10)]  # about 1 KiB each, with their entries: 8 fit
    for n, text in enumerate(texts[:6]):
        cache.put(text, n)
    assert cache.get(texts[0]) == 0  # used again: now the most recent
    for n, text in enumerate(texts[6:], 6):
        cache.put(text, n)
    assert cache.held_bytes <= 8 * KIB
    assert cache.get(texts[0]) == 0 and cache.get(texts[1]) is None
    cache.put("x" * (2 * KIB), 1)  # over an eighth of the bound: one key may not flush the rest
    assert cache.get("x" * (2 * KIB)) is None
