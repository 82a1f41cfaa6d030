"""Transactions stay within NDB's operation limits, BLOB parts counted
(pyflink_ndb/stores/ndb.py; RonDB is not installable here, so the counts are checked on
the statements that pyflink-ndb really sends)."""

from __future__ import annotations

from typing import Any

from pyflink_ndb.stores.base import CHUNK_BYTES, Fence, WriteRow
from pyflink_ndb.stores.lineage import version_of
from pyflink_ndb.stores.ndb import (
    MAX_OPERATIONS,
    SAFETY_SHARE,
    batch_operations,
    blob_parts,
    max_rows_per_delete,
    row_operations,
)
from pyflink_ndb.stores.sqlite import SqliteStateStore

BOUND = MAX_OPERATIONS * SAFETY_SHARE


def test_blob_parts_and_row_operations():
    assert blob_parts(None, 256, 13_948) == 0
    assert blob_parts(256, 256, 13_948) == 0
    assert blob_parts(257, 256, 13_948) == 1
    assert blob_parts(256 + 2 * 13_948, 256, 13_948) == 2
    assert row_operations(CHUNK_BYTES) == 1 + 19
    assert row_operations(CHUNK_BYTES, CHUNK_BYTES, 2_048) == 1 + 19 + 32


def test_every_write_transaction_stays_within_the_limit(tmp_path):
    store = SqliteStateStore(str(tmp_path / "s.sqlite"), "n")
    store.commit_each_batch = True  # as on MySQL/NDB: one transaction per batch
    store.open()
    fence = Fence("op", 1, 0, 127)
    store.claim(fence, None)
    batches: list[list[Any]] = []
    original = store._executemany

    def capture(text: str, rows: Any) -> None:
        batches.append(list(rows))
        original(text, rows)

    store._executemany = capture  # type: ignore[method-assign]
    small = [WriteRow(i % 128, 1, f"k{i}".encode(), False, b"v" * 8_000, '"' + "j" * 7_000 + '"',
                      None, '"key"') for i in range(2_000)]
    huge = [WriteRow(5, 2, b"huge", False, b"x" * (16 * 1024 * 1024), None, None, None)]
    store.write_versions(fence, version_of(1, 1), small + huge)
    assert len(batches) > 4
    worst = max(batch_operations(b) for b in batches)
    assert worst <= BOUND, worst
    store.close()


def test_deletes_are_limited_to_what_the_largest_rows_allow():
    rows = max_rows_per_delete(CHUNK_BYTES)
    assert rows * row_operations(CHUNK_BYTES, CHUNK_BYTES, 2_048) <= BOUND
    store = SqliteStateStore(":memory:", "n")
    assert store.delete_limit_rows <= rows
