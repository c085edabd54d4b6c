"""Token counts kept for texts that come again (a conversation resends its earlier turns), bounded by the
bytes its keys hold, not by their number: a key is a prompt's text, and a few huge prompts must not hold
gigabytes. Safe to use from several threads (the tokenizer helper counts long prompts on threads)."""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

Key = TypeVar("Key")
ENTRY_BYTES = 64  # an entry's own cost beside its key: the ordered dict's slot, the count's int


def text_bytes(text: str) -> int:
    return sys.getsizeof(text)


class CountCache(Generic[Key]):
    """Counts by key, the least recently used dropped first once the keys (as `size_of` weighs them) pass
    `max_bytes`. A key heavier than `max_bytes // 8` is not kept: one prompt may not flush the rest."""

    def __init__(self, max_bytes: int, size_of: Callable[[Key], int]) -> None:
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._entries: OrderedDict[Key, tuple[int, int]] = OrderedDict()  # key -> (count, bytes)
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key) -> int | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: Key, count: int) -> None:
        size = self._size_of(key) + ENTRY_BYTES
        if size > self.max_bytes // 8:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (count, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped
