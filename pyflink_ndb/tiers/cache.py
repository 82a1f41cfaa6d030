"""Tier 1: the per-subtask LRU cache (cachetools) with write-back on eviction.

cachetools calls :meth:`popitem` when the cache is full; the override hands the evicted
entry to a callback (the tiered table writes it to tier 2). Not thread-safe: one cache
belongs to one subtask thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cachetools import LRUCache


class WriteBackLRU(LRUCache):  # type: ignore[misc]
    """An LRU cache of at most `maxsize` entries whose evictions go to `on_evict(key, value)`."""

    def __init__(self, maxsize: int, on_evict: Callable[[Any, Any], None]) -> None:
        super().__init__(maxsize=maxsize)
        self._on_evict = on_evict

    def popitem(self) -> tuple[Any, Any]:
        key, value = super().popitem()
        self._on_evict(key, value)
        return key, value
