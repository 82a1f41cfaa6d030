"""A MapState of 1,000,000 entries for one key: checkpointed, restored lazily into a new
subtask and iterated in full with bounded memory.

The million rows are written straight into the store (in batches, as a checkpoint writes
them) as the version of checkpoint 1 of the branch of a `LocalSubtask` that declares the
map, under the state id, key bytes and key group it uses; that subtask then takes and
completes checkpoint 1. A second `LocalSubtask` (cache of 1,000 entries, empty RocksDB
tier) restores checkpoint 1 and iterates `items()`: each entry must come exactly once with
its value, and the peak of Python allocations during the iteration (tracemalloc) must stay
far below the size of the map (the map itself, as Python objects, would take well over
100 MB).
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

from pyflink.common import Types
from pyflink.datastream.state import MapStateDescriptor

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.serialization.keys import encode_map_key
from pyflink_ndb.serialization.values import encode_value
from pyflink_ndb.stores.base import WriteRow
from pyflink_ndb.stores.factory import open_store
from pyflink_ndb.stores.lineage import version_of
from pyflink_ndb.testing import LocalSubtask

ENTRIES = 1_000_000
CACHE_ENTRIES = 1000
PEAK_LIMIT_BYTES = 100 * 1024 * 1024
OPERATOR = "scale-op"
KEY = "hot-key"


def descriptor() -> MapStateDescriptor:
    return MapStateDescriptor("big", Types.LONG(), Types.LONG())


def test_million_entry_map_restores_and_iterates_in_bounded_memory(tmp_path: Path) -> None:
    options = NdbStateOptions(url=f"sqlite:///{tmp_path / 'state.sqlite'}",
                              namespace="scale", cache_max_entries=CACHE_ENTRIES)
    store = open_store(options)
    try:
        # Declare the map as a job would, and learn where its rows go.
        writer = LocalSubtask(store, options, operator=OPERATOR,
                              local_dir=str(tmp_path / "local-writer"))
        state = writer.context.get_map_state(descriptor())
        writer.key(KEY)
        key_bytes, key_group = writer.backend.require_key()
        state_id = state._state_id
        fence = writer.backend.protocol.fence
        assert fence is not None

        started = time.monotonic()

        def rows() -> Iterator[WriteRow]:
            for i in range(ENTRIES):
                yield WriteRow(key_group, state_id, key_bytes + encode_map_key(i), False,
                               encode_value(3 * i), None, None)

        assert store.write_versions(fence, version_of(fence.branch, 1), rows()) == ENTRIES
        writer.checkpoint(1)
        writer.close()
        write_s = time.monotonic() - started
        owner = store.read_operator(OPERATOR)
        assert owner is not None and owner.committed is not None
        assert owner.committed.checkpoint_id == 1

        reader = LocalSubtask(store, options, operator=OPERATOR, restored_checkpoint_id=1,
                              local_dir=str(tmp_path / "local-reader"))
        restored = reader.context.get_map_state(descriptor())
        reader.key(KEY)
        seen = bytearray(ENTRIES)  # allocated before tracing: 1 MB
        count = 0
        bad_values = 0
        started = time.monotonic()
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            for map_key, value in restored.items():
                if seen[map_key]:
                    raise AssertionError(f"map key {map_key} was yielded twice")
                seen[map_key] = 1
                count += 1
                if value != 3 * map_key:
                    bad_values += 1
            _, peak_bytes = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        iterate_s = time.monotonic() - started
        reader.close()
    finally:
        store.close()

    print(f"\nmap scale: wrote {ENTRIES} rows in {write_s:.1f} s, iterated in "
          f"{iterate_s:.1f} s, peak traced Python memory during iteration "
          f"{peak_bytes / 1024 / 1024:.2f} MB")
    assert count == ENTRIES
    assert seen.count(0) == 0, "some map keys were never yielded"
    assert bad_values == 0
    assert peak_bytes < PEAK_LIMIT_BYTES, f"peak {peak_bytes} bytes during iteration"
