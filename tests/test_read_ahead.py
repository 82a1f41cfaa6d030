"""Read-ahead of a bundle (issue 9, item 2: reads of several keys that miss together go as
one multi-row query): `StateStore.read_latest_batch`, `TieredTable.read_ahead` and the
backend call the Java bridge makes before it processes a bundle of records
(`state.backend.ndb.read-ahead.*`). The bridge's buffering itself runs in a Flink
MiniCluster in tests/test_read_ahead_flink.py."""

from __future__ import annotations

import pickle
import random

import pytest
from pyflink.common import Time, Types
from pyflink.datastream.state import (
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)

from pyflink_ndb._pyflink import record_key_reader
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.errors import ConfigurationError
from pyflink_ndb.serialization.keys import encode_key
from pyflink_ndb.stores import base as store_base
from pyflink_ndb.testing import LocalSubtask, local_key_group

ANY = Types.PICKLED_BYTE_ARRAY()


def ttl_value(name: str) -> ValueStateDescriptor:
    descriptor = ValueStateDescriptor(name, ANY)
    descriptor.enable_time_to_live(StateTtlConfig.new_builder(Time.milliseconds(60_000))
                                   .build())
    return descriptor


class _Identity:
    @staticmethod
    def to_internal(value):
        return value


class _KeyedRowConverter:
    """The shape of PyFlink's embedded RowDataConverter of a `(key, value)` row."""
    _field_data_converters = [_Identity(), _Identity()]


class _Operation:
    _input_data_converter = _KeyedRowConverter()


def bundle(keys: list[int]) -> tuple[list[tuple[int, tuple[int, str]]], list[int]]:
    """Records as the bridge hands them to `read_ahead` (the external form of the
    `(key, value)` row: `(row kind, fields)`) and their key groups."""
    return [(0, (k, "record")) for k in keys], [local_key_group(k) for k in keys]


def reading_ahead(subtask: LocalSubtask) -> LocalSubtask:
    """As `attach_operation` makes it on a thread-mode keyed operation."""
    subtask.backend._record_key = record_key_reader(_Operation())
    return subtask


@pytest.mark.parametrize("store_kind", ["sqlite", "mysql"])
def test_read_latest_batch_answers_what_read_latest_answers(store_kind, store_factory,
                                                           local_dir, monkeypatch):
    """Every kind of entry (several versions, a tombstone, TTL, a value over several
    chunks, absent keys, other states and key groups) read in one batch equals the
    point reads, also when the batch is split over several queries."""
    monkeypatch.setattr(store_base, "CHUNK_BYTES", 64)
    store = store_factory(store_kind)
    first = LocalSubtask(store, NdbStateOptions(cache_max_entries=5), local_dir=local_dir)
    v = first.context.get_state(ValueStateDescriptor("v", ANY))
    t = first.context.get_state(ttl_value("t"))
    for cid in range(1, 4):
        for k in range(40):
            first.key(k)
            v.update((k, cid))
            if k % 3 == 0:
                t.update("x" * (k * 10))  # up to 390 bytes: several 64-byte chunks
        if cid == 3:
            first.key(7)
            v.clear()  # a tombstone over the versions of checkpoints 1 and 2
        first.checkpoint(cid)
    first.crash()

    restored = LocalSubtask(store, NdbStateOptions(), local_dir=local_dir,
                            restored_checkpoint_id=3)
    restored.context.get_state(ValueStateDescriptor("v", ANY))
    restored.context.get_state(ttl_value("t"))
    table = restored.backend.table
    ids = {name: sid for sid, name in table.state_names.items()}
    entries = [(ids[name], local_key_group(k), encode_key(k))
               for name in ("v", "t") for k in range(50)]  # 40..49 were never stored
    random.Random(3).shuffle(entries)
    singles = {(sid, ukey): store.read_latest(sid, kg, ukey, table.visibility(kg))
               for sid, kg, ukey in entries}
    store.max_or_terms = 7
    batch = store.read_latest_batch(entries, table.visibility)
    assert batch == {eid: got for eid, got in singles.items() if got is not None}
    assert batch[(ids["v"], encode_key(7))].tombstone
    assert batch[(ids["v"], encode_key(3))].value is not None
    assert len(batch[(ids["t"], encode_key(39))].value) > 64
    assert batch[(ids["t"], encode_key(39))].expires_at_ms is not None
    assert (ids["v"], encode_key(45)) not in batch
    restored.crash()


