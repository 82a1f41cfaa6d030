"""The tiered table: one subtask's entries across tier 1 (LRU), tier 2 (RocksDB) and
tier 3 (the store), with the set of entries changed since the last snapshot.

An entry is addressed by (state id, ukey) and carries its key group, its value bytes
(None: known to have no value, i.e. deleted or absent: negative caching) and its TTL
expiry. Writes stay in tiers 1-2 and mark the entry dirty. A snapshot's synchronous phase
only :meth:`freezes <TieredTable.freeze>` the dirty set (O(1): a fresh one is swapped in);
the background writer renders the frozen epoch (:meth:`TieredTable.render`, safe on
another thread) and writes it; once it is durable the task thread
:meth:`releases <TieredTable.release>` it, and if the write failed it
:meth:`takes it back <TieredTable.take_back>` into the next epoch. Evicted entries, dirty
or clean, move to tier 2 (a dirty one is then read from a RocksDB snapshot when its epoch
is rendered). Without tier 2, evicted clean entries are dropped, evicted dirty ones wait in
memory, and frozen epochs answer reads until they are durable.
"""

from __future__ import annotations

import heapq
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pyflink_ndb.errors import ValueTooLargeError
from pyflink_ndb.serialization.keys import KeyJsonMemo, entry_prefix, key_json
from pyflink_ndb.stores.base import MAX_UKEY_BYTES, StateStore, StoredVersion, WriteRow
from pyflink_ndb.stores.lineage import Ranges
from pyflink_ndb.tiers.cache import WriteBackLRU
from pyflink_ndb.tiers.handover import ParkedTier
from pyflink_ndb.tiers.key_filter import KeyFilter
from pyflink_ndb.tiers.local import LocalTier, unpack

EntryId = tuple[int, bytes]

#: Rows per page when a prefix scan reads tier 3.
SCAN_PAGE_ROWS = 1000
#: Prefixes remembered as scanned (:attr:`TieredTable.scanned_prefixes`); when full, the
#: set starts again (a prefix forgotten costs its next scan one more round trip).
SCANNED_PREFIXES_MAX = 100_000
#: Bytes an entry is counted for beyond its value (key, tuple, dict slot), for the
#: `write.max-pending-bytes` estimate.
ENTRY_OVERHEAD_BYTES = 120
#: Rows rendered between two GIL yields of the background writer.
RENDER_YIELD_ROWS = 256
#: Epochs whose entries `local.recovery` tracks at most (:meth:`TieredTable.note_epoch`).
TRACKED_EPOCHS_MAX = 16


class Entry(NamedTuple):
    """One entry as the tiers hold it; `value` None means "no value". `in_tier2`: tier 1
    holds it as read from tier 2, which still has this content (its eviction writes
    nothing: only an eviction or a prefetch of an entry that tier 1 does not hold writes
    tier 2). A named tuple, not a frozen dataclass: several are made per record, and a
    tuple is made in half the time."""

    value: bytes | None
    key_group: int
    expires_at_ms: int | None
    in_tier2: bool = False


#: `_new_entry(Entry, (value, key_group, expires_at_ms, in_tier2))` makes an :class:`Entry`
#: without the Python-level `__new__` of a named tuple (a third of the time; the hot paths
#: make several per record).
_new_entry: Any = tuple.__new__


@dataclass(eq=False)
class FrozenEpoch:
    """The dirty set of one snapshot, immutable once frozen.

    `entries` maps each dirty entry to its content as of the freeze; None means that the
    content was evicted to tier 2 before the freeze and is read from `local_view` (a
    RocksDB snapshot taken at the freeze). `spilled`: entries evicted from tier 1 without
    tier 2 (kept here until the epoch is durable, for prefix scans).
    """

    entries: dict[tuple[int, bytes], Entry | None]
    local_view: Any
    approx_bytes: int
    spilled: set[tuple[int, bytes]] = field(default_factory=set)


def _nothing_visible(key_group: int) -> Ranges:
    return ()


def _never(key_group: int) -> bool:
    return False


