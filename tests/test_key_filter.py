"""restore.key-filter: after a lazy restore, misses of keys the restored snapshot never held
need no database round trip once the key group's Bloom filter is built (issue 9, item 1;
docs/protocol.md, "Misses the store cannot answer")."""

from __future__ import annotations

import os
import random

import pytest
from pyflink.common import Types
from pyflink.datastream.state import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)

from pyflink_ndb.checkpoint.key_filter_build import START_AFTER_ABSENT_READS
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.testing import LocalSubtask
from pyflink_ndb.tiers.key_filter import FALSE_POSITIVE_RATE, KeyFilter, entry_member

ANY = Types.PICKLED_BYTE_ARRAY()


def states(t: LocalSubtask):
    return (t.context.get_state(ValueStateDescriptor("v", ANY)),
            t.context.get_map_state(MapStateDescriptor("m", ANY, ANY)),
            t.context.get_list_state(ListStateDescriptor("l", ANY)))


def test_filter_rules_out_absent_keys_at_about_its_false_positive_rate():
    rng = random.Random(5)
    present = [rng.randbytes(rng.randint(3, 40)) for _ in range(20_000)]
    key_filter = KeyFilter([7], [])
    key_filter.add_key_group(3, [hash(entry_member(7, u)) for u in present])
    assert all(key_filter.might_hold(3, 7, u) for u in present), "no false negative"
    absent = [os.urandom(24) for _ in range(20_000)]
    passed = sum(key_filter.might_hold(3, 7, u) for u in absent)
    assert passed / len(absent) < 2 * FALSE_POSITIVE_RATE
    assert key_filter.ruled_out == len(absent) - passed
    # Unknown key groups and states are never ruled out (the store is asked).
    assert key_filter.might_hold(4, 7, absent[0])
    assert key_filter.might_hold(3, 8, absent[0])
    assert key_filter.might_hold_prefix(3, 7, absent[0]), "state 7 has no prefixes"
    assert 9 <= key_filter.size_bytes * 8 / len(present) <= 11


def _build(store, options, local_dir, n):
    first = LocalSubtask(store, options, local_dir=local_dir)
    value, mapping, listing = states(first)
    for i in range(n):
        first.key(i)
        value.update(i)
        mapping.put("a", i)
        listing.add(i)
    for i in range(0, n, 5):  # a tombstone is a stored version: the filter keeps it
        first.key(i)
        value.clear()
    first.checkpoint(1)
    first.crash()


@pytest.mark.parametrize("store_kind", ["sqlite", "mysql"])
def test_new_keys_after_a_restore_cost_no_round_trip(store_kind, store_factory, local_dir):
    store = store_factory(store_kind)
    options = NdbStateOptions(cache_max_entries=100)
    n = 2_000
    _build(store, options, local_dir, n)

    second = LocalSubtask(store, options, restored_checkpoint_id=1, local_dir=local_dir)
    build = second.backend.key_filter_build
    assert build is not None
    value, mapping, listing = states(second)
    # Records at once; reads of stored keys do not start the build (a recovery that meets
    # only stored keys never pays for its scan) ...
    for i in range(1, n, 7):
        second.key(i)
        assert mapping.get("a") == i and listing.get() == [i]
    assert not build.started and second.backend.table.key_filter is None
    # ... reads of keys the store does not hold do, after START_AFTER_ABSENT_READS.
    reads = second.backend.table.store_reads
    for i in range(n, n + START_AFTER_ABSENT_READS):
        second.key(i)
        assert value.value() is None
    assert build.started
    assert second.backend.table.store_reads - reads == START_AFTER_ABSENT_READS
    for i in range(1, n, 97):  # inherited keys read right while the filter builds
        second.key(i)
        assert value.value() == (None if i % 5 == 0 else i)
    assert second.backend.protocol.writer.wait_idle(60)
    assert build.finished and build.done == set(build.key_groups) == set(range(128))
    table = second.backend.table
    assert table.key_filter is build.filter and build.filter.key_groups == 128

    reads = table.store_reads
    new_keys = range(n + START_AFTER_ABSENT_READS, n + 3_000)
    for i in new_keys:  # never stored: value, map entry, map iteration, list
        second.key(i)
        assert value.value() is None
        assert mapping.get("a") is None
        assert list(mapping.items()) == []
        assert listing.get() == []
    extra = table.store_reads - reads
    # Four reads per key without the filter; a false positive costs one.
    assert extra <= 4 * len(new_keys) * 3 * FALSE_POSITIVE_RATE, extra
    assert build.filter.ruled_out >= 4 * len(new_keys) * 0.95

    # Inherited keys are never ruled out (tombstones included), and this attempt's own
    # writes to new keys read back after they were evicted to tier 2.
    for i in range(n):
        second.key(i)
        assert value.value() == (None if i % 5 == 0 else i), i
        assert mapping.get("a") == i and dict(mapping.items()) == {"a": i}
        assert listing.get() == [i]
    written = range(n, n + 3_000)
    for i in written:
        second.key(i)
        value.update(-i)
        listing.add(-i)
    for i in written:
        second.key(i)
        assert value.value() == -i and listing.get() == [-i]
    second.checkpoint(2)
    second.crash()

    third = LocalSubtask(store, NdbStateOptions(restore_key_filter=False),
                         restored_checkpoint_id=2, local_dir=local_dir)
    assert third.backend.key_filter_build is None
    value, mapping, listing = states(third)
    for i in range(n + 3_000):
        third.key(i)
        expected = (None if i % 5 == 0 else i) if i < n else -i
        assert value.value() == expected, i
    third.close()


def test_no_filter_without_tier_2_or_on_a_fresh_start(store_factory, local_dir):
    store = store_factory("sqlite")
    fresh = LocalSubtask(store, NdbStateOptions(), local_dir=local_dir)
    assert fresh.backend.key_filter_build is None, "nothing inherited: no filter"
    value, _, _ = states(fresh)
    fresh.key("k")
    value.update(1)
    fresh.checkpoint(1)
    fresh.crash()
    no_tier2 = LocalSubtask(store, NdbStateOptions(local_enabled=False),
                            restored_checkpoint_id=1, local_dir=local_dir)
    assert no_tier2.backend.key_filter_build is None
    assert no_tier2.backend.table.key_filter is None
    no_tier2.crash()
    background = LocalSubtask(store, NdbStateOptions(restore_mode="background"),
                              restored_checkpoint_id=1, local_dir=local_dir)
    assert background.backend.key_filter_build is None
    background.close()
