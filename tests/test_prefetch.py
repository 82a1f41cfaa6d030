"""restore.mode: background — lazy restore plus a background prefetch into tier 2."""

from __future__ import annotations

import pytest
from pyflink.common import Types
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.testing import LocalSubtask

ANY = Types.PICKLED_BYTE_ARRAY()


def states(t: LocalSubtask):
    return (t.context.get_state(ValueStateDescriptor("v", ANY)),
            t.context.get_map_state(MapStateDescriptor("m", ANY, ANY)))


@pytest.mark.parametrize("store_kind", ["sqlite", "mysql"])
def test_background_prefetch_fills_tier_2_and_then_needs_no_store_reads(
        store_kind, store_factory, local_dir):
    store = store_factory(store_kind)
    options = NdbStateOptions(cache_max_entries=50, restore_mode="background")
    first = LocalSubtask(store, options, local_dir=local_dir)
    value, mapping = states(first)
    model = {}
    for i in range(3_000):
        first.key(i)
        value.update(i * 10)
        mapping.put("a", i)
        model[i] = i * 10
    for i in range(0, 3_000, 3):  # deleted: tombstones must come back as "no value"
        first.key(i)
        value.clear()
        model.pop(i)
    first.checkpoint(1)
    first.crash()

    second = LocalSubtask(store, options, restored_checkpoint_id=1, local_dir=local_dir)
    prefetch = second.backend.prefetch
    assert prefetch is not None
    value, mapping = states(second)
    # Records right away, while the prefetch runs; the task writes keys the prefetch
    # will reach later: the prefetch must not overwrite them with the restored version.
    for i in range(0, 3_000, 7):
        second.key(i)
        assert value.value() == model.get(i)
        value.update(-i)
        model[i] = -i
    assert second.backend.protocol.writer.wait_idle(60)
    assert prefetch.finished and prefetch.done == set(prefetch.key_groups)
    before = second.backend.table.store_reads
    for i in range(3_000):
        second.key(i)
        assert value.value() == model.get(i), i
        assert mapping.get("a") == i
    assert second.backend.table.store_reads == before, "prefetched: no store round trip"
    second.checkpoint(2)
    second.crash()
    third = LocalSubtask(store, NdbStateOptions(), restored_checkpoint_id=2,
                         local_dir=local_dir)
    value, _ = states(third)
    for i in range(3_000):
        third.key(i)
        assert value.value() == model.get(i), i
    third.close()


def test_background_without_tier_2_is_eager(store_factory, local_dir):
    store = store_factory("sqlite")
    options = NdbStateOptions(restore_mode="background", local_enabled=False)
    first = LocalSubtask(store, options, local_dir=local_dir)
    value, _ = states(first)
    first.key("k")
    value.update(1)
    first.checkpoint(1)
    first.crash()
    second = LocalSubtask(store, options, restored_checkpoint_id=1, local_dir=local_dir)
    assert second.backend.prefetch is None
    value, _ = states(second)
    second.key("k")
    assert value.value() == 1
    assert second.backend.table.store_reads == 0, "prefetched at open"
    second.close()


def test_records_are_served_before_the_prefetch_reads_its_first_page(
        store_factory, local_dir, monkeypatch):
    """The first records do not wait for the prefetch (issue 9, item 2): with the
    prefetch's page reads held back, every record after the restore is answered (from
    the store, on demand), the prefetch has not finished meanwhile, and once released it
    finishes without overwriting what the records wrote."""
    import threading

    store = store_factory("sqlite")
    options = NdbStateOptions(cache_max_entries=50, restore_mode="background")
    first = LocalSubtask(store, options, local_dir=local_dir)
    value, _ = states(first)
    for i in range(500):
        first.key(i)
        value.update(i)
    first.checkpoint(1)
    first.crash()

    gate = threading.Event()
    scan = type(store).scan_latest

    def held_back(self, *args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            assert gate.wait(60), "the test never released the prefetch"
        return scan(self, *args, **kwargs)

    monkeypatch.setattr(type(store), "scan_latest", held_back)
    second = LocalSubtask(store, options, restored_checkpoint_id=1, local_dir=local_dir)
    prefetch = second.backend.prefetch
    assert prefetch is not None
    value, _ = states(second)
    for i in range(0, 500, 5):
        second.key(i)
        assert value.value() == i
        value.update(-i)
    assert not prefetch.finished and not prefetch.done
    gate.set()
    assert second.backend.protocol.writer.wait_idle(60)
    assert prefetch.finished
    for i in range(500):
        second.key(i)
        assert value.value() == (-i if i % 5 == 0 else i)
    second.close()