def _restored_table(store, local_dir):
    """A restored subtask over 40 keys × 3 checkpoints of a ValueState (key 7 deleted in
    the last) and its table; the caller crashes the subtask."""
    first = LocalSubtask(store, NdbStateOptions(), local_dir=local_dir)
    v = first.context.get_state(ValueStateDescriptor("v", ANY))
    for cid in range(1, 4):
        for k in range(40):
            first.key(k)
            v.update((k, cid))
        if cid == 3:
            first.key(7)
            v.clear()
        first.checkpoint(cid)
    first.crash()
    restored = LocalSubtask(store, NdbStateOptions(), local_dir=local_dir,
                            restored_checkpoint_id=2)  # sees checkpoint 2, not 3
    restored.context.get_state(ValueStateDescriptor("v", ANY))
    return restored, restored.backend.table


def test_mysql_batch_join_pads_key_groups_that_see_fewer_ranges(store_factory, local_dir):
    """The MySQL store's join carries each key group's own version ranges: key groups
    with an extra (empty) range, with none at all, and the rest side by side in one
    statement answer what point reads with the same ranges answer."""
    store = store_factory("mysql")
    restored, table = _restored_table(store, local_dir)
    sid = next(iter(table.state_names))

    def ranges_of(kg):
        seen = tuple(table.visibility(kg))
        if kg % 3 == 0:
            return ()  # sees nothing
        return seen + ((10**12, 10**12 + 5),) if kg % 3 == 1 else seen

    entries = [(sid, local_key_group(k), encode_key(k)) for k in range(45)]
    singles = {(s, u): store.read_latest(s, kg, u, ranges_of(kg)) for s, kg, u in entries}
    batch = store.read_latest_batch(entries, ranges_of)
    assert batch == {eid: got for eid, got in singles.items() if got is not None}
    visible = [k for k in range(40) if local_key_group(k) % 3 != 0]
    assert visible and all(pickle.loads(batch[(sid, encode_key(k))].value) == (k, 2)
                           for k in visible), \
        "the newest version checkpoint 2 sees (key 7's tombstone is checkpoint 3's)"
    blind = [k for k in range(40) if local_key_group(k) % 3 == 0]
    assert blind and not any((sid, encode_key(k)) in batch for k in blind), \
        "a key group that sees no range reads nothing"
    restored.crash()


def restore_with_values(store, local_dir, options: NdbStateOptions, n: int = 200):
    first = LocalSubtask(store, NdbStateOptions(), local_dir=local_dir)
    v = first.context.get_state(ValueStateDescriptor("v", ANY))
    m = first.context.get_map_state(MapStateDescriptor("m", ANY, ANY))
    for k in range(n):
        first.key(k)
        v.update(k * 10)
        m.put("a", k)
    first.checkpoint(1)
    first.crash()
    restored = reading_ahead(LocalSubtask(store, options, local_dir=local_dir,
                                          restored_checkpoint_id=1))
    return (restored, restored.context.get_state(ValueStateDescriptor("v", ANY)),
            restored.context.get_map_state(MapStateDescriptor("m", ANY, ANY)))


def test_a_bundle_of_misses_costs_one_query_and_its_records_then_hit_tier_1(store,
                                                                         local_dir):
    restored, v, m = restore_with_values(store, local_dir, NdbStateOptions())
    table = restored.backend.table
    records, groups = bundle(list(range(1, 31)))
    assert restored.backend.read_ahead(records, groups) == 30 + 1, \
        "no point read has missed yet: the first bundle reads its keys of every value state"
    assert (table.read_ahead_queries, table.read_ahead_entries) == (1, 30)
    restored.key(0)
    assert v.value() == 0  # a miss: from now on only the states that missed are read
    reads = table.store_reads
    records, groups = bundle(list(range(1, 61)))
    assert restored.backend.read_ahead(records, groups) == 30 + 1  # read ahead + missed
    assert (table.read_ahead_queries, table.read_ahead_entries) == (2, 60)
    for k in range(1, 61):
        restored.key(k)
        assert v.value() == k * 10
    assert table.store_reads == reads, "the bundle's records found their values in tier 1"
    assert dict(m.items()) == {"a": 60}, "map states are not read ahead, still exact"
    restored.key(150)
    assert m.get("a") == 150
    assert table.point_read_states == {v._state_id}, \
        "a map entry is not addressed by the key alone: never read ahead"
    assert restored.backend.read_ahead(records, groups) == 2, \
        "all cached now: only the two map reads since the last bundle are reported"
    assert restored.backend.read_ahead(records, groups) == 0
    assert table.read_ahead_queries == 2
    restored.crash()


