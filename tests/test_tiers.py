"""Tier 1 (LRU with write-back), tier 2 (RocksDB) and the tiered table on a real store."""

from __future__ import annotations

from pyflink.common.typeinfo import Types
from pyflink.datastream.state import ValueStateDescriptor

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.serialization.keys import encode_key
from pyflink_ndb.stores.base import Fence, StateStore, WriteRow
from pyflink_ndb.stores.factory import open_store
from pyflink_ndb.stores.lineage import Ranges, fresh_lineage, own_range, version_of
from pyflink_ndb.tiers.cache import WriteBackLRU
from pyflink_ndb.tiers.local import LocalTier
from pyflink_ndb.tiers.table import TieredTable


def test_lru_hands_evicted_entries_to_the_callback():
    evicted = []
    cache = WriteBackLRU(2, lambda k, v: evicted.append((k, v)))
    cache["a"] = 1
    cache["b"] = 2
    assert cache["a"] == 1  # "a" becomes the most recently used
    cache["c"] = 3
    assert evicted == [("b", 2)]
    assert set(cache) == {"a", "c"}


def test_lru_recency_rules():
    """get() and [] count as uses; `in`, keys() and a rewrite of a held key evict nothing
    and only the rewrite counts as a use; the entry being inserted is never evicted."""
    evicted = []
    cache = WriteBackLRU(3, lambda k, v: evicted.append(k))
    for key in "abc":
        cache[key] = key.upper()
    assert cache.get("a") == "A"  # order now b, c, a
    assert "b" in cache and list(cache.keys()) == ["b", "c", "a"]  # no use
    assert cache.get("missing") is None and cache.get("missing", 0) == 0
    cache["b"] = "B2"  # a held key: no eviction, becomes the most recent
    assert evicted == [] and len(cache) == 3
    cache["d"] = "D"
    assert evicted == ["c"]
    assert cache["a"] == "A"
    cache["e"] = "E"
    assert evicted == ["c", "b"]
    assert list(cache) == ["d", "a", "e"]
    one = WriteBackLRU(1, lambda k, v: evicted.append(k))
    one["x"] = 1
    one["y"] = 2
    assert evicted[-1] == "x" and list(one) == ["y"]


def test_local_tier_round_trip_prefix_scan_and_empty_on_open(tmp_path):
    path = str(tmp_path / "rocks")
    local = LocalTier(path)
    local.put(7, b"k1", b"v1", 3, None)
    local.put(7, b"k2", None, 3, 99)
    local.put(7, b"j", b"other", 4, None)
    local.put(8, b"k3", b"other state", 5, None)
    assert local.get(7, b"k1") == (b"v1", 3, None)
    assert local.get(7, b"k2") == (None, 3, 99)
    assert [u for u, *_ in local.iter_prefix(7, b"k")] == [b"k1", b"k2"]
    local.close()
    reopened = LocalTier(path)
    assert reopened.get(7, b"k1") is None
    reopened.destroy()


def stored_branch(store: StateStore, rows: list[WriteRow]) -> Ranges:
    """Write `rows` as epoch 1 of a new branch; returns what that branch reads."""
    lineage = fresh_lineage(0, 0, 127).to_json()
    fence = Fence("op", store.allocate_branch("op", 0, 127, lineage, {"kind": "test"}, "job",
                                              0, 0), 0, 127)
    store.claim(fence, None)
    store.write_versions(fence, version_of(fence.branch, 1), rows)
    return (own_range(fence.branch),)


