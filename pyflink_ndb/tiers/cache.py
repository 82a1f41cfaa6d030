"""Tier 1: the per-subtask LRU cache with write-back on eviction.

An :class:`collections.OrderedDict` in recency order (least recently used first): a hit
moves its entry to the end, an insert into a full cache first evicts the oldest entry and
hands it to a callback (the tiered table writes it to tier 2). The ordered dict is C code:
a hit or an insert costs a fraction of cachetools' `LRUCache` (which this replaced), whose
Python-level bookkeeping made up a fifth of the task thread's state work on the
user-profile job (bench part 9). Not thread-safe: one cache belongs to one subtask thread.

The hot paths of :class:`~pyflink_ndb.tiers.table.TieredTable` use :attr:`WriteBackLRU.data`
directly (the same rules: a read that hits moves the entry to the end; an insert of a new
key into a full cache calls :meth:`WriteBackLRU.popitem` first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

_MISSING = object()


class WriteBackLRU:
    """An LRU cache of at most `maxsize` entries whose evictions go to `on_evict(key, value)`.

    Reads through :meth:`get` and `[]` count as uses; `in`, `len`, iteration and
    :meth:`keys` do not. The entry being inserted is never the one evicted for it.
    """

    __slots__ = ("maxsize", "data", "_on_evict")

    def __init__(self, maxsize: int, on_evict: Callable[[Any, Any], None]) -> None:
        if maxsize < 1:
            raise ValueError(f"an LRU cache holds at least 1 entry, not {maxsize}")
        self.maxsize = maxsize
        #: The entries, least recently used first.
        self.data: OrderedDict[Any, Any] = OrderedDict()
        self._on_evict = on_evict

    def __getitem__(self, key: Any) -> Any:
        value = self.data[key]
        self.data.move_to_end(key)
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        data = self.data
        value = data.get(key, _MISSING)
        if value is _MISSING:
            return default
        data.move_to_end(key)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        data = self.data
        if key in data:
            data[key] = value
            data.move_to_end(key)
            return
        while len(data) >= self.maxsize:
            self.popitem()
        data[key] = value

    def __delitem__(self, key: Any) -> None:
        del self.data[key]

    def popitem(self) -> tuple[Any, Any]:
        """Remove the least recently used entry and hand it to the callback."""
        key, value = self.data.popitem(last=False)
        self._on_evict(key, value)
        return key, value

    def __contains__(self, key: Any) -> bool:
        return key in self.data

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.data)

    def keys(self) -> Any:
        return self.data.keys()