def test_read_ahead_never_overrides_newer_versions_of_this_attempt(store, local_dir):
    """An entry written after the restore (dirty, evicted to tier 2, or in a frozen epoch
    not yet durable) is not read ahead: the store's older version must not shadow it."""
    restored, v, _ = restore_with_values(store, local_dir, NdbStateOptions(cache_max_entries=4))
    restored.key(0)
    assert v.value() == 0
    for k in (1, 2, 3):
        restored.key(k)
        v.update(-k)
    restored.snapshot(2, durable=False)  # 1-3 frozen, maybe not yet written
    restored.key(4)
    v.update(-4)  # 4 dirty in the current epoch
    for k in range(100, 110):  # evict 1-4 from tier 1
        restored.key(k)
        v.value()
    restored.backend.read_ahead(*bundle([1, 2, 3, 4, 5]))
    for k in (1, 2, 3, 4):
        restored.key(k)
        assert v.value() == -k
    restored.key(5)
    assert v.value() == 50
    restored.crash()


def test_read_ahead_fills_at_most_half_of_tier_1(store, local_dir):
    restored, v, _ = restore_with_values(store, local_dir, NdbStateOptions(cache_max_entries=20))
    restored.backend.read_ahead(*bundle(list(range(1, 101))))
    assert restored.backend.table.read_ahead_entries == 10
    for k in range(1, 101):  # the rest reads as usual
        restored.key(k)
        assert v.value() == k * 10
    restored.crash()


def test_a_fresh_start_reads_nothing_ahead(store, local_dir):
    fresh = reading_ahead(LocalSubtask(store, NdbStateOptions(), local_dir=local_dir))
    v = fresh.context.get_state(ValueStateDescriptor("v", ANY))
    for k in range(10):
        fresh.key(k)
        assert v.value() is None
    fresh.backend.read_ahead(*bundle(list(range(10, 60))))  # the first one keeps trying
    assert fresh.backend.read_ahead(*bundle(list(range(10, 60)))) == 0, \
        "nothing inherited: the store cannot hold these keys"
    assert fresh.backend.table.read_ahead_queries == 0
    fresh.crash()


def test_the_bundle_teaches_the_key_groups(store, local_dir):
    """The bridge hands each record's key group: no call into Java for it later."""
    restored, v, _ = restore_with_values(store, local_dir, NdbStateOptions())
    asked = []
    oracle = restored.backend._key_groups
    original = oracle.currentKeyGroup
    oracle.currentKeyGroup = lambda: asked.append(1) or original()
    restored.backend.read_ahead(*bundle([11, 12]))
    restored.key(11)
    restored.key(12)
    assert restored.backend.current_key_group == local_key_group(12)
    assert asked == []
    restored.crash()


def test_settings_for_the_bridge(store, local_dir):
    t = LocalSubtask(store, NdbStateOptions(read_ahead_records=64, read_ahead_max_wait_ms=3),
                     local_dir=local_dir)
    # [read-ahead records, wait, bundle records, wait]: bundles need a record context
    # that answers for them (tests/test_bundle.py).
    assert t.backend.read_ahead_settings() == [0, 3, 0, 5], "no operation to read keys with"
    assert t.backend.read_ahead(*bundle([1, 2])) == 0
    reading_ahead(t)
    assert t.backend.read_ahead_settings() == [64, 3, 0, 5]
    t.crash()


@pytest.mark.parametrize(("key", "raw", "says"), [
    ("read-ahead.records", "-1", "at least 0"),
    ("read-ahead.max-wait-ms", "0", "at least 1"),
])
def test_bad_read_ahead_options_are_refused(key, raw, says):
    from pyflink_ndb.config import from_flink_keys

    with pytest.raises(ConfigurationError, match=says):
        from_flink_keys({f"state.backend.ndb.{key}": raw})
