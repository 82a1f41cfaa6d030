"""No round trip that the store cannot answer: a branch that inherited nothing in a key
group (fresh start, truncate) answers misses from tiers 1-2 alone."""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import count_store_reads
from pyflink.common.typeinfo import Types
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.testing import LocalSubtask

ANY = Types.PICKLED_BYTE_ARRAY()


def states(t: LocalSubtask):
    ctx = t.context
    return (ctx.get_state(ValueStateDescriptor("v", ANY)),
            ctx.get_map_state(MapStateDescriptor("m", ANY, ANY)))


def test_fresh_branch_never_reads_the_store_and_restored_one_does(store, local_dir):
    options = NdbStateOptions(cache_max_entries=2)
    t = LocalSubtask(store, options, local_dir=local_dir)
    v, m = states(t)
    for i in range(50):
        t.key(i)
        assert v.value() is None and list(m.items()) == []
        v.update(i)
        m.put("a", i)
    t.checkpoint(1)
    for i in range(50):  # evicted from tier 1 long ago: found in tier 2
        t.key(i)
        assert (v.value(), dict(m.items())) == (i, {"a": i})
    assert t.backend.table.store_reads == 0
    assert t.backend.table.store_reads_saved >= 50

    r = LocalSubtask(store, options, local_dir=local_dir, restored_checkpoint_id=1)
    v, m = states(r)
    for i in range(50):
        r.key(i)
        assert (v.value(), dict(m.items())) == (i, {"a": i})
    assert r.backend.table.store_reads >= 50


def test_without_tier_2_misses_still_read_the_store(store, local_dir):
    options = NdbStateOptions(cache_max_entries=1, local_enabled=False)
    t = LocalSubtask(store, options, local_dir=local_dir)
    v, _ = states(t)
    for i in range(5):
        t.key(i)
        v.update(i)
    t.checkpoint(1)
    for i in range(5):  # clean entries evicted without tier 2 are re-read
        t.key(i)
        assert v.value() == i
    assert t.backend.table.store_reads >= 4


@pytest.mark.parametrize("store_kind", ["sqlite", "mysql"])
def test_a_list_of_many_segments_is_read_in_one_query_after_a_restore(store_kind,
                                                                      store_factory,
                                                                      local_dir,
                                                                      monkeypatch):
    """Issue 9: entries that miss together (a list's segments) cost one round trip."""
    from pyflink.datastream.state import ListStateDescriptor

    from pyflink_ndb.state import list as list_state

    monkeypatch.setattr(list_state, "SMALL_SEGMENT_BYTES", 0)  # a segment per checkpoint

    store = store_factory(store_kind)
    descriptor = ListStateDescriptor("l", ANY)
    first = LocalSubtask(store, NdbStateOptions(), local_dir=local_dir)
    items = first.context.get_list_state(descriptor)
    first.key("k")
    for cid in range(1, 11):  # one segment per checkpoint
        items.add(cid)
        first.checkpoint(cid)
    first.crash()
    second = LocalSubtask(store, NdbStateOptions(), restored_checkpoint_id=10,
                          local_dir=local_dir)
    items = second.context.get_list_state(descriptor)
    second.key("k")
    reads = second.backend.table.store_reads
    assert items.get() == list(range(1, 11))
    assert second.backend.table.store_reads - reads == 2, "the head, then every segment"
    second.close()


