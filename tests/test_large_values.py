"""Values of 16 MiB go through every tier and a checkpoint-and-restore byte-identically;
a value over `value.max-bytes` fails the snapshot before anything is written."""

from __future__ import annotations

import random

import pytest
from pyflink.common import Types
from pyflink.datastream.state import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.errors import ValueTooLargeError
from pyflink_ndb.testing import LocalSubtask

BIG = random.Random(7).randbytes(16 * 1024 * 1024)


def test_16_mib_values_round_trip_through_a_restore(store, tmp_path):
    options = NdbStateOptions(cache_max_entries=1)
    first = LocalSubtask(store, options, local_dir=str(tmp_path / "a"))
    value = first.context.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
    blobs = first.context.get_map_state(
        MapStateDescriptor("m", Types.STRING(), Types.PICKLED_BYTE_ARRAY()))
    first.key("big")
    value.update(BIG)
    blobs.put("text", BIG.hex()[: 8 * 1024 * 1024])
    first.key("other")  # evicts "big" through RocksDB
    value.update(b"")
    first.checkpoint(1)
    first.crash()
    restored = LocalSubtask(store, options, restored_checkpoint_id=1,
                            local_dir=str(tmp_path / "b"))
    value = restored.context.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
    blobs = restored.context.get_map_state(
        MapStateDescriptor("m", Types.STRING(), Types.PICKLED_BYTE_ARRAY()))
    restored.key("big")
    assert value.value() == BIG
    assert blobs.get("text") == BIG.hex()[: 8 * 1024 * 1024]
    restored.key("other")
    assert value.value() == b""
    restored.close()


def test_a_value_over_the_limit_fails_the_update_and_stores_nothing(store, tmp_path):
    options = NdbStateOptions(value_max_bytes=1024 * 1024)
    subtask = LocalSubtask(store, options, local_dir=str(tmp_path / "a"))
    items = subtask.context.get_list_state(ListStateDescriptor("l", Types.PICKLED_BYTE_ARRAY()))
    subtask.key("k")
    items.add(b"small")
    subtask.checkpoint(1)
    rows = store.count_rows()
    with pytest.raises(ValueTooLargeError, match="State 'l'.*value.max-bytes"):
        items.add(b"x" * (2 * 1024 * 1024))
    assert items.get() == [b"small"]
    subtask.checkpoint(2)
    assert store.count_rows() == rows
    subtask.crash()
    restored = LocalSubtask(store, options, restored_checkpoint_id=1,
                            local_dir=str(tmp_path / "b"))
    items = restored.context.get_list_state(ListStateDescriptor("l", Types.PICKLED_BYTE_ARRAY()))
    restored.key("k")
    assert items.get() == [b"small"]
    restored.close()
