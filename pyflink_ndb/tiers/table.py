"""The tiered table: one subtask's entries across tier 1 (LRU), tier 2 (RocksDB) and
tier 3 (the store), with the set of entries changed since the last snapshot.

An entry is addressed by (state id, ukey) and carries its key group, its value bytes
(None: known to have no value, i.e. deleted or absent: negative caching) and its TTL
expiry. Writes stay in tiers 1-2 and mark the entry dirty; :meth:`dirty_rows` lists what
a snapshot must write, :meth:`mark_clean` ends the epoch. Evicted entries, dirty or clean,
move to tier 2 (dirty ones stay dirty). Without tier 2, evicted clean entries are dropped
and evicted dirty ones wait in memory until the next snapshot.
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from cachetools import LRUCache

from pyflink_ndb.serialization.keys import key_json, split_key
from pyflink_ndb.stores.base import StateStore, WriteRow
from pyflink_ndb.stores.lineage import Ranges
from pyflink_ndb.tiers.cache import WriteBackLRU
from pyflink_ndb.tiers.local import LocalTier

EntryId = tuple[int, bytes]

#: Rows per page when a prefix scan reads tier 3.
SCAN_PAGE_ROWS = 1000


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry as the tiers hold it; `value` None means "no value"."""

    value: bytes | None
    key_group: int
    expires_at_ms: int | None


def _nothing_visible(key_group: int) -> Ranges:
    return ()


def _never(key_group: int) -> bool:
    return False