def test_table_reads_through_tiers_and_tracks_dirty_entries(tmp_path):
    store = open_store(NdbStateOptions(url=f"sqlite:///{tmp_path}/s.sqlite", namespace="t"))
    ranges = stored_branch(store, [WriteRow(5, 1, b"stored", False, b"from-db", None, None)])
    blind = TieredTable(store, 1, None)
    assert blind.get(1, b"stored", 5).value is None, "a table sees no range until claimed"
    blind.close()
    table = TieredTable(store, 1, LocalTier(str(tmp_path / "rocks")))
    table.visibility = lambda key_group: ranges
    assert table.get(1, b"stored", 5).value == b"from-db"
    assert table.store_reads == 1
    table.put(1, b"new", 5, b"v")          # evicts "stored" into RocksDB
    table.put(1, b"gone", 5, None)         # a tombstone, evicts "new" (still dirty)
    assert table.get(1, b"stored", 5).value == b"from-db"
    assert table.store_reads == 1, "tier 2 answered, the store was not asked again"
    frozen = table.freeze()
    assert table.dirty_count == 0
    table.put(1, b"new", 5, b"after the freeze")  # evicts "gone": tier 2 changes ...
    table.put(1, b"other", 5, b"x")               # ... and "new" again
    rows = {r.ukey: r for r in table.render(frozen, lambda sid, v: None)}
    assert set(rows) == {b"new", b"gone"}
    assert rows[b"new"].value == b"v", "rendered as of the freeze (RocksDB snapshot)"
    assert rows[b"gone"].tombstone
    table.close()
    store.close()


def test_table_without_local_tier_keeps_evicted_dirty_entries(tmp_path):
    store = open_store(NdbStateOptions(url=f"sqlite:///{tmp_path}/s.sqlite", namespace="t"))
    table = TieredTable(store, 1, None)
    table.put(1, b"a", 0, b"1")
    table.put(1, b"b", 0, b"2")  # evicts the dirty "a": it must not be lost
    assert table.get(1, b"a", 0).value == b"1"
    frozen = table.freeze()
    table.put(1, b"c", 0, b"3")  # evicts "a" and "b", which only the frozen epoch holds
    assert table.get(1, b"a", 0).value == b"1", "a frozen epoch answers until durable"
    assert [u for u, _ in table.scan_prefix(1, 0, b"")] == [b"a", b"b", b"c"]
    assert {r.ukey for r in table.render(frozen, lambda sid, v: None)} == {b"a", b"b"}
    table.release(frozen)
    assert table.get(1, b"b", 0).value is None, "released: only the store could answer"
    table.close()
    store.close()


def test_a_prefix_states_index_is_built_at_its_first_scan_and_kept_after(tmp_path):
    """Tier 1 indexes a prefix state's entries only once the state is scanned (a map's
    iteration): a state never scanned costs no index upkeep, and the first scan, built from
    tier 1's keys, sees the same entries as later scans kept up to date."""
    store = open_store(NdbStateOptions(url=f"sqlite:///{tmp_path}/s.sqlite", namespace="t"))
    table = TieredTable(store, 4, LocalTier(str(tmp_path / "rocks")))
    table.prefix_states.update({1, 2})

    def ukey(user: str, map_key: str) -> bytes:
        return encode_key(user) + encode_key(map_key)

    def scan(state_id: int, user: str) -> list[bytes]:
        return [u for u, e in table.scan_prefix(state_id, 0, encode_key(user))
                if e.value is not None]
    for state_id in (1, 2):
        for map_key in ("a", "b", "c"):
            table.put(state_id, ukey("u", map_key), 0, map_key.encode())
    assert table._index == {}, "no state scanned yet: nothing indexed"
    assert scan(1, "u") == [ukey("u", k) for k in "abc"]  # tiers 1 and 2 together
    table.put(1, ukey("u", "d"), 0, b"d")   # indexed on entry ...
    table.put(1, ukey("v", "a"), 0, b"va")
    table.put(1, ukey("u", "a"), 0, None)   # ... and a deletion seen by the next scan
    assert scan(1, "u") == [ukey("u", k) for k in "bcd"]
    assert scan(1, "v") == [ukey("v", "a")]
    assert {s for s, _ in table._index} == {1}, "state 2 was never scanned"
    assert scan(2, "u") == [ukey("u", k) for k in "abc"]
    table.close()
    store.close()