def test_an_entry_read_from_tier_2_and_evicted_unchanged_is_not_written_again(
        store, local_dir):
    """Issue 9 (cheaper evictions): tier 2 keeps what it gave tier 1, so evicting that
    entry again writes nothing; a changed entry is written; every value stays right,
    across a checkpoint and a restore."""
    options = NdbStateOptions(cache_max_entries=2)
    t = LocalSubtask(store, options, local_dir=local_dir)
    v = t.context.get_state(ValueStateDescriptor("v", ANY))
    for i in range(20):
        t.key(i)
        v.update(i)
    table = t.backend.table
    first = table.tier2_writes
    assert first == 18, "every entry but the two cached ones went to tier 2"
    for i in range(20):  # read back from tier 2, then evicted unchanged
        t.key(i)
        assert v.value() == i
    assert table.tier2_writes == first + 2, "only the two entries first written in tier 1"
    t.checkpoint(1)
    for i in range(0, 20, 2):  # half of them change: those evictions write
        t.key(i)
        v.update(i * 10)
    for i in range(20):
        t.key(i)
        assert v.value() == (i * 10 if i % 2 == 0 else i)
    t.checkpoint(2)
    t.crash()
    r = LocalSubtask(store, options, local_dir=local_dir, restored_checkpoint_id=2)
    v = r.context.get_state(ValueStateDescriptor("v", ANY))
    for i in range(20):
        r.key(i)
        assert v.value() == (i * 10 if i % 2 == 0 else i)
    r.close()


def _point_reads(reads: Counter[str]) -> int:
    return sum(n for name, n in reads.items() if name != "scan_latest")


@pytest.mark.parametrize("store_kind", ["sqlite", "mysql"])
def test_a_map_iterated_again_after_a_restore_is_answered_by_the_tiers(
        store_kind, store_factory, local_dir, monkeypatch):
    """Issue 9, item 4 (cache hits never cross into the store): after a lazy restore the
    first iteration of a key's map reads the store (in pages) and puts what it read into
    tier 2; iterating that map again, or reading one of its absent entries, costs no
    round trip, and changes made since show. An iteration stopped early leaves the map
    unmarked; without tier 2 every iteration asks the store."""
    from pyflink_ndb.tiers import table as table_module

    monkeypatch.setattr(table_module, "SCAN_PAGE_ROWS", 7)  # several pages per map
    store = store_factory(store_kind)
    descriptor = MapStateDescriptor("m", ANY, ANY)
    options = NdbStateOptions(cache_max_entries=4)
    first = LocalSubtask(store, options, local_dir=local_dir)
    m = first.context.get_map_state(descriptor)
    for k in ("a", "b"):
        first.key(k)
        for i in range(30):
            m.put(i, f"{k}{i}")
    first.checkpoint(1)
    first.crash()

    second = LocalSubtask(store, options, local_dir=local_dir, restored_checkpoint_id=1)
    m = second.context.get_map_state(descriptor)
    reads = count_store_reads(monkeypatch, store)
    second.key("a")
    assert dict(m.items()) == {i: f"a{i}" for i in range(30)}
    assert reads["scan_latest"] == 5, "30 entries in pages of 7: 5 queries"
    m.put(100, "new")
    m.remove(3)
    assert m.get(12345) is None  # absent: the finished scan rules it out
    expected = {i: f"a{i}" for i in range(30) if i != 3} | {100: "new"}
    assert dict(m.items()) == expected and sorted(m.keys()) == sorted(expected)
    assert reads["scan_latest"] == 5, "the second iteration and the absent entry read no store"
    assert _point_reads(reads) == 0, reads

    second.key("b")
    for _ in m.items():
        break  # stopped early: "b" is not marked
    assert dict(m.items()) == {i: f"b{i}" for i in range(30)}
    assert reads["scan_latest"] == 5 + 1 + 5
    assert dict(m.items()) == {i: f"b{i}" for i in range(30)} and reads["scan_latest"] == 11
    second.checkpoint(2)
    second.crash()

    third = LocalSubtask(store, NdbStateOptions(cache_max_entries=4, local_enabled=False),
                         local_dir=local_dir, restored_checkpoint_id=2)
    m = third.context.get_map_state(descriptor)
    third.key("a")
    for _ in range(2):
        assert dict(m.items()) == expected
    assert reads["scan_latest"] == 11 + 2 * 5, "without tier 2 nothing is remembered"
    assert _point_reads(reads) == 0, reads
    third.close()