class TieredTable:
    """Entries of one subtask. Not thread-safe; used only from the subtask's task thread.

    :param store: tier 3 (opened).
    :param cache_max_entries: size of tier 1 (entries, at least 1).
    :param local: tier 2, or None when `local.enabled` is false.

    `prefix_states` holds the state ids whose ukeys are `encoded Flink key + suffix` (map
    and list states); their cached entries are indexed by Flink key so that a prefix scan
    need not walk the whole cache.
    """

    def __init__(self, store: StateStore, cache_max_entries: int,
                 local: LocalTier | None) -> None:
        self.store = store
        self.local = local
        self.prefix_states: set[int] = set()
        self._cache = WriteBackLRU(cache_max_entries, self._evicted)
        self._spill: dict[EntryId, Entry] = {}
        self._dirty: set[EntryId] = set()
        self._index: dict[tuple[int, bytes], set[bytes]] = {}
        self._key_json_memo: LRUCache = LRUCache(maxsize=max(cache_max_entries, 100_000))
        self.store_reads = 0
        #: The version ranges the running branch sees in a key group (set by the
        #: checkpoint protocol when it claims the key groups).
        self.visibility: Callable[[int], Ranges] = _nothing_visible
        #: Key groups whose every stored version this attempt holds in tiers 1-2 (its
        #: branch inherited nothing there and tier 2 keeps every evicted entry): a miss
        #: there needs no round trip to the store.
        self.store_has_nothing: Callable[[int], bool] = _never
        self.store_reads_saved = 0
        #: Changes with every snapshot: lets a state tell "written in this epoch" apart.
        self.epoch_token = uuid.uuid4().int >> 64

    # -- tier 1 bookkeeping ---------------------------------------------------------------
    def _index_add(self, eid: EntryId) -> None:
        if eid[0] in self.prefix_states:
            prefix, _ = split_key(eid[1])
            self._index.setdefault((eid[0], prefix), set()).add(eid[1])

    def _index_drop(self, eid: EntryId) -> None:
        if eid[0] in self.prefix_states:
            prefix, _ = split_key(eid[1])
            members = self._index.get((eid[0], prefix))
            if members is not None:
                members.discard(eid[1])
                if not members:
                    del self._index[(eid[0], prefix)]

    def _evicted(self, eid: EntryId, entry: Entry) -> None:
        self._index_drop(eid)
        if self.local is not None:
            self.local.put(eid[0], eid[1], entry.value, entry.key_group, entry.expires_at_ms)
        elif eid in self._dirty:
            self._spill[eid] = entry

    def _cache_put(self, eid: EntryId, entry: Entry) -> None:
        if eid not in self._cache:
            self._index_add(eid)
        self._cache[eid] = entry

    # -- access ---------------------------------------------------------------------------
    def _lower(self, eid: EntryId) -> Entry | None:
        """The entry from tier 2 (or the spill), or None when those tiers do not know it."""
        spilled = self._spill.get(eid)
        if spilled is not None:
            return spilled
        if self.local is not None:
            found = self.local.get(eid[0], eid[1])
            if found is not None:
                return Entry(*found)
        return None

    def get(self, state_id: int, ukey: bytes, key_group: int) -> Entry:
        """The entry, read from the first tier that knows it (cached in tier 1 after)."""
        eid = (state_id, ukey)
        entry = self._cache.get(eid)
        if entry is not None:
            return entry
        entry = self._lower(eid)
        if entry is None and self.store_has_nothing(key_group):
            self.store_reads_saved += 1
            entry = Entry(None, key_group, None)
        if entry is None:
            self.store_reads += 1
            version = self.store.read_latest(state_id, key_group, ukey,
                                             self.visibility(key_group))
            if version is None or version.tombstone:
                entry = Entry(None, key_group, None)
            else:
                entry = Entry(version.value, key_group, version.expires_at_ms)
        self._cache_put(eid, entry)
        return entry

    def put(self, state_id: int, ukey: bytes, key_group: int, value: bytes | None,
            expires_at_ms: int | None = None) -> None:
        """Set the entry (value None deletes it) and mark it dirty."""
        eid = (state_id, ukey)
        self._cache_put(eid, Entry(value, key_group, expires_at_ms))
        self._dirty.add(eid)

    def preload(self, state_id: int, ukey: bytes, key_group: int, value: bytes | None,
                expires_at_ms: int | None) -> None:
        """Place a clean copy of a stored entry in tier 2 (tier 1 without tier 2)."""
        if self.local is not None:
            self.local.put(state_id, ukey, value, key_group, expires_at_ms)
        else:
            self._cache_put((state_id, ukey), Entry(value, key_group, expires_at_ms))

    def scan_prefix(self, state_id: int, key_group: int, prefix: bytes
                    ) -> Iterator[tuple[bytes, Entry]]:
        """Every entry (with or without a value) whose ukey starts with `prefix`, in ukey
        order, each exactly once, current as of the moment it is yielded.

        Memory stays bounded: tier 3 is read in pages of :data:`SCAN_PAGE_ROWS` rows and
        tier 2 through a RocksDB iterator; only tier 1's members of this prefix (at most
        `cache.max-entries`) are held. Entries changed during the scan are yielded with
        their new content; entries added during the scan may or may not be yielded.
        """
        cached = sorted(self._index.get((state_id, prefix), ())) \
            if state_id in self.prefix_states else \
            sorted(u for (s, u) in list(self._cache.keys()) if s == state_id
                   and u.startswith(prefix))
        spilled = sorted(u for (s, u) in self._spill if s == state_id and u.startswith(prefix))
        local = (u for u, *_ in self.local.iter_prefix(state_id, prefix)) \
            if self.local is not None else iter(())
        remote_versions: dict[bytes, Entry] = {}
        ranges = self.visibility(key_group)

        def remote() -> Iterator[bytes]:
            if self.store_has_nothing(key_group):
                return
            after: bytes | None = None
            while True:
                self.store_reads += 1
                page = self.store.scan_latest(state_id, key_group, prefix, after,
                                              SCAN_PAGE_ROWS, ranges)
                for ukey, version in page:
                    remote_versions[ukey] = Entry(
                        None if version.tombstone else version.value, key_group,
                        version.expires_at_ms)
                    yield ukey
                if len(page) < SCAN_PAGE_ROWS:
                    return
                after = page[-1][0]

        last: bytes | None = None
        for ukey in heapq.merge(iter(cached), iter(spilled), local, remote()):
            if ukey == last:
                continue
            last = ukey
            eid = (state_id, ukey)
            entry = self._cache.get(eid) or self._lower(eid)
            if entry is None:
                entry = remote_versions.get(ukey)
                if entry is None:
                    continue
            remote_versions.pop(ukey, None)
            yield ukey, entry

    # -- epochs ---------------------------------------------------------------------------
    @property
    def dirty_count(self) -> int:
        return len(self._dirty)

    def dirty_rows(self, json_of: Callable[[int, bytes], str | None]) -> list[WriteRow]:
        """The rows a snapshot must write: every dirty entry (a tombstone where it has no
        value). `json_of(state_id, value)` renders the JSON column."""
        rows = []
        for eid in sorted(self._dirty):
            entry = self._cache.get(eid)
            if entry is None:
                entry = self._lower(eid)
            if entry is None:
                raise AssertionError(f"dirty entry {eid!r} is in no tier")
            rows.append(WriteRow(
                entry.key_group, eid[0], eid[1], entry.value is None, entry.value,
                None if entry.value is None else json_of(eid[0], entry.value),
                entry.expires_at_ms, None if entry.value is None else self._key_json(eid[1])))
        return rows

    def _key_json(self, ukey: bytes) -> str | None:
        """JSON of the Flink key at the start of `ukey`, remembered (keys recur every epoch)."""
        try:
            return self._key_json_memo[ukey]
        except KeyError:
            found = self._key_json_memo[ukey] = key_json(ukey)
            return found

    def mark_clean(self) -> None:
        """End of a snapshot: every dirty entry is now stored in tier 3."""
        self._dirty.clear()
        self._spill.clear()
        self.epoch_token = uuid.uuid4().int >> 64

    def clear(self) -> None:
        """Forget everything in tiers 1-2 (restore, truncate); the dirty set too."""
        # A fresh LRU: clearing the old one would evict (write back) every entry.
        self._cache = WriteBackLRU(int(self._cache.maxsize), self._evicted)
        self._index.clear()
        self._spill.clear()
        self._dirty.clear()
        if self.local is not None:
            self.local.clear()

    def close(self) -> None:
        self._cache = WriteBackLRU(int(self._cache.maxsize), self._evicted)
        if self.local is not None:
            self.local.destroy()