def test_closing_a_subtask_leaves_tier_2_cleanup_to_a_thread_of_its_own(tmp_path):
    """A cancelled task's close must not wait for tier 2's RocksDB to flush its memtable
    and for its folder to be deleted: Flink deploys the next attempt only once the
    cancelled one is closed (137 ms at 100,000 entries of 1 KB before this change)."""
    import threading

    from pyflink_ndb.testing import LocalSubtask

    store = open_store(NdbStateOptions(url=f"sqlite:///{tmp_path / 'db.sqlite'}"))
    # (with local.recovery a cancelled attempt's tier 2 waits for the next attempt)
    subtask = LocalSubtask(store, NdbStateOptions(local_recovery=False),
                           local_dir=str(tmp_path / "local"))
    counter = subtask.context.get_state(ValueStateDescriptor("n", Types.LONG()))
    for key in range(50):
        subtask.key(key)
        counter.update(key)
    local = subtask.backend.table.local
    assert local is not None and local.path.exists()
    release = threading.Event()
    rocksdb = local._db

    class SlowClose:
        """Tier 2's RocksDB, whose close waits until the test releases it."""

        def close(self) -> None:
            assert release.wait(30)
            rocksdb.close()

    local._db = SlowClose()
    closer = threading.Thread(target=subtask.backend.close)
    closer.start()
    closer.join(10)
    assert not closer.is_alive(), "the close waited for tier 2's RocksDB"
    assert local.path.exists()
    release.set()
    cleanups = [t for t in threading.enumerate() if t.name.startswith("pyflink-ndb-tier2")]
    for thread in cleanups:
        thread.join(30)
    assert not local.path.exists()
    store.close()


def test_encode_key_memo_keeps_key_identity_and_is_bounded(monkeypatch):
    """encode_key remembers exact int and str keys only: after 1 is remembered, True, 1.0
    and the str "1" still encode as keys of their own; the memo empties when full, and
    every answer equals a fresh encoding."""
    from pyflink_ndb.serialization import keys

    monkeypatch.setattr(keys, "KEY_MEMO_ENTRIES", 3)
    monkeypatch.setattr(keys, "_KEY_MEMO", {})
    # pairs, not a dict: 1, True and 1.0 are one dict key
    fresh = [(k, bytes(keys._encode_to(k)))
             for k in (1, True, 1.0, "1", 0, False, -0.0, 0.0, 2**70)]
    assert len({want for _, want in fresh}) == len(fresh)
    for _ in range(2):
        for k, want in fresh:
            assert encode_key(k) == want, k
            assert keys.encode_map_key(k) == want, k
    assert set(map(type, keys._KEY_MEMO)) <= {int, str}
    assert all(type(k) is not bool for k in keys._KEY_MEMO)
    assert len(keys._KEY_MEMO) <= 3
    long_text = "x" * (keys.KEY_MEMO_MAX_CHARS + 1)
    assert encode_key(long_text) == bytes(keys._encode_to(long_text))
    assert long_text not in keys._KEY_MEMO


def test_local_tier_get_before_and_after_the_first_put(tmp_path):
    """A tier 2 never written answers every get with None without asking RocksDB; the
    first put (of a value or of "no value") makes gets ask it, and a clear empties it."""
    local = LocalTier(str(tmp_path / "rocks"))
    assert local.get(7, b"k") is None
    local.put(7, b"absent", None, 2, None)
    assert local.get(7, b"absent") == (None, 2, None)
    local.put(7, b"k", b"v" * 300, 3, 1234)
    assert local.get(7, b"k") == (b"v" * 300, 3, 1234)
    assert local.get(8, b"k") is None
    local.clear()
    assert local.get(7, b"k") is None
    local.put(7, b"k", b"again", 4, None)
    assert local.get(7, b"k") == (b"again", 4, None)
    local.destroy()


def test_local_tier_answers_hits_and_misses_from_flushed_files(tmp_path):
    """Tier 2's table files carry Bloom filters: after a flush every key put is still
    found (no false negatives) and keys never put are not."""
    local = LocalTier(str(tmp_path / "rocks"))
    for i in range(2000):
        local.put(3, encode_key(i), b"v%d" % i, i % 64, None)
    local._db.flush()
    for i in range(2000):
        local.put(4, encode_key(i), None, 1, 5)  # a second file, another state
    local._db.flush()
    assert all(local.get(3, encode_key(i)) == (b"v%d" % i, i % 64, None) for i in range(2000))
    assert all(local.get(4, encode_key(i)) == (None, 1, 5) for i in range(2000))
    assert all(local.get(3, encode_key(i)) is None for i in range(2000, 4000))
    assert [u for u, *_ in local.iter_prefix(3, b"")][:3] == sorted(
        encode_key(i) for i in range(2000))[:3]
    local.destroy()