class TieredTable:
    """Entries of one subtask. Not thread-safe; used only from the subtask's task thread.

    :param store: tier 3 (opened).
    :param cache_max_entries: size of tier 1 (entries, at least 1).
    :param local: tier 2, or None when `local.enabled` is false.
    :param value_max_bytes: `value.max-bytes` (None: no limit).

    `prefix_states` holds the state ids whose ukeys are `encoded Flink key [+ namespace] +
    suffix` (map and list states). Once a state's entries are scanned by prefix (a map's
    iteration, :meth:`scan_prefix`), its cached entries are indexed by that prefix
    (:func:`~pyflink_ndb.serialization.keys.entry_prefix`) so that the next scans need not
    walk the whole cache; a state never scanned (a list, a map only read and written by
    map key) keeps no index, and its entries cost no index upkeep when they enter or leave
    tier 1 (bench part 9: 12% of the task thread's state work on part 7's job).
    """

    def __init__(self, store: StateStore, cache_max_entries: int,
                 local: LocalTier | None, value_max_bytes: int | None = None) -> None:
        self.store = store
        #: Largest value :meth:`put` accepts (None: no limit).
        self.value_max_bytes = value_max_bytes
        #: State names by id, for error messages.
        self.state_names: dict[int, str] = {}
        self.local = local
        self.prefix_states: set[int] = set()
        self._cache = WriteBackLRU(cache_max_entries, self._evicted)
        #: Tier 1's ordered dict (:attr:`WriteBackLRU.data`), for the hot paths.
        self._tier1 = self._cache.data
        #: The current epoch's dirty entries: content, or None when evicted to tier 2.
        self._dirty: dict[EntryId, Entry | None] = {}
        self._dirty_bytes = 0
        self._dirty_in_local = 0
        #: Dirty entries evicted from tier 1 without tier 2 (for prefix scans).
        self._spilled: set[EntryId] = set()
        #: Frozen epochs not yet durable, oldest first (they answer reads meanwhile).
        self._frozen: list[FrozenEpoch] = []
        self._index: dict[tuple[int, bytes], set[bytes]] = {}
        #: The prefix states whose tier-1 entries :attr:`_index` holds (the ones scanned).
        self._indexed: set[int] = set()
        self._prefix_memo: dict[bytes, bytes] = {}
        self._prefix_memo_max = max(4 * cache_max_entries, 10_000)
        #: JSON of the Flink key of a ukey, for the writer thread's rendering.
        self.key_json = KeyJsonMemo(max(cache_max_entries, 100_000))
        self.store_reads = 0
        #: The version ranges the running branch sees in a key group (set by the
        #: checkpoint protocol when it claims the key groups).
        self.visibility: Callable[[int], Ranges] = _nothing_visible
        #: Key groups whose every stored version this attempt holds in tiers 1-2 (its
        #: branch inherited nothing there and tier 2 keeps every evicted entry): a miss
        #: there needs no round trip to the store.
        self.store_has_nothing: Callable[[int], bool] = _never
        #: Bloom filters of the keys the branch inherited (`restore.key-filter`), or None:
        #: a miss the filter rules out needs no round trip either (set by the filter's
        #: build, `checkpoint.key_filter_build`, only with tier 2, for the reason above;
        #: filled in the background).
        self.key_filter: KeyFilter | None = None
        #: (state id, prefix) whose stored entries a finished :meth:`scan_prefix` put
        #: into tier 2 (only with tier 2, which never drops an entry): tiers 1-2 then
        #: know every entry of the prefix, so a later scan of it needs no round trip.
        self.scanned_prefixes: set[tuple[int, bytes]] = set()
        self.store_reads_saved = 0
        #: Point reads the store answered "no value" (a key it does not hold).
        self.absent_reads = 0
        #: Called once (on the task thread) when :attr:`absent_reads` reaches
        #: :attr:`absent_reads_trigger_at`: starts the key filter's build.
        self.on_absent_reads: Callable[[], None] | None = None
        self.absent_reads_trigger_at = 0
        #: Held while tier 2 is written from two threads: the task thread's evictions and
        #: the background prefetch (:meth:`preload_absent`).
        self.local_lock = threading.Lock()
        #: Reads answered by tier 1 / by tier 2 or a frozen epoch (metrics).
        self.tier1_hits = 0
        self.tier2_hits = 0
        #: Evictions that wrote tier 2 (the others left an unchanged copy there).
        self.tier2_writes = 0
        #: Seconds spent in point reads of the store (metrics).
        self.store_read_seconds = 0.0
        #: States whose point reads (:meth:`get`) have asked the store, map and list
        #: states excepted (their entries are not addressed by the key alone): the ones
        #: :meth:`read_ahead` reads ahead.
        self.point_read_states: set[int] = set()
        #: Entries :meth:`read_ahead` asked of the store, and its queries (metrics).
        self.read_ahead_entries = 0
        self.read_ahead_queries = 0
        #: Changes with every snapshot: lets a state tell "written in this epoch" apart.
        self.epoch_token = uuid.uuid4().int >> 64
        #: `local.recovery`: remember which entries each epoch froze since the newest
        #: checkpoint known completed (:meth:`note_epoch`), so that a failed attempt's
        #: tier 2 can be made exact for the checkpoint its next attempt restores
        #: (:meth:`park`, :meth:`adopt`).
        self.track_epochs = False
        #: Per tracked checkpoint id, its frozen entries: the frozen dict while the epoch
        #: is in flight, then its keys only (:meth:`release`: the values are not kept).
        self._epoch_entries: dict[int, dict[EntryId, Entry | None] | frozenset[EntryId]] = {}
        self._epochs_floor = 0

    # -- tier 1 bookkeeping ---------------------------------------------------------------
    def _prefix(self, ukey: bytes) -> bytes:
        """:func:`entry_prefix` of `ukey`, remembered: an entry is indexed when it enters
        tier 1 and again when it leaves, and decoding the key costs more than a lookup."""
        prefix = self._prefix_memo.get(ukey)
        if prefix is None:
            if len(self._prefix_memo) >= self._prefix_memo_max:
                self._prefix_memo.clear()
            prefix = self._prefix_memo[ukey] = entry_prefix(ukey)
        return prefix

    def _index_add(self, eid: EntryId) -> None:
        if eid[0] in self._indexed:
            prefix = self._prefix(eid[1])
            self._index.setdefault((eid[0], prefix), set()).add(eid[1])

    def _index_drop(self, eid: EntryId) -> None:
        if eid[0] in self._indexed:
            prefix = self._prefix(eid[1])
            members = self._index.get((eid[0], prefix))
            if members is not None:
                members.discard(eid[1])
                if not members:
                    del self._index[(eid[0], prefix)]

    def _evicted(self, eid: EntryId, entry: Entry) -> None:
        if eid[0] in self._indexed:
            self._index_drop(eid)
        local = self.local
        if local is not None:
            value, key_group, expires_at_ms, in_tier2 = entry
            if not in_tier2:
                with self.local_lock:
                    local.put(eid[0], eid[1], value, key_group, expires_at_ms)
                self.tier2_writes += 1
            dirty = self._dirty
            if eid in dirty:
                dirty[eid] = None  # the content now lives in tier 2
                self._dirty_in_local += 1
        elif eid in self._dirty:
            self._spilled.add(eid)
        else:
            for frozen in reversed(self._frozen):
                if eid in frozen.entries:
                    frozen.spilled.add(eid)
                    break

    def _cache_put(self, eid: EntryId, entry: Entry) -> None:
        """Put `entry` into tier 1 as its most recently used entry (what
        `self._cache[eid] = entry` does, inlined: this runs for every put and every read
        that tier 1 missed)."""
        tier1 = self._tier1
        if eid in tier1:
            tier1[eid] = entry
            tier1.move_to_end(eid)
            return
        if eid[0] in self._indexed:
            self._index_add(eid)
        maxsize = self._cache.maxsize
        while len(tier1) >= maxsize:  # WriteBackLRU.popitem, inlined
            self._evicted(*tier1.popitem(last=False))
        tier1[eid] = entry

    def _indexed_members(self, state_id: int, prefix: bytes) -> list[bytes]:
        """The ukeys of `state_id` with `prefix` that tier 1 holds, sorted. The state's
        index is built at its first scan, from tier 1's keys (without touching their
        recency), and kept from then on."""
        if state_id not in self.prefix_states:
            return sorted(u for (s, u) in list(self._cache.keys())
                          if s == state_id and u.startswith(prefix))
        if state_id not in self._indexed:
            self._indexed.add(state_id)
            for eid in list(self._cache.keys()):
                if eid[0] == state_id:
                    self._index_add(eid)
        return sorted(self._index.get((state_id, prefix), ()))

    # -- access ---------------------------------------------------------------------------
    def _lower(self, eid: EntryId) -> Entry | None:
        """The entry from tier 2, the current epoch's evicted dirty entries or a frozen
        epoch not yet durable, or None when only the store may know it."""
        dirty = self._dirty.get(eid)
        if dirty is not None:
            return dirty
        if self.local is not None:
            found = self.local.get(eid[0], eid[1])
            if found is not None:
                return _new_entry(Entry, (*found, True))  # in_tier2
            return None  # tier 2 holds whatever tier 1 evicted, frozen epochs' entries too
        for frozen in reversed(self._frozen):
            entry = frozen.entries.get(eid)
            if entry is not None:
                return entry
        return None

    def _from_tiers(self, eid: EntryId, key_group: int) -> Entry | None:
        """The entry as tiers 1-2 (or an epoch in flight) know it, or "no value" where the
        store holds nothing; None when only the store can answer. Counts the hit, and puts
        what the lower tiers answered into tier 1."""
        tier1 = self._tier1
        entry = tier1.get(eid)
        if entry is not None:
            tier1.move_to_end(eid)
            self.tier1_hits += 1
            return entry
        return self._below_tier1(eid, key_group)

    def _below_tier1(self, eid: EntryId, key_group: int) -> Entry | None:
        """:meth:`_from_tiers` for an entry that tier 1 does not hold."""
        entry = self._lower(eid)
        if entry is not None:
            self.tier2_hits += 1
        elif self.store_has_nothing(key_group) or (
                self.scanned_prefixes and eid[0] in self.prefix_states
                and (eid[0], self._prefix(eid[1])) in self.scanned_prefixes) or (
                self.key_filter is not None
                and not self.key_filter.might_hold(key_group, eid[0], eid[1])):
            self.store_reads_saved += 1
            entry = _new_entry(Entry, (None, key_group, None, False))
        else:
            return None
        self._cache_put(eid, entry)
        return entry

    @staticmethod
    def _stored_entry(version: StoredVersion | None, key_group: int) -> Entry:
        """The entry of a stored version (None or a tombstone: "no value")."""
        if version is None or version.tombstone:
            return Entry(None, key_group, None)
        return Entry(version.value, key_group, version.expires_at_ms)

    def get(self, state_id: int, ukey: bytes, key_group: int) -> Entry:
        """The entry, read from the first tier that knows it (cached in tier 1 after)."""
        eid = (state_id, ukey)
        tier1 = self._tier1
        entry = tier1.get(eid)
        if entry is not None:  # _from_tiers inlined: most reads end here
            tier1.move_to_end(eid)
            self.tier1_hits += 1
            return entry
        entry = self._below_tier1(eid, key_group)
        if entry is None:
            self.store_reads += 1
            if state_id not in self.prefix_states:
                self.point_read_states.add(state_id)
            started = time.perf_counter()
            version = self.store.read_latest(state_id, key_group, ukey,
                                             self.visibility(key_group))
            self.store_read_seconds += time.perf_counter() - started
            entry = self._stored_entry(version, key_group)
            self._cache_put(eid, entry)
            if entry.value is None:
                self._count_absent(1)
        return entry

    def _count_absent(self, reads: int) -> None:
        self.absent_reads += reads
        trigger = self.on_absent_reads
        if trigger is not None and self.absent_reads >= self.absent_reads_trigger_at:
            self.on_absent_reads = None
            trigger()

    def get_many(self, state_id: int, ukeys: list[bytes], key_group: int) -> list[Entry]:
        """:meth:`get` of several entries of one key group (in order); the ones no tier
        knows are read from the store in one query."""
        out = [self._from_tiers((state_id, ukey), key_group) for ukey in ukeys]
        missing = [i for i, entry in enumerate(out) if entry is None]
        if missing:
            self.store_reads += 1
            started = time.perf_counter()
            found = self.store.read_latest_many(state_id, key_group,
                                                [ukeys[i] for i in missing],
                                                self.visibility(key_group))
            self.store_read_seconds += time.perf_counter() - started
            absent = 0
            for i in missing:
                entry = self._stored_entry(found.get(ukeys[i]), key_group)
                self._cache_put((state_id, ukeys[i]), entry)
                out[i] = entry
                absent += entry.value is None
            if absent:
                self._count_absent(absent)
        return [e for e in out if e is not None]

    def read_ahead(self, keys: list[tuple[bytes, int]]) -> int:
        """Read ahead the point entries of a bundle of records about to be processed: for
        each state of :attr:`point_read_states` (until a point read has missed: every
        registered state but map and list states, a guess that costs at most one
        query's worth of entries nobody reads) and each (ukey, key group) of `keys`, the
        entries no tier knows and the key filter does not rule out go to the store
        together (:meth:`StateStore.read_latest_batch
        <pyflink_ndb.stores.base.StateStore.read_latest_batch>`, one query per
        `max_or_terms` entries) and into tier 1, so the records' own reads hit tier 1.

        At most half of tier 1 is read ahead (the rest of the bundle reads as usual), so
        the bundle cannot evict what it read ahead. Hits are not counted here: the
        records' reads count them.

        :param keys: the ukeys (encoded key, void namespace) and key groups of the bundle.
        :returns: the entries asked of the store (0: nothing to gain from reading ahead).
        """
        wanted: list[tuple[int, int, bytes]] = []
        room = max(1, self._cache.maxsize // 2)
        seen: set[EntryId] = set()
        states = self.point_read_states or set(self.state_names) - self.prefix_states
        for state_id in states:
            for ukey, key_group in keys:
                eid = (state_id, ukey)
                if eid in seen or eid in self._cache:
                    continue
                seen.add(eid)
                if (self._lower(eid) is None and not self.store_has_nothing(key_group)
                        and (self.key_filter is None
                             or self.key_filter.might_hold(key_group, state_id, ukey))):
                    wanted.append((state_id, key_group, ukey))
                    if len(wanted) >= room:
                        break
            if len(wanted) >= room:
                break
        if not wanted:
            return 0
        started = time.perf_counter()
        found = self.store.read_latest_batch(wanted, self.visibility)
        self.store_read_seconds += time.perf_counter() - started
        step = self.store.max_or_terms
        self.read_ahead_queries += (len(wanted) + step - 1) // step
        self.read_ahead_entries += len(wanted)
        absent = 0
        for state_id, key_group, ukey in wanted:
            entry = self._stored_entry(found.get((state_id, ukey)), key_group)
            self._cache_put((state_id, ukey), entry)
            absent += entry.value is None
        if absent:
            self._count_absent(absent)
        return len(wanted)

    def put(self, state_id: int, ukey: bytes, key_group: int, value: bytes | None,
            expires_at_ms: int | None = None) -> None:
        """Set the entry (value None deletes it) and mark it dirty.

        :raises ValueTooLargeError: the value exceeds `value.max-bytes` or the encoded key
            :data:`MAX_UKEY_BYTES` (raised at the update, where the state and key are
            known; nothing is stored).
        """
        size = ENTRY_OVERHEAD_BYTES + len(ukey)  # check_entry's checks, inlined (per put)
        if value is not None:
            if self.value_max_bytes is not None and len(value) > self.value_max_bytes:
                raise self._too_large(state_id, ukey, value)
            size += len(value)
        if len(ukey) > MAX_UKEY_BYTES:
            raise self._too_large(state_id, ukey, value)
        eid = (state_id, ukey)
        entry = _new_entry(Entry, (value, key_group, expires_at_ms, False))
        tier1 = self._tier1
        if eid in tier1:  # _cache_put inlined for the common case, a rewrite
            tier1[eid] = entry
            tier1.move_to_end(eid)
        else:
            self._cache_put(eid, entry)
        self._dirty[eid] = entry
        self._dirty_bytes += size

    def check_entry(self, state_id: int, ukey: bytes, value: bytes | None) -> None:
        """:raises ValueTooLargeError: :meth:`put` would refuse this entry."""
        if (value is not None and self.value_max_bytes is not None
                and len(value) > self.value_max_bytes) or len(ukey) > MAX_UKEY_BYTES:
            raise self._too_large(state_id, ukey, value)

    def _too_large(self, state_id: int, ukey: bytes, value: bytes | None
                   ) -> ValueTooLargeError:
        state = self.state_names.get(state_id, f"id {state_id}")
        try:
            key = key_json(ukey)
        except Exception:
            key = repr(ukey[:40])
        if len(ukey) > MAX_UKEY_BYTES:
            return ValueTooLargeError(
                f"State {state!r}, key {key}: the encoded key is {len(ukey)} bytes, over the "
                f"limit of {MAX_UKEY_BYTES} bytes (primary-key size of InnoDB/NDB); nothing "
                "was stored. Use a shorter key (or map key).")
        return ValueTooLargeError(
            f"State {state!r}, key {key}: the serialized value is {len(value or b'')} "
            f"bytes, over state.backend.ndb.value.max-bytes={self.value_max_bytes}; nothing "
            "was stored. Store smaller values or raise the limit.")

    def preload(self, state_id: int, ukey: bytes, key_group: int, value: bytes | None,
                expires_at_ms: int | None) -> None:
        """Place a clean copy of a stored entry in tier 2 (tier 1 without tier 2)."""
        if self.local is not None:
            self.local.put(state_id, ukey, value, key_group, expires_at_ms)
        else:
            self._cache_put((state_id, ukey), Entry(value, key_group, expires_at_ms))

    def preload_absent(self, state_id: int, key_group: int,
                       page: list[tuple[bytes, Any]]) -> int:
        """Put the stored versions of `page` ((ukey, StoredVersion) pairs) into tier 2
        where no tier, dirty set or epoch in flight knows the entry; returns the entries
        put. Needs tier 2. Called by the background prefetch (another thread) and by
        :meth:`scan_prefix` for the pages it reads."""
        if self.local is None:
            return 0
        put = 0
        with self.local_lock:
            for ukey, version in page:
                eid = (state_id, ukey)
                if (eid in self._cache or eid in self._dirty
                        or any(eid in f.entries for f in self._frozen)
                        or self.local.get(state_id, ukey) is not None):
                    continue
                self.local.put(state_id, ukey, None if version.tombstone else version.value,
                               key_group, version.expires_at_ms)
                put += 1
        return put

    def scan_prefix(self, state_id: int, key_group: int, prefix: bytes
                    ) -> Iterator[tuple[bytes, Entry]]:
        """Every entry (with or without a value) whose ukey starts with `prefix`, in ukey
        order, each exactly once, current as of the moment it is yielded.

        Memory stays bounded: tier 3 is read in pages of :data:`SCAN_PAGE_ROWS` rows and
        tier 2 through a RocksDB iterator; only tier 1's members of this prefix (at most
        `cache.max-entries`) are held. Entries changed during the scan are yielded with
        their new content; entries added during the scan may or may not be yielded.
        """
        cached = self._indexed_members(state_id, prefix)
        spilled = sorted({u for spill in (self._spilled, *(f.spilled for f in self._frozen))
                          for (s, u) in spill if s == state_id and u.startswith(prefix)})
        local = (u for u, *_ in self.local.iter_prefix(state_id, prefix)) \
            if self.local is not None else iter(())
        remote_versions: dict[bytes, Entry] = {}
        ranges = self.visibility(key_group)

        def remote() -> Iterator[bytes]:
            if self.store_has_nothing(key_group) or (state_id, prefix) in \
                    self.scanned_prefixes or (
                    self.key_filter is not None
                    and not self.key_filter.might_hold_prefix(key_group, state_id, prefix)):
                self.store_reads_saved += 1
                return
            after: bytes | None = None
            while True:
                self.store_reads += 1
                page = self.store.scan_latest(state_id, key_group, prefix, after,
                                              SCAN_PAGE_ROWS, ranges)
                # Into tier 2 before any of it is yielded: a caller that stops early
                # leaves no entry of a page behind, only the prefix unmarked.
                self.preload_absent(state_id, key_group, page)
                for ukey, version in page:
                    remote_versions[ukey] = Entry(
                        None if version.tombstone else version.value, key_group,
                        version.expires_at_ms)
                    yield ukey
                if len(page) < SCAN_PAGE_ROWS:
                    if self.local is not None:
                        if len(self.scanned_prefixes) >= SCANNED_PREFIXES_MAX:
                            self.scanned_prefixes.clear()
                        self.scanned_prefixes.add((state_id, prefix))
                    return
                after = page[-1][0]

        last: bytes | None = None
        for ukey in heapq.merge(iter(cached), iter(spilled), local, remote()):
            if ukey == last:
                continue
            eid = (state_id, ukey)
            entry = self._cache.get(eid) or self._lower(eid)
            if entry is None:
                entry = remote_versions.get(ukey)
                if entry is None:
                    continue  # not `last`: the store's copy of it may come next
            last = ukey
            remote_versions.pop(ukey, None)
            yield ukey, entry

    # -- epochs ---------------------------------------------------------------------------
    @property
    def dirty_count(self) -> int:
        return len(self._dirty)

    @property
    def frozen_count(self) -> int:
        return len(self._frozen)

    def freeze(self) -> FrozenEpoch:
        """End the current epoch (a snapshot's synchronous phase): its dirty set becomes a
        frozen epoch, a fresh one takes the writes that follow. O(1) in the entries."""
        view = None
        if self.local is not None and self._dirty_in_local:
            view = self.local.snapshot_view()
        frozen = FrozenEpoch(self._dirty, view, self._dirty_bytes, self._spilled)
        self._dirty = {}
        self._dirty_bytes = 0
        self._dirty_in_local = 0
        self._spilled = set()
        self._frozen.append(frozen)
        self.epoch_token = uuid.uuid4().int >> 64
        return frozen

    def note_epoch(self, checkpoint_id: int, frozen: FrozenEpoch) -> None:
        """`frozen` is the epoch of checkpoint `checkpoint_id` (with :attr:`track_epochs`
        and tier 2: its entries are remembered until :meth:`forget_epochs_through`; the
        frozen dict itself, O(1), until it is durable). At most
        :data:`TRACKED_EPOCHS_MAX` epochs are tracked: beyond, the oldest is forgotten as
        if it completed (a restore of it or older then reads the store; found by a
        breaker: checkpoints that never complete, or savepoints only, kept every epoch)."""
        if self.track_epochs and self.local is not None:
            self._epoch_entries[checkpoint_id] = frozen.entries
            while len(self._epoch_entries) > TRACKED_EPOCHS_MAX:
                self.forget_epochs_through(min(self._epoch_entries))

    def forget_epochs_through(self, checkpoint_id: int) -> None:
        """Checkpoint `checkpoint_id` completed: a failover restores it or a later one
        (Flink restores its latest completed checkpoint), so the epochs up to it need not
        be told apart any more."""
        if checkpoint_id <= self._epochs_floor:
            return
        self._epochs_floor = checkpoint_id
        for cid in [c for c in self._epoch_entries if c <= checkpoint_id]:
            del self._epoch_entries[cid]

    def park(self, operator: str, kg_start: int, kg_end: int) -> ParkedTier | None:
        """An attempt that ends without a normal close (failure, cancel): hand tier 2
        over for the next attempt (`local.recovery`, :mod:`pyflink_ndb.tiers.handover`)
        instead of destroying it. None without tier 2 or :attr:`track_epochs`.

        Tier 2 holds, for each entry, the latest content that left tier 1, which for an
        entry that tier 1 holds changed (or read from the store) is older than tier 1's,
        which is lost: those entries go with the ones changed since the last freeze
        (:attr:`ParkedTier.after_last`, deleted by :meth:`adopt`, not here: a failed
        task's close delays its next attempt). What changed when is in the tier
        (:attr:`ParkedTier.changed`). Tier 2 is this table's no longer.
        """
        local = self.local
        if local is None or not self.track_epochs:
            return None
        changed = {cid: set(entries) for cid, entries in self._epoch_entries.items()}
        # in_tier2 False: tier 2 holds an older copy, or none
        after_last = set(self._dirty) | {eid for eid, e in self._tier1.items() if not e[3]}
        self.local = None
        self._epoch_entries = {}
        return ParkedTier(local, operator, kg_start, kg_end, changed, after_last,
                          self._epochs_floor)

    def adopt(self, parked: ParkedTier, restored_epoch: int) -> int | None:
        """Take over `parked` as tier 2 for a restore of checkpoint `restored_epoch` of
        the branch that parked it: the entries it changed after that checkpoint are
        deleted from it (reads of them go to the store, as after any restore); every other
        entry it holds has its content at that checkpoint. Returns the entries deleted, or
        None when it cannot serve this restore (an epoch it no longer tracks: the tier is
        destroyed, and this table keeps its own empty tier 2)."""
        if restored_epoch < parked.floor or (restored_epoch != parked.floor
                                              and restored_epoch not in parked.changed):
            parked.local.destroy(wait=False)
            return None
        stale = set(parked.after_last)
        for cid, entries in parked.changed.items():
            if cid > restored_epoch:
                stale |= entries
        for state_id, ukey in stale:
            parked.local.delete(state_id, ukey)
        own = self.local
        self.local = parked.local
        if own is not None:
            own.destroy(wait=False)
        return len(stale)

    def render(self, frozen: FrozenEpoch, json_of: Callable[[int, bytes], str | None] | None,
               between: Callable[[], None] | None = None) -> list[WriteRow]:
        """The rows that write `frozen`, all at once: the list of :meth:`rows_of`."""
        return list(self.rows_of(frozen, json_of, between))

    def rows_of(self, frozen: FrozenEpoch, json_of: Callable[[int, bytes], str | None] | None,
                between: Callable[[], None] | None = None) -> Iterator[WriteRow]:
        """The rows that write `frozen` (a tombstone where an entry has no value), in key
        order, one at a time: the write process writes a slice of them while the writer
        reads the next (:meth:`RenderProcess.write
        <pyflink_ndb.stores.render_process.RenderProcess.write>`). Reads only the frozen
        epoch and its RocksDB snapshot: safe on the background writer's thread while the
        task thread goes on. `json_of(state_id, value)` renders the JSON column (None: the
        rows carry no JSON of the value or the key, which the render process adds);
        `between()` is called every :data:`RENDER_YIELD_ROWS` rows."""
        view = frozen.local_view
        for n, eid in enumerate(sorted(frozen.entries)):
            if between is not None and n % RENDER_YIELD_ROWS == RENDER_YIELD_ROWS - 1:
                between()
            entry = frozen.entries[eid]
            if entry is None:
                if view is None:
                    raise AssertionError(f"frozen entry {eid!r} is in no tier")
                entry = Entry(*unpack(view[LocalTier.key_of(eid[0], eid[1])]))
            if entry.value is None:
                yield WriteRow(entry.key_group, eid[0], eid[1], True, None, None,
                               entry.expires_at_ms, None)
                continue
            ukey = eid[1]
            if json_of is None:
                yield WriteRow(entry.key_group, eid[0], ukey, False, entry.value, None,
                               entry.expires_at_ms, None)
                continue
            yield WriteRow(entry.key_group, eid[0], ukey, False, entry.value,
                           json_of(eid[0], entry.value), entry.expires_at_ms,
                           self.key_json(ukey))

    def release(self, frozen: FrozenEpoch) -> None:
        """`frozen` is durable in the store: it no longer answers reads (and a tracked
        epoch keeps its keys only, not its values: :meth:`note_epoch`)."""
        self._frozen = [f for f in self._frozen if f is not frozen]
        for cid, entries in self._epoch_entries.items():
            if entries is frozen.entries:
                self._epoch_entries[cid] = frozenset(entries)
                break

    def take_back(self, failed: list[FrozenEpoch]) -> int:
        """The writes of `failed` (oldest first) did not become a snapshot: their entries
        go into the current epoch, under what it changed since (newer wins). Returns the
        entries taken back."""
        gone = {id(f) for f in failed}
        self._frozen = [f for f in self._frozen if id(f) not in gone]
        taken = 0
        for frozen in reversed(failed):  # newest first: setdefault keeps the newest
            for eid, entry in frozen.entries.items():
                if eid in self._dirty:
                    continue
                if entry is None:
                    # Evicted to tier 2 before that freeze and not written since: tier 2
                    # still holds this content (only a put replaces it, and a put makes
                    # the entry dirty in a later epoch).
                    self._dirty_in_local += 1
                self._dirty[eid] = entry
                self._dirty_bytes += frozen.approx_bytes // max(len(frozen.entries), 1)
                taken += 1
            self._spilled |= {e for e in frozen.spilled if e in self._dirty}
        return taken

    def clear(self) -> None:
        """Forget everything in tiers 1-2 (restore, truncate); the dirty set too."""
        # A fresh LRU: clearing the old one would evict (write back) every entry.
        self._cache = WriteBackLRU(int(self._cache.maxsize), self._evicted)
        self._tier1 = self._cache.data
        self._index.clear()
        self._spilled = set()
        self._dirty = {}
        self._dirty_bytes = 0
        self._dirty_in_local = 0
        self._frozen = []
        self._epoch_entries = {}
        self._epochs_floor = 0
        self.key_filter = None
        self.scanned_prefixes = set()
        self.on_absent_reads = None
        if self.local is not None:
            self.local.clear()

    def close(self, wait: bool = True) -> None:
        """Drop tier 1 without writing it back, and destroy tier 2 (`wait` False: in a
        thread of its own, see :meth:`LocalTier.destroy`)."""
        self._cache = WriteBackLRU(int(self._cache.maxsize), self._evicted)
        self._tier1 = self._cache.data
        if self.local is not None:
            self.local.destroy(wait)
