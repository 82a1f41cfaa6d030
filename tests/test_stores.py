"""The store contract (tier 3), run on SQLite and on the MySQL-protocol server: versions
read through ranges, fenced writes, snapshot rows, the owner row, readers, deletes,
branches, the catalog and the format check."""

from __future__ import annotations

import itertools
import json
import random
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pymysql
import pytest
from conftest import mysql_connect, unique_namespace
from hypothesis import given, settings
from hypothesis import strategies as st
from pyflink.common.typeinfo import Types
from pyflink.datastream.state import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor

from pyflink_ndb.checkpoint.gc import Deletion
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.errors import (
    CheckpointError,
    FencedError,
    StateCompatibilityError,
    StoreUnavailableError,
)
from pyflink_ndb.serialization import encode_key, encode_value, value_json
from pyflink_ndb.serialization.keys import encode_map_key
from pyflink_ndb.stores import StateStore, StoredVersion, WriteRow, open_store
from pyflink_ndb.stores.base import (
    CHUNK_BYTES,
    COMPLETED,
    FORMAT_VERSION,
    KIND_CHECKPOINT,
    KIND_FINAL,
    KIND_SAVEPOINT,
    MAX_BATCH_BYTES,
    PENDING,
    Fence,
)
from pyflink_ndb.stores.lineage import (
    Descriptor,
    Lineage,
    Ranges,
    Token,
    fresh_lineage,
    lineage_from_tokens,
    own_range,
    version_of,
)
from pyflink_ndb.testing import LocalSubtask

OP = "op"
SID = 7
OTHER_SID = 8
KG = 3
KG_END = 127

#: Byte and text values that trip drivers, collations and JSON columns.
EDGE_VALUES: list[Any] = [
    b"", "", "\x00abc", b"\xff\xfe", b"\x00", "😀", "e\u0301", "\u00e9", "\U0001d11e",
    "a\U0001f468\u200d\U0001f469\u200d\U0001f467b", "\ufeff", "'\"\\;--", b"\\'\"",
]


def row(ukey: bytes, value: bytes | None, *, kg: int = KG, sid: int = SID,
        expires: int | None = None, value_json: str | None = None) -> WriteRow:
    return WriteRow(kg, sid, ukey, value is None, value, value_json, expires)


def branch(store: StateStore, operator: str = OP, kg_start: int = 0, kg_end: int = KG_END,
           lineage: Lineage | None = None, claim: bool = True) -> Fence:
    """A new branch (fresh unless `lineage` is given) that claims its key groups."""
    lineage = lineage or fresh_lineage(0, kg_start, kg_end)
    bid = store.allocate_branch(operator, kg_start, kg_end, lineage.to_json(),
                                {"kind": "test"}, "job", 0, 0)
    fence = Fence(operator, bid, kg_start, kg_end)
    if claim:
        store.claim(fence, None)
    return fence


def child_of(parent: Fence, epoch: int) -> Lineage:
    """The lineage of a branch restored from snapshot (parent, epoch) of a fresh parent."""
    return lineage_from_tokens(0, parent.kg_start, parent.kg_end,
                               [Token(parent.branch, epoch, parent.kg_start, parent.kg_end)],
                               {parent.branch: fresh_lineage(parent.branch, parent.kg_start,
                                                             parent.kg_end)})


def head(fence: Fence) -> Ranges:
    """What a fresh branch's running attempt reads."""
    return (own_range(fence.branch),)


def write(store: StateStore, fence: Fence, epoch: int, rows: list[WriteRow]) -> int:
    return store.write_versions(fence, version_of(fence.branch, epoch), rows)


def checkpoint(store: StateStore, fence: Fence, epoch: int) -> Descriptor | None:
    """Record, complete and (when every owner has it) commit snapshot `epoch`."""
    store.insert_snapshot(fence, epoch, KIND_CHECKPOINT, "job")
    store.mark_completed(fence.operator, [(fence.branch, epoch)], fence)
    return store.advance_committed(fence, epoch)


def latest(store: StateStore, ukey: bytes, ranges: Ranges, kg: int = KG,
           sid: int = SID) -> StoredVersion | None:
    return store.read_latest(sid, kg, ukey, ranges)


def latest_value(store: StateStore, ukey: bytes, ranges: Ranges, kg: int = KG,
                 sid: int = SID) -> bytes | None:
    version = latest(store, ukey, ranges, kg, sid)
    assert version is not None
    return version.value


def scan_all(store: StateStore, prefix: bytes, page: int, ranges: Ranges, kg: int = KG,
             sid: int = SID) -> Iterator[tuple[bytes, StoredVersion]]:
    after = None
    while True:
        rows = store.scan_latest(sid, kg, prefix, after, page, ranges)
        assert len(rows) <= page
        yield from rows
        if len(rows) < page:
            return
        after = rows[-1][0]


# -- writes and reads through ranges ----------------------------------------------------

def test_write_versions_and_read_latest_within_ranges(store: StateStore) -> None:
    fence = branch(store)
    b = fence.branch
    assert latest(store, b"k", head(fence)) is None
    write(store, fence, 1, [row(b"k", b"v1"), row(b"j", b"j1")])
    write(store, fence, 2, [row(b"k", b"v2")])
    write(store, fence, 5, [row(b"k", b"v5", expires=123)])

    newest = latest(store, b"k", head(fence))
    assert newest == StoredVersion(version_of(b, 5), False, b"v5", 123)
    # A snapshot (b, e) sees b's versions up to e.
    assert latest_value(store, b"k", (own_range(b, 4),)) == b"v2"
    assert latest_value(store, b"k", (own_range(b, 1),)) == b"v1"
    assert latest(store, b"k", (own_range(b, 0),)) is None
    assert latest(store, b"k", ()) is None
    # The newest version across several ranges.
    assert latest_value(store, b"k", ((version_of(b, 5), version_of(b, 5)),
                                      own_range(b, 1))) == b"v5"
    assert latest_value(store, b"k", ((version_of(b, 2), version_of(b, 3)),
                                      own_range(b, 1))) == b"v2"
    assert latest_value(store, b"j", head(fence)) == b"j1"
    # Other key group, other state id, prefix of the key, other branch: not the entry.
    assert latest(store, b"k", head(fence), kg=KG + 1) is None
    assert latest(store, b"k", head(fence), sid=OTHER_SID) is None
    assert latest(store, b"", head(fence)) is None
    assert latest(store, b"k", (own_range(b + 1),)) is None


def test_a_restored_branch_sees_its_parent_up_to_the_restore_point(store: StateStore) -> None:
    parent = branch(store)
    p = parent.branch
    write(store, parent, 1, [row(b"a", b"a1"), row(b"b", b"b1"), row(b"c", b"c1")])
    write(store, parent, 2, [row(b"a", b"a2"), row(b"b", None)])
    write(store, parent, 3, [row(b"a", b"a3"), row(b"c", b"c3"), row(b"d", b"d3")])
    child = branch(store, lineage=child_of(parent, 2))
    c = child.branch
    sees = store.load_branches([c])[c].lineage.head(KG)
    assert sees == (own_range(p, 2), own_range(c))

    def view(ranges: Ranges) -> dict[bytes, Any]:
        return {u: (v.value, v.version) for u, v in scan_all(store, b"", 2, ranges)}

    # Nothing is rolled back: epoch 3 of the parent is simply outside the child's ranges.
    assert view(sees) == {b"a": (b"a2", version_of(p, 2)), b"b": (None, version_of(p, 2)),
                          b"c": (b"c1", version_of(p, 1))}
    write(store, child, 1, [row(b"a", b"ca"), row(b"b", b"cb")])
    assert version_of(c, 1) > version_of(p, 3)  # version order is lineage order
    assert view(sees) == {b"a": (b"ca", version_of(c, 1)), b"b": (b"cb", version_of(c, 1)),
                          b"c": (b"c1", version_of(p, 1))}
    assert latest(store, b"d", sees) is None
    # The parent's own views are unchanged by the child.
    assert {u: v for u, (v, _) in view(head(parent)).items()} == \
        {b"a": b"a3", b"b": None, b"c": b"c3", b"d": b"d3"}
    assert {u: v for u, (v, _) in view((own_range(p, 1),)).items()} == \
        {b"a": b"a1", b"b": b"b1", b"c": b"c1"}


def test_write_versions_is_an_idempotent_upsert(store: StateStore) -> None:
    fence = branch(store)
    assert write(store, fence, 3, [row(b"k", b"first")]) == 1
    assert write(store, fence, 3, [row(b"k", b"second")]) == 1
    assert latest_value(store, b"k", head(fence)) == b"second"
    assert store.count_rows() == 1


def test_rewrite_of_a_chunked_version_with_fewer_chunks(store: StateStore) -> None:
    fence = branch(store)
    big = random.Random(1).randbytes(3 * CHUNK_BYTES + 17)
    assert write(store, fence, 4, [row(b"k", big)]) == 4
    write(store, fence, 4, [row(b"k", b"small")])
    assert latest_value(store, b"k", head(fence)) == b"small"
    write(store, fence, 4, [row(b"k", big[: CHUNK_BYTES + 1])])
    assert latest_value(store, b"k", head(fence)) == big[: CHUNK_BYTES + 1]
    scanned = store.scan_latest(SID, KG, b"", None, 10, head(fence))
    assert scanned[0][1].value == big[: CHUNK_BYTES + 1]


class WriteRecorder:
    """The rows of every state-row write statement batch, grouped by "write versions"
    transaction."""

    def __init__(self, store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.transactions: list[list[list[Any]]] = []
        txn, replace_rows = store._txn, store._replace_state_rows

        def recording_txn(what: str, work: Callable[[], Any], fence: Fence | None = None
                          ) -> Any:
            if what == "write versions":
                self.transactions.append([])
            return txn(what, work, fence)

        def recording_replace_rows(text: str, rows: Any) -> None:
            if self.transactions:
                self.transactions[-1].append(list(rows))
            replace_rows(text, rows)

        monkeypatch.setattr(store, "_txn", recording_txn)
        monkeypatch.setattr(store, "_replace_state_rows", recording_replace_rows)

    @property
    def statements(self) -> list[list[Any]]:
        return [s for t in self.transactions for s in t]


def test_write_batches_respect_batch_size(store: StateStore,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    fence = branch(store)
    store.write_batch_rows = 7
    recorder = WriteRecorder(store, monkeypatch)
    written = write(store, fence, 1, [row(b"k%04d" % i, b"v%d" % i) for i in range(100)])
    assert written == 100
    sizes = [len(s) for s in recorder.statements]
    assert sum(sizes) == 100 and max(sizes) <= 7
    if store.commit_each_batch:  # one bounded transaction per batch (NDB)
        assert [sum(len(s) for s in t) for t in recorder.transactions] == [7] * 14 + [2]
    else:  # SQLite: one transaction for the epoch
        assert len(recorder.transactions) == 1
    assert store.count_rows() == 100
    assert [latest_value(store, b"k%04d" % i, head(fence)) for i in range(100)] == \
        [b"v%d" % i for i in range(100)]


def test_write_transactions_stay_under_the_byte_cap(store: StateStore,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    fence = branch(store)
    recorder = WriteRecorder(store, monkeypatch)
    values = [random.Random(i).randbytes(200_000) for i in range(30)]  # 6 MB in all
    assert write(store, fence, 1, [row(b"k%02d" % i, v) for i, v in enumerate(values)]) == 30
    if store.commit_each_batch:
        per_txn = [sum(len(p[9]) for s in t for p in s) for t in recorder.transactions]
        assert len(per_txn) >= 2 and max(per_txn) <= MAX_BATCH_BYTES
    assert [latest_value(store, b"k%02d" % i, head(fence)) for i in range(30)] == values


def test_tombstones(store: StateStore) -> None:
    sid = store.register_state(OP, "v", "value", "pickle-5", None)
    fence = branch(store)
    b = fence.branch
    write(store, fence, 1, [row(b"k", b"v1", sid=sid)])
    write(store, fence, 2, [row(b"k", None, sid=sid)])
    tomb = latest(store, b"k", head(fence), sid=sid)
    assert tomb == StoredVersion(version_of(b, 2), True, None, None)
    assert latest_value(store, b"k", (own_range(b, 1),), sid=sid) == b"v1"
    scanned = store.scan_latest(sid, KG, b"", None, 10, head(fence))
    assert [(u, v.tombstone, v.value) for u, v in scanned] == [(b"k", True, None)]
    # The committed view never shows tombstones.
    assert checkpoint(store, fence, 2) is not None
    assert store.query_committed() == []
    write(store, fence, 3, [row(b"k", b"v3", sid=sid)])
    assert latest_value(store, b"k", head(fence), sid=sid) == b"v3"
    checkpoint(store, fence, 3)
    assert [r["vbytes"] for r in store.query_committed()] == [b"v3"]


def test_read_versions_lists_every_version_of_each_entry(store: StateStore) -> None:
    fence = branch(store)
    b = fence.branch
    store.write_batch_rows = 2  # several queries
    write(store, fence, 1, [row(b"a", b"1"), row(b"b", b"1"), row(b"c", b"1")])
    write(store, fence, 2, [row(b"a", None), row(b"c", random.Random(2).randbytes(
        CHUNK_BYTES + 1))])
    write(store, fence, 3, [row(b"a", b"3")])
    refs = [(KG, SID, b"a"), (KG, SID, b"b"), (KG, SID, b"c"), (KG, SID, b"none"),
            (KG + 1, SID, b"a")]
    assert store.read_versions(refs) == {
        (KG, SID, b"a"): [(version_of(b, 1), False), (version_of(b, 2), True),
                          (version_of(b, 3), False)],
        (KG, SID, b"b"): [(version_of(b, 1), False)],
        (KG, SID, b"c"): [(version_of(b, 1), False), (version_of(b, 2), False)],
        (KG, SID, b"none"): [], (KG + 1, SID, b"a"): []}


# -- scans ------------------------------------------------------------------------------

def test_scan_latest_pages_over_more_rows_than_a_page(store: StateStore) -> None:
    fence = branch(store)
    b = fence.branch
    n = 2_345
    prefix = encode_key("flink-key")
    ukeys = [prefix + encode_map_key(i) for i in range(n)]
    write(store, fence, 1, [row(u, b"e1-%d" % i) for i, u in enumerate(ukeys)])
    # A second epoch overwrites every third entry and deletes every fifth.
    second = []
    for i, u in enumerate(ukeys):
        if i % 5 == 0:
            second.append(row(u, None))
        elif i % 3 == 0:
            second.append(row(u, b"e2-%d" % i))
    write(store, fence, 2, second)
    # Neighbours that must stay outside the prefix.
    other = encode_key("flink-kez")
    write(store, fence, 1, [row(other + encode_map_key(0), b"x"), row(b"\x00", b"y"),
                            row(prefix + encode_map_key(1), b"other-sid", sid=OTHER_SID),
                            row(prefix + encode_map_key(1), b"other-kg", kg=KG + 1)])

    seen = list(scan_all(store, prefix, 1000, head(fence)))
    assert [u for u, _ in seen] == sorted(ukeys)
    by_key = dict(seen)
    for i, u in enumerate(ukeys):
        version = by_key[u]
        if i % 5 == 0:
            assert version.tombstone and version.value is None
            assert version.version == version_of(b, 2)
        elif i % 3 == 0:
            assert (version.value, version.version) == (b"e2-%d" % i, version_of(b, 2))
        else:
            assert (version.value, version.version) == (b"e1-%d" % i, version_of(b, 1))
    # Smaller pages give the same sequence; `after` excludes the given key itself.
    assert [u for u, _ in scan_all(store, prefix, 333, head(fence))] == sorted(ukeys)
    middle = sorted(ukeys)[1000]
    rest = store.scan_latest(SID, KG, prefix, middle, 5000, head(fence))
    assert [u for u, _ in rest] == sorted(ukeys)[1001:]
    # Snapshot 1 sees epoch 1 only: no tombstone, every first value.
    assert {u: v.value for u, v in scan_all(store, prefix, 1000, (own_range(b, 1),))} == \
        {u: b"e1-%d" % i for i, u in enumerate(ukeys)}


def test_scan_prefix_of_ff_bytes(store: StateStore) -> None:
    fence = branch(store)
    write(store, fence, 1, [row(b"\xff\xff", b"a"), row(b"\xff\xff\x00", b"b"),
                            row(b"\xff\xfe", b"c"), row(b"\xff", b"d")])
    assert [u for u, _ in store.scan_latest(SID, KG, b"\xff\xff", None, 10, head(fence))] == \
        [b"\xff\xff", b"\xff\xff\x00"]
    assert [u for u, _ in store.scan_latest(SID, KG, b"", None, 10, head(fence))] == \
        [b"\xff", b"\xff\xfe", b"\xff\xff", b"\xff\xff\x00"]


def test_scan_key_groups_for_eager_restore(store: StateStore) -> None:
    fence = branch(store)
    write(store, fence, 1, [row(b"a%d" % i, b"v", kg=kg) for kg in range(5) for i in range(7)])

    def ranges_of(key_group: int) -> Ranges:
        return () if key_group == 2 else head(fence)  # key group 2 sees nothing

    found = list(store.scan_key_groups([SID], 1, 3, ranges_of, page_rows=3))
    assert sorted((kg, u) for _, kg, u, _ in found) == \
        sorted((kg, b"a%d" % i) for kg in (1, 3) for i in range(7))


# -- fencing ----------------------------------------------------------------------------

def test_a_branch_that_lost_its_claim_is_fenced_and_writes_nothing(store: StateStore) -> None:
    old = branch(store)
    b = old.branch
    write(store, old, 1, [row(b"k", b"v1"), row(b"ttl", b"x", expires=1)])
    store.insert_snapshot(old, 1, KIND_CHECKPOINT, "job")
    # A newer attempt claims some of the old attempt's key groups.
    new = branch(store, kg_start=0, kg_end=63, lineage=lineage_from_tokens(
        0, 0, 63, [Token(b, 1, 0, KG_END)], {b: fresh_lineage(b, 0, KG_END)}))
    rows, snapshots, owner = store.count_rows(), store.list_snapshots(OP), \
        store.read_operator(OP)
    assert owner is not None and owner.owners == ((0, 63, new.branch), (64, KG_END, b))

    with pytest.raises(FencedError, match="no longer owns key groups 0-127"):
        # Also a row in key groups the old attempt still owns: the fence is its range.
        write(store, old, 2, [row(b"k", b"v2"), row(b"j", b"x", kg=100)])
    with pytest.raises(FencedError):
        store.insert_snapshot(old, 2, KIND_CHECKPOINT, "job")
    with pytest.raises(FencedError):
        store.mark_completed(OP, [(b, 1)], old)
    with pytest.raises(FencedError):
        store.advance_committed(old, 1)
    with pytest.raises(FencedError):
        store.delete_snapshots(OP, [(b, 1)], old)
    with pytest.raises(FencedError):
        store.delete_exact(old, [Deletion(KG, SID, b"k", version_of(b, 1))])
    with pytest.raises(FencedError):
        store.delete_range(old, SID, KG, KG, 0, version_of(b, 9), 100)
    with pytest.raises(FencedError):
        store.delete_expired(old, [SID], 0, KG_END, head(old), now=1_000)

    assert store.count_rows() == rows
    assert latest(store, b"k", head(old)) == StoredVersion(version_of(b, 1), False, b"v1",
                                                           None)
    assert latest(store, b"j", head(old), kg=100) is None
    assert store.list_snapshots(OP) == snapshots
    assert [s.status for s in snapshots] == [PENDING]
    assert store.read_operator(OP) == owner
    # The new owner writes; unfenced reads of the old attempt still work.
    assert write(store, new, 1, [row(b"k", b"n1")]) == 1
    assert latest_value(store, b"k", store.load_branches([new.branch])[new.branch]
                        .lineage.head(KG)) == b"n1"


@pytest.mark.mysql
def test_a_claim_between_write_batches_fences_the_remaining_batches(
        store_factory: Callable[..., StateStore], monkeypatch: pytest.MonkeyPatch) -> None:
    store = store_factory("mysql")
    other = store_factory("mysql", namespace=store.namespace)  # the new attempt's connection
    assert store.commit_each_batch
    store.write_batch_rows = 7
    old = branch(store)
    write(store, old, 1, [row(b"base", b"b")])
    store.insert_snapshot(old, 1, KIND_CHECKPOINT, "job")
    lineage = child_of(old, 1)
    claimed: list[Fence] = []
    txn = store._txn

    def txn_then_claim(what: str, work: Callable[[], Any], fence: Fence | None = None) -> Any:
        out = txn(what, work, fence)
        if what == "write versions" and not claimed:
            claimed.append(branch(other, lineage=lineage))
        return out

    monkeypatch.setattr(store, "_txn", txn_then_claim)
    with pytest.raises(FencedError):
        write(store, old, 2, [row(b"k%03d" % i, b"zombie") for i in range(30)])
    # The batch before the claim committed, none after it ...
    assert store.count_rows() == 1 + 7
    # ... and what did commit is outside every range the new owner reads.
    new = claimed[0]
    sees = other.load_branches([new.branch])[new.branch].lineage.head(KG)
    assert [(u, v.value) for u, v in scan_all(other, b"", 100, sees)] == [(b"base", b"b")]


# -- snapshot rows ----------------------------------------------------------------------

def test_snapshot_rows(store: StateStore) -> None:
    a = branch(store, kg_start=0, kg_end=63)
    b = branch(store, kg_start=64, kg_end=KG_END)
    o = branch(store, operator="other-op")
    store.insert_snapshot(a, 2, KIND_CHECKPOINT, "job-1")
    store.insert_snapshot(a, 1, KIND_SAVEPOINT, "job-1")
    store.insert_snapshot(b, 1, KIND_CHECKPOINT, "job-1")
    store.insert_snapshot(o, 1, KIND_FINAL, "job-2")

    def listed(operator: str | None = OP) -> list[tuple[Any, ...]]:
        return [(r.operator, r.branch, r.epoch, r.kind, r.status, r.kg_start, r.kg_end,
                 r.job_id) for r in store.list_snapshots(operator)]

    assert listed() == [
        (OP, a.branch, 1, KIND_SAVEPOINT, PENDING, 0, 63, "job-1"),
        (OP, a.branch, 2, KIND_CHECKPOINT, PENDING, 0, 63, "job-1"),
        (OP, b.branch, 1, KIND_CHECKPOINT, PENDING, 64, KG_END, "job-1")]
    assert sorted(listed(None)) == sorted(
        [*listed(), ("other-op", o.branch, 1, KIND_FINAL, PENDING, 0, KG_END, "job-2")])
    first = store.list_snapshots(OP)[0]
    assert first.token == Token(a.branch, 1, 0, 63)
    assert first.created_ms > 0

    store.mark_completed(OP, [(a.branch, 2), (b.branch, 1)], a)
    store.mark_completed(OP, [])
    # Recording a snapshot again changes nothing (idempotent, status kept).
    store.insert_snapshot(a, 2, KIND_CHECKPOINT, "job-1")
    assert [(r.branch, r.epoch, r.status) for r in store.list_snapshots(OP)] == [
        (a.branch, 1, PENDING), (a.branch, 2, COMPLETED), (b.branch, 1, COMPLETED)]

    assert store.delete_snapshots(OP, [(a.branch, 1), (a.branch, 99)]) == 1
    assert store.delete_snapshots(OP, []) == 0
    assert [(r.branch, r.epoch) for r in store.list_snapshots(OP)] == \
        [(a.branch, 2), (b.branch, 1)]
    assert [r.epoch for r in store.list_snapshots("other-op")] == [1]


# -- the owner row: claim and advance_committed -----------------------------------------

def test_claim_and_advance_committed_move_forward_only(store: StateStore) -> None:
    assert store.read_operator(OP) is None
    fence = branch(store, claim=False)
    b = fence.branch
    assert store.claim(fence, None) == ((), None)
    owner = store.read_operator(OP)
    assert owner is not None
    assert (owner.owners, owner.committed) == (((0, KG_END, b),), None)

    assert store.advance_committed(fence, 1) is None  # no snapshot at 1 yet
    store.insert_snapshot(fence, 1, KIND_CHECKPOINT, "job")
    one = Descriptor((Token(b, 1, 0, KG_END),))
    assert store.advance_committed(fence, 1) == one
    assert store.advance_committed(fence, 1) is None
    store.insert_snapshot(fence, 3, KIND_CHECKPOINT, "job")
    three = Descriptor((Token(b, 3, 0, KG_END),))
    assert store.advance_committed(fence, 3) == three
    # A late completion of an older checkpoint does not move readers back.
    store.insert_snapshot(fence, 2, KIND_CHECKPOINT, "job")
    assert store.advance_committed(fence, 2) is None
    owner = store.read_operator(OP)
    assert owner is not None and owner.committed == three
    # Claiming again while `committed` is a checkpoint of the running attempts keeps it.
    assert store.claim(fence, one) == (((0, KG_END, b),), three)
    assert store.operators() == [store.read_operator(OP)]


def test_advance_committed_waits_for_every_owner(store: StateStore) -> None:
    b1 = branch(store, kg_start=0, kg_end=63)
    b2 = branch(store, kg_start=64, kg_end=KG_END)
    store.insert_snapshot(b1, 1, KIND_CHECKPOINT, "job")
    assert store.advance_committed(b1, 1) is None
    store.insert_snapshot(b2, 1, KIND_CHECKPOINT, "job")
    both = Descriptor((Token(b1.branch, 1, 0, 63), Token(b2.branch, 1, 64, KG_END)))
    assert store.advance_committed(b2, 1) == both

    # A new attempt of the first subtask restores checkpoint 1.
    c = branch(store, kg_start=0, kg_end=63, claim=False)
    before, committed = store.claim(c, both)
    assert before == ((0, 63, b1.branch), (64, KG_END, b2.branch))
    assert committed == both
    with pytest.raises(FencedError):
        store.advance_committed(b1, 2)
    store.insert_snapshot(c, 2, KIND_CHECKPOINT, "job")
    assert store.advance_committed(c, 2) is None  # b2 has no snapshot at 2 yet
    store.insert_snapshot(b2, 2, KIND_CHECKPOINT, "job")
    assert store.advance_committed(b2, 2) == Descriptor(
        (Token(c.branch, 2, 0, 63), Token(b2.branch, 2, 64, KG_END)))


def test_claim_sets_the_restored_descriptor_or_resets(store: StateStore) -> None:
    first = branch(store)
    one = checkpoint(store, first, 1)
    assert one == Descriptor((Token(first.branch, 1, 0, KG_END),))
    # A restore from a snapshot: readers see the restored one until a checkpoint completes.
    write(store, first, 2, [row(b"k", b"v2")])
    checkpoint(store, first, 2)
    back = branch(store, lineage=child_of(first, 1), claim=False)
    assert store.claim(back, one)[1] == one
    owner = store.read_operator(OP)
    assert owner is not None and owner.committed == one
    # Truncate: readers see nothing.
    truncated = branch(store, claim=False)
    assert store.claim(truncated, None, reset=True) == (((0, KG_END, back.branch),), None)
    owner = store.read_operator(OP)
    assert owner is not None and owner.committed is None
    assert store.query_committed(OP) == []
    with pytest.raises(StateCompatibilityError, match="no completed checkpoint"):
        store.committed_sql(OP)


# -- readers ----------------------------------------------------------------------------

def test_committed_view_reads_the_committed_version(store: StateStore) -> None:
    sid = store.register_state(OP, "v", "value", "pickle-5", None)
    fence = branch(store)
    b = fence.branch
    ukey = encode_key("k")
    write(store, fence, 1, [row(ukey, encode_value(1), sid=sid, value_json="1")])
    write(store, fence, 2, [row(ukey, encode_value(2), sid=sid, value_json="2")])
    assert store.query_committed(OP, "v") == []  # nothing completed yet
    checkpoint(store, fence, 1)
    rows = store.query_committed(OP, "v")
    assert [(r["ukey"], r["version"], r["checkpoint"], r["vbytes"], r["state_name"])
            for r in rows] == [(ukey, version_of(b, 1), 1, encode_value(1), "v")]
    assert json.loads(rows[0]["vjson"]) == 1
    sql, params = store.committed_sql(OP)
    assert [(bytes(r[3]), int(r[5])) for r in store._read("test", sql, params)] == \
        [(ukey, version_of(b, 1))]
    checkpoint(store, fence, 2)
    assert [r["version"] for r in store.query_committed(OP, "v")] == [version_of(b, 2)]
    sql, params = store.committed_sql(OP)
    assert [int(r[5]) for r in store._read("test", sql, params)] == [version_of(b, 2)]
    assert store.query_committed(OP, "absent") == []
    assert store.query_committed("no-such-op") == []


def test_iter_committed_pages_joins_chunks_and_follows_the_lineage(store: StateStore) -> None:
    sid_v = store.register_state(OP, "v", "value", "pickle-5", None)
    sid_m = store.register_state(OP, "m", "map", "pickle-5", None)
    big = random.Random(3).randbytes(2 * CHUNK_BYTES + 5)
    parent = branch(store)
    model: dict[tuple[int, int, bytes], bytes] = {}
    first = []
    for kg in range(4):
        for sid in (sid_v, sid_m):
            for i in range(9):
                ukey = b"u%02d" % i
                first.append(row(ukey, b"p1-%d-%d-%d" % (kg, sid, i), kg=kg, sid=sid))
                model[(kg, sid, ukey)] = b"p1-%d-%d-%d" % (kg, sid, i)
    first.append(row(b"big", big, kg=2, sid=sid_v))
    model[(2, sid_v, b"big")] = big
    write(store, parent, 1, first)
    checkpoint(store, parent, 1)
    # Epoch 2 of the parent is abandoned: the next attempt restores checkpoint 1.
    write(store, parent, 2, [row(b"u00", b"abandoned", kg=0, sid=sid_v),
                             row(b"late", b"abandoned", kg=1, sid=sid_m)])
    store.insert_snapshot(parent, 2, KIND_CHECKPOINT, "job")
    child = branch(store, lineage=child_of(parent, 1), claim=False)
    store.claim(child, Descriptor((Token(parent.branch, 1, 0, KG_END),)))

    def committed(page_rows: int, state_name: str | None = None
                  ) -> dict[tuple[int, int, bytes], bytes]:
        out = {}
        recs = list(store.iter_committed(OP, state_name, page_rows=page_rows))
        keys = [(r["key_group"], r["state_id"], r["ukey"]) for r in recs]
        assert keys == sorted(keys), "primary-key order"
        for r in recs:
            assert r["operator"] == OP and r["state_name"] == {sid_v: "v", sid_m: "m"}[
                r["state_id"]]
            out[(r["key_group"], r["state_id"], r["ukey"])] = r["vbytes"]
        assert len(out) == len(recs), "each entry once"
        return out

    assert committed(7) == model  # the restored checkpoint, not the abandoned epoch

    write(store, child, 1, [row(b"u01", None, kg=0, sid=sid_v),
                            row(b"u02", b"c1", kg=3, sid=sid_m),
                            row(b"big", big[::-1], kg=2, sid=sid_v),
                            row(b"new", b"c1-new", kg=1, sid=sid_v)])
    del model[(0, sid_v, b"u01")]
    model[(3, sid_m, b"u02")] = b"c1"
    model[(2, sid_v, b"big")] = big[::-1]
    model[(1, sid_v, b"new")] = b"c1-new"
    checkpoint(store, child, 1)
    for page_rows in (1, 7, 1000):
        assert committed(page_rows) == model
    assert committed(5, "m") == {k: v for k, v in model.items() if k[1] == sid_m}
    assert {(r["key_group"], r["state_id"], r["ukey"]) for r in store.query_committed(OP)} \
        == set(model)
    assert {r["checkpoint"] for r in store.query_committed(OP)} == {1}
    sql, params = store.committed_sql(OP)
    assert {(int(r[2]), bytes(r[3])) for r in store._read("test", sql, params)} == \
        {(kg, u) for kg, _, u in model}


def test_iter_committed_reads_only_what_is_consumed(store: StateStore,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    sid = store.register_state(OP, "v", "value", "pickle-5", None)
    fence = branch(store)
    write(store, fence, 1, [row(b"u%02d" % i, b"v", sid=sid) for i in range(23)])
    checkpoint(store, fence, 1)
    pages: list[str] = []
    read = store._read

    def counting_read(what: str, text: str, params: Any = ()) -> list[tuple[Any, ...]]:
        if what == "read committed":
            pages.append(what)
        return read(what, text, params)

    monkeypatch.setattr(store, "_read", counting_read)
    assert len(list(itertools.islice(store.iter_committed(OP, page_rows=5), 3))) == 3
    assert len(pages) == 1
    pages.clear()
    assert len(list(store.iter_committed(OP, page_rows=5))) == 23
    assert len(pages) == 5


# -- deletes ----------------------------------------------------------------------------

def test_delete_exact_removes_every_chunk_of_a_version(store: StateStore) -> None:
    fence = branch(store)
    b = fence.branch
    big = bytes(range(256)) * (CHUNK_BYTES // 256 * 2 + 1)  # 3 chunks
    write(store, fence, 1, [row(b"k", b"small"), row(b"j", b"j1")])
    write(store, fence, 2, [row(b"k", big)])
    write(store, fence, 3, [row(b"k", b"three")])
    assert store.count_rows() == 1 + 1 + 3 + 1
    store.write_batch_rows = 1  # one statement per version
    assert store.delete_exact(fence, [Deletion(KG, SID, b"k", version_of(b, 2)),
                                      Deletion(KG, SID, b"k", version_of(b, 1)),
                                      Deletion(KG, SID, b"k", version_of(b, 7))]) == 4
    assert store.count_rows() == 2
    assert latest(store, b"k", (own_range(b, 2),)) is None
    assert latest_value(store, b"k", head(fence)) == b"three"
    assert latest_value(store, b"j", head(fence)) == b"j1"
    assert store.delete_exact(fence, []) == 0


def test_delete_range_is_bounded_and_stays_in_its_state_and_key_group(
        store: StateStore) -> None:
    fence = branch(store)
    b = fence.branch
    for epoch in (1, 2, 3):
        write(store, fence, epoch, [row(b"e%02d" % i, b"v%d" % epoch) for i in range(25)]
              + [row(b"x", b"kg", kg=KG + 1), row(b"x", b"sid", sid=OTHER_SID)])
    removed = []
    while True:
        n = store.delete_range(fence, SID, KG, KG, version_of(b, 2), version_of(b, 3), 10)
        removed.append(n)
        if n < 10:
            break
    assert removed == [10, 10, 10, 10, 10, 0]
    assert store.count_rows() == 25 + 3 * 2
    assert {v.value for _, v in scan_all(store, b"", 100, head(fence))} == {b"v1"}
    assert latest_value(store, b"x", head(fence), kg=KG + 1) == b"kg"
    assert latest_value(store, b"x", head(fence), sid=OTHER_SID) == b"sid"


def test_delete_expired(store: StateStore) -> None:
    fence = branch(store)
    b = fence.branch
    other = branch(store, operator="other-op")  # another branch's rows in the same key group
    write(store, fence, 1, [row(b"old", b"x", expires=1_000), row(b"new", b"y", expires=5_000),
                            row(b"shortened", b"live"), row(b"both", b"1", expires=500),
                            row(b"elsewhere", b"x", expires=1_000, kg=KG + 10)])
    # A TTL shortened after the first write: the newer version expired, the older not.
    write(store, fence, 2, [row(b"shortened", b"short", expires=1_000),
                            row(b"both", b"2", expires=1_500)])
    write(store, other, 1, [row(b"old", b"x", expires=1_000)])
    assert store.delete_expired(fence, [SID], KG, KG, head(fence), now=2_000) == 3
    assert latest(store, b"old", head(fence)) is None
    assert latest(store, b"both", head(fence)) is None
    assert latest_value(store, b"new", head(fence)) == b"y"
    # The expired newer version stays, else the older value would re-appear.
    assert latest(store, b"shortened", head(fence)) == StoredVersion(
        version_of(b, 2), False, b"short", 1_000)
    assert latest_value(store, b"elsewhere", head(fence), kg=KG + 10) == b"x"
    assert latest_value(store, b"old", head(other)) == b"x"
    assert store.delete_expired(fence, [], KG, KG, head(fence), now=2_000) == 0


# -- branches ---------------------------------------------------------------------------

def test_allocate_branch_ids_grow(store_kind: str,
                                  store_factory: Callable[..., StateStore]) -> None:
    store = store_factory(store_kind)
    lineage = Lineage(0, 0, 63, ())
    ids = [store.allocate_branch(op, 0, 63, lineage.to_json(), {"kind": "fresh"}, f"job-{i}",
                                 i, 0) for i, op in enumerate([OP, OP, "other-op", OP])]
    assert ids == [1, 2, 3, 4]
    # Another connection (another TaskManager) continues after the largest id.
    again = store_factory(store_kind, namespace=store.namespace)
    assert again.allocate_branch(OP, 64, KG_END, lineage.to_json(), {"kind": "restore"},
                                 "job-9", 1, 2) == 5
    assert store.allocate_branch(OP, 0, 63, lineage.to_json(), {"kind": "fresh"}, "j", 0, 0) == 6
    assert store.branches_of(OP) == [1, 2, 4, 5, 6]
    assert store.branches_of("other-op") == [3]
    found = store.load_branches([5, 3, 99])
    assert sorted(found) == [3, 5]
    five = found[5]
    assert (five.operator, json.loads(five.origin), five.job_id, five.subtask, five.attempt) \
        == (OP, {"kind": "restore"}, "job-9", 1, 2)
    assert (five.lineage.branch, five.lineage.kg_start, five.lineage.kg_end) == (5, 64, KG_END)
    assert five.created_ms > 0


def _stale_max_once(store: StateStore, first: int,
                    monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make the store's next `SELECT MAX(branch_id)` answer `first - 1`, as if another
    server had not committed branch `first` yet; returns the list that records it."""
    query = store._query
    stale: list[str] = []

    def stale_max_once(text: str, params: Any = ()) -> list[tuple[Any, ...]]:
        if "MAX(branch_id)" in text and not stale:
            stale.append(text)
            return [(first - 1,)]
        return query(text, params)

    monkeypatch.setattr(store, "_query", stale_max_once)
    return stale


def test_allocate_branch_retries_an_id_taken_meanwhile(store: StateStore,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    lineage = fresh_lineage(0, 0, KG_END).to_json()
    first = store.allocate_branch(OP, 0, KG_END, lineage, {"kind": "fresh"}, "job-a", 0, 0)
    stale = _stale_max_once(store, first, monkeypatch)
    second = store.allocate_branch("other-op", 0, KG_END, lineage, {"kind": "fresh"},
                                   "job-b", 0, 0)
    assert stale and second == first + 1
    rows = store.load_branches([first, second])
    assert (rows[first].operator, rows[first].job_id) == (OP, "job-a")
    assert (rows[second].operator, rows[second].job_id) == ("other-op", "job-b")


def test_claim_new_branch_commits_branch_claim_and_forgotten_snapshots_at_once(
        store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A subtask's open is one transaction: the branch row, the owner row and the deletion
    of the snapshots the claim abandons commit together; a claim whose check fails
    leaves none of them."""
    lineage = fresh_lineage(0, 0, KG_END).to_json()
    old = branch(store)
    store.insert_snapshot(old, 7, KIND_CHECKPOINT, "job-1")  # pending: to be abandoned
    store.insert_snapshot(old, 8, KIND_CHECKPOINT, "job-1")  # pending: kept
    transactions: list[str] = []
    txn = store._txn

    def counted(what: str, work: Callable[[], Any], fence: Fence | None = None) -> Any:
        transactions.append(what)
        return txn(what, work, fence)

    monkeypatch.setattr(store, "_txn", counted)
    asked = []

    def abandoned(before: Any, bid: int, rows: list[Any]) -> list[tuple[int, int]]:
        asked.append((before, bid, sorted(r.epoch for r in rows)))
        return [(old.branch, 7)]

    bid, before, committed = store.claim_new_branch(
        OP, 0, KG_END, lineage, {"kind": "restore"}, "job-2", 0, 1, None, abandoned=abandoned)
    assert transactions == ["claim key groups"]
    assert bid == old.branch + 1 and before == ((0, KG_END, old.branch),) and committed is None
    assert asked == [(before, bid, [7, 8])]
    row = store.read_operator(OP)
    assert row is not None and row.owners == ((0, KG_END, bid),)
    assert store.load_branches([bid])[bid].job_id == "job-2"
    assert [(r.branch, r.epoch) for r in store.list_snapshots(OP)] == [(old.branch, 8)]

    def refuse(rows: list[Any]) -> None:
        raise CheckpointError("the restored snapshot can no longer be restored")

    with pytest.raises(CheckpointError):
        store.claim_new_branch(OP, 0, KG_END, lineage, {"kind": "restore"}, "job-3", 0, 2,
                               None, check=refuse, abandoned=abandoned)
    assert store.branches_of(OP) == [old.branch, bid], "a refused claim left a branch row"
    row = store.read_operator(OP)
    assert row is not None and row.owners == ((0, KG_END, bid),)
    assert [(r.branch, r.epoch) for r in store.list_snapshots(OP)] == [(old.branch, 8)]


def test_claim_new_branch_tries_again_whole_when_the_id_was_taken(
        store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another operator's subtask took the branch id meanwhile: the claim rolls back and
    is tried again whole (the check runs again), with the next id."""
    lineage = fresh_lineage(0, 0, KG_END).to_json()
    first = store.allocate_branch("other-op", 0, KG_END, lineage, {"kind": "fresh"}, "job-a",
                                  0, 0)
    execute = store._execute
    stale = _stale_max_once(store, first, monkeypatch)
    checked: list[int] = []
    bid, before, _ = store.claim_new_branch(OP, 0, KG_END, lineage, {"kind": "fresh"}, "job-b",
                                            0, 0, None, check=lambda rows: checked.append(1))
    assert stale and bid == first + 1 and before == () and len(checked) == 2
    row = store.read_operator(OP)
    assert row is not None and row.owners == ((0, KG_END, bid),)
    assert store.branches_of(OP) == [bid] and store.branches_of("other-op") == [first]
    # An engine that reports the duplicate key instead of ignoring it (NDB may, for an id
    # another transaction inserted and had not committed): tried again the same way.
    duplicate = (pymysql.err.IntegrityError(1062, "Duplicate entry") if
                 store.describe().startswith("mysql") else
                 sqlite3.IntegrityError("UNIQUE constraint failed"))
    raised: list[str] = []

    def duplicate_once(text: str, params: Any = ()) -> Any:
        if "INTO" in text and "branches" in text and not raised:
            raised.append(text)
            raise duplicate
        return execute(text, params)

    monkeypatch.setattr(store, "_execute", duplicate_once)
    again, _, _ = store.claim_new_branch("op-3", 0, KG_END, lineage, {"kind": "fresh"},
                                         "job-c", 0, 0, None)
    assert raised and again == bid + 1 and store.branches_of("op-3") == [again]


def test_concurrent_opens_of_several_operators_get_distinct_branches(
        store_kind: str, store_factory: Callable[..., StateStore]) -> None:
    """Eight subtasks of four operators open at once, each on a connection of its own
    (several TaskManagers): every claim commits, with distinct branch ids (the ones that
    chose an id another operator's subtask took meanwhile tried again), and each owner
    row names its two subtasks' branches."""
    first = store_factory(store_kind)
    stores = [first] + [store_factory(store_kind, namespace=first.namespace)
                        for _ in range(7)]
    barrier = threading.Barrier(len(stores))
    got: dict[int, tuple[str, int, int]] = {}
    errors: list[BaseException] = []

    def open_subtask(i: int) -> None:
        operator, subtask = f"op-{i // 2}", i % 2
        kg_start, kg_end = (0, 63) if subtask == 0 else (64, KG_END)
        lineage = fresh_lineage(0, kg_start, kg_end).to_json()
        try:
            barrier.wait(10)
            bid, _, _ = stores[i].claim_new_branch(
                operator, kg_start, kg_end, lineage, {"kind": "fresh"}, "job", subtask, 0,
                None, abandoned=lambda before, branch, rows: [])
            got[i] = (operator, subtask, bid)
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=open_subtask, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert sorted(bid for _, _, bid in got.values()) == list(range(1, len(stores) + 1))
    for o in range(len(stores) // 2):
        row = first.read_operator(f"op-{o}")
        mine = {subtask: bid for operator, subtask, bid in got.values()
                if operator == f"op-{o}"}
        assert row is not None and row.owners == ((0, 63, mine[0]), (64, KG_END, mine[1]))
    branches = first.load_branches(bid for _, _, bid in got.values())
    assert {(b.operator, b.subtask) for b in branches.values()} == {
        (operator, subtask) for operator, subtask, _ in got.values()}


# -- format -----------------------------------------------------------------------------

def test_format_1_namespace_is_refused_with_the_migrate_command(
        store_kind: str, store_factory: Callable[..., StateStore]) -> None:
    store = store_factory(store_kind)
    ns = store.namespace
    store.check_format()  # a format-2 namespace
    store._execute(f"CREATE TABLE {ns}_epochs (operator VARCHAR(255) NOT NULL, "
                   "epoch BIGINT NOT NULL, is_savepoint INT NOT NULL)")
    store._conn.commit()
    with pytest.raises(StateCompatibilityError) as info:
        store.check_format()
    message = str(info.value)
    assert f"pyflink-ndb migrate --url URL --namespace {ns}" in message
    assert f"{ns}_epochs" in message
    # Opening it (as a job or as a reader) is refused the same way.
    with pytest.raises(StateCompatibilityError, match="pyflink-ndb migrate"):
        store_factory(store_kind, namespace=ns)
    with pytest.raises(StateCompatibilityError, match="pyflink-ndb migrate"):
        store.open(create=False)


# -- catalog ----------------------------------------------------------------------------

def test_catalog_registration_and_compatibility(store: StateStore) -> None:
    sid = store.register_state("op", "s", "value", "pickle-5", None)
    assert store.register_state("op", "s", "value", "pickle-5", None) == sid
    assert store.register_state("op2", "s", "map", "pickle-5", None) != sid
    entry = [c for c in store.catalog("op") if c["state_name"] == "s"][0]
    assert (entry["state_kind"], entry["serializer"], entry["format_version"]) == \
        ("value", "pickle-5", FORMAT_VERSION)

    with pytest.raises(StateCompatibilityError, match="declared as value, now as map"):
        store.register_state("op", "s", "map", "pickle-5", None)
    with pytest.raises(StateCompatibilityError, match="serializer"):
        store.register_state("op", "s", "value", "json-1", None)
    with pytest.raises(StateCompatibilityError, match="TTL"):
        store.register_state("op", "s", "value", "pickle-5", 1000)
    # A changed TTL duration (still enabled) is compatible, as in Flink.
    store.register_state("op", "t", "list", "pickle-5", 1000)
    store.register_state("op", "t", "list", "pickle-5", 2000)
    assert [c["ttl_ms"] for c in store.catalog("op") if c["state_name"] == "t"] == [2000]
    assert sorted(store.state_ids("op")) == sorted(
        c["state_id"] for c in store.catalog("op"))


def test_value_redeclared_as_map_fails_on_open(store: StateStore, local_dir: str) -> None:
    opts = NdbStateOptions(cache_max_entries=1)
    t = LocalSubtask(store, opts, local_dir=local_dir)
    t.context.get_state(ValueStateDescriptor("s", Types.PICKLED_BYTE_ARRAY()))
    t.key("k")
    t.checkpoint(1)
    t.crash()
    again = LocalSubtask(store, opts, restored_checkpoint_id=1, local_dir=local_dir)
    with pytest.raises(StateCompatibilityError) as info:
        again.context.get_map_state(
            MapStateDescriptor("s", Types.PICKLED_BYTE_ARRAY(), Types.PICKLED_BYTE_ARRAY()))
    assert "'s'" in str(info.value) and "map" in str(info.value)
    # The same context refuses a second kind for a name it already handed out.
    again.context.get_list_state(ListStateDescriptor("l", Types.PICKLED_BYTE_ARRAY()))
    with pytest.raises(StateCompatibilityError):
        again.context.get_state(ValueStateDescriptor("l", Types.PICKLED_BYTE_ARRAY()))
    again.close()


# -- large and awkward values -----------------------------------------------------------

def test_chunked_16_mib_value_is_byte_identical(store: StateStore) -> None:
    sid = store.register_state(OP, "big", "value", "pickle-5", None)
    fence = branch(store)
    big = random.Random(16).randbytes(16 * 1024 * 1024)
    write(store, fence, 1, [row(b"big", big, sid=sid), row(b"small", b"s", sid=sid)])
    assert store.count_rows() == 16 * 1024 * 1024 // CHUNK_BYTES + 1
    assert latest_value(store, b"big", head(fence), sid=sid) == big
    scanned = dict(store.scan_latest(sid, KG, b"", None, 10, head(fence)))
    assert scanned[b"big"].value == big
    assert scanned[b"small"].value == b"s"
    checkpoint(store, fence, 1)
    assert {r["ukey"]: r["vbytes"] for r in store.iter_committed(OP)} == \
        {b"big": big, b"small": b"s"}


def _edge_rows(sid: int) -> list[WriteRow]:
    rows = []
    for i, value in enumerate(EDGE_VALUES):
        data = encode_value(value)
        rows.append(row(encode_key(value) + encode_map_key(i), data, sid=sid,
                        value_json=value_json(value)))
        rows.append(row(encode_key(i) + encode_map_key(value), data, sid=sid,
                        value_json=value_json(value)))
    return rows


def test_edge_values_round_trip(store: StateStore) -> None:
    fence = branch(store)
    rows = _edge_rows(SID)
    write(store, fence, 1, rows)
    for r in rows:
        version = latest(store, r.ukey, head(fence))
        assert version is not None and version.value == r.value
    scanned = dict(store.scan_latest(SID, KG, b"", None, 1000, head(fence)))
    assert {u: v.value for u, v in scanned.items()} == {r.ukey: r.value for r in rows}


class WarningCollector:
    """Runs `SHOW WARNINGS` on the store's own connection after every statement."""

    def __init__(self, store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.warnings: list[tuple[str, tuple[Any, ...]]] = []
        self._store = store
        execute, executemany = store._execute, store._executemany
        replace_rows = store._replace_state_rows

        def checked_execute(text: str, params: Any = ()) -> Any:
            cur = execute(text, params)
            if not text.lstrip().upper().startswith("SHOW"):
                rows = cur.fetchall() if cur.description else ()
                self._collect(text)
                return _Replay(cur, rows)
            return cur

        def checked_executemany(text: str, rows: Any) -> None:
            # One statement per call so SHOW WARNINGS sees every row's warnings.
            for params in rows:
                executemany(text, [params])
                self._collect(text)

        def checked_replace_rows(text: str, rows: Any) -> None:
            for params in rows:
                replace_rows(text, [params])
                self._collect(text)

        monkeypatch.setattr(store, "_execute", checked_execute)
        monkeypatch.setattr(store, "_executemany", checked_executemany)
        monkeypatch.setattr(store, "_replace_state_rows", checked_replace_rows)

    def _collect(self, text: str) -> None:
        with self._store._conn.cursor() as cur:
            cur.execute("SHOW WARNINGS")
            for warning in cur.fetchall():
                self.warnings.append((text[:60], tuple(warning)))


class _Replay:
    """A cursor whose rows were already fetched (SHOW WARNINGS needs the connection)."""

    def __init__(self, cur: Any, rows: Any) -> None:
        self.rowcount = cur.rowcount
        self.description = cur.description
        self._rows = list(rows)

    def fetchall(self) -> list[Any]:
        return self._rows


@pytest.mark.mysql
def test_edge_values_through_mariadb_without_warnings(
        store_factory: Callable[..., StateStore], monkeypatch: pytest.MonkeyPatch,
        mysql_url: str, local_dir: str) -> None:
    store = store_factory("mysql")
    collector = WarningCollector(store, monkeypatch)

    sid = store.register_state("raw-op", "raw", "value", "pickle-5", None)
    fence = branch(store, operator="raw-op")
    rows = _edge_rows(sid)
    write(store, fence, 1, rows)
    checkpoint(store, fence, 1)
    for r in rows:
        version = latest(store, r.ukey, head(fence), sid=sid)
        assert version is not None and version.value == r.value

    # The same values as Flink keys, map keys, values and list elements of real states.
    opts = NdbStateOptions(cache_max_entries=1)
    t = LocalSubtask(store, opts, local_dir=local_dir)
    value = t.context.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
    mapping = t.context.get_map_state(
        MapStateDescriptor("m", Types.PICKLED_BYTE_ARRAY(), Types.PICKLED_BYTE_ARRAY()))
    items = t.context.get_list_state(ListStateDescriptor("l", Types.PICKLED_BYTE_ARRAY()))
    for edge in EDGE_VALUES:
        t.key(edge)
        value.update(edge)
        mapping.put_all({e: e for e in EDGE_VALUES})
        items.update(list(EDGE_VALUES))
    t.checkpoint(2)
    t.crash()
    t = LocalSubtask(store, opts, restored_checkpoint_id=2, local_dir=local_dir)
    value = t.context.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
    mapping = t.context.get_map_state(
        MapStateDescriptor("m", Types.PICKLED_BYTE_ARRAY(), Types.PICKLED_BYTE_ARRAY()))
    items = t.context.get_list_state(ListStateDescriptor("l", Types.PICKLED_BYTE_ARRAY()))
    for edge in EDGE_VALUES:
        t.key(edge)
        got = value.value()
        assert type(got) is type(edge) and got == edge
        assert [(type(k), k, type(v), v) for k, v in mapping.items()] == sorted(
            [(type(e), e, type(e), e) for e in EDGE_VALUES],
            key=lambda x: encode_map_key(x[1]))
        assert [(type(e), e) for e in items.get()] == [(type(e), e) for e in EDGE_VALUES]
    t.close()

    # INSERT IGNORE of an existing catalog entry, owner row or snapshot row is the
    # intended idempotence (note 1062); any other warning would mean altered data.
    data_warnings = [w for w in collector.warnings
                     if not (w[0].startswith("INSERT IGNORE") and w[1][1] == 1062)]
    assert data_warnings == []
    # What SQL readers see: the bytes column byte-identical, the JSON column the same text.
    conn = mysql_connect(mysql_url)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT ukey, vbytes, vjson FROM {store.t_state} WHERE state_id = %s "
                        "AND version = %s", (sid, version_of(fence.branch, 1)))
            stored = {bytes(u): (bytes(v), j) for u, v, j in cur.fetchall()}
            cur.execute("SHOW WARNINGS")
            assert cur.fetchall() == ()
    finally:
        conn.close()
    for r in rows:
        vbytes, vjson = stored[r.ukey]
        assert vbytes == r.value
        if r.value_json is None:
            assert vjson is None
        else:
            assert json.loads(vjson) == json.loads(r.value_json)


def test_state_rows_render_as_literals_of_their_column_types() -> None:
    from pyflink_ndb.stores.mysql import render_state_row, render_statements, text_literal

    full = (3, 7, b"k'\\\x00", 9, 0, 0, 1, None, 2, b"\x00'\\v", '"it\'s \u00e9"', '["k"]')
    assert render_state_row(full) == (
        "(3,7,X'6b275c00',9,0,0,1,NULL,2,X'00275c76',"
        "_utf8mb4 X'226974277320c3a922',_utf8mb4 X'5b226b225d')")
    assert text_literal("{}") == "_utf8mb4 X'7b7d'"
    tombstone = (3, 7, b"", 9, 0, 1, 1, 1234, 2, None, None, None)
    assert render_state_row(tombstone) == "(3,7,X'',9,0,1,1,1234,2,NULL,NULL,NULL)"
    with pytest.raises(ValueError):  # a float is never written as an integer column
        render_state_row((3.5, *full[1:]))
    # Statements split before they pass the limit; each row whole in one of them.
    rows = [(i, 7, b"k%03d" % i, 9, 0, 0, 1, None, 2, b"v" * 40, None, None)
            for i in range(50)]
    statements = render_statements("REPLACE INTO t VALUES ", rows, max_chars=1_000)
    assert len(statements) > 1 and all(len(s) <= 1_000 for s in statements)
    assert sum(s.count("),(") + 1 for s in statements) == 50


@pytest.mark.mysql
def test_state_rows_round_trip_with_no_backslash_escapes(
        store_factory: Callable[..., StateStore]) -> None:
    # Text goes as hex literals with a character-set introducer, which no sql_mode
    # changes: quotes, backslashes and non-ASCII text arrive unchanged either way.
    store = store_factory("mysql")
    sid = store.register_state(OP, "nbe", "value", "pickle-5", None)
    fence = branch(store)
    with store._conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = CONCAT(@@sql_mode, ',NO_BACKSLASH_ESCAPES')")
    text = 'a \\ b \' c " d \n \u00e9 \u2603'
    rows = [row(b"q", encode_value(text), sid=sid, value_json=json.dumps(text))]
    write(store, fence, 1, rows)
    with store._conn.cursor() as cur:
        cur.execute(f"SELECT vbytes, JSON_UNQUOTE(vjson) FROM {store.t_state} "
                    "WHERE state_id = %s", (sid,))
        vbytes, unquoted = cur.fetchone()
    assert bytes(vbytes) == encode_value(text)
    assert unquoted == text


# -- connection failures ----------------------------------------------------------------

def test_unreachable_database_names_host_and_option() -> None:
    with pytest.raises(StoreUnavailableError) as info:
        open_store(NdbStateOptions(url="mysql://root@127.0.0.1:1/test", namespace="nowhere"))
    message = str(info.value)
    assert "127.0.0.1:1" in message
    assert "state.backend.ndb.url" in message
    assert isinstance(info.value.__cause__, pymysql.err.OperationalError)


def test_unreachable_database_message_hides_the_password() -> None:
    with pytest.raises(StoreUnavailableError) as info:
        open_store(NdbStateOptions(url="mysql://root:Sup3rSecret@127.0.0.1:1/test",
                                   namespace="nowhere"))
    assert "Sup3rSecret" not in str(info.value)


@pytest.mark.mysql
def test_wrong_password_is_store_unavailable(mysql_url: str) -> None:
    url = mysql_url.replace("://root@", "://pyflink_ndb_nobody:wrong@")
    if url == mysql_url:
        url = mysql_url.replace("mysql://", "mysql://pyflink_ndb_nobody:wrong@", 1)
    with pytest.raises(StoreUnavailableError) as info:
        open_store(NdbStateOptions(url=url, namespace=unique_namespace()))
    assert "pyflink_ndb_nobody" in str(info.value)
    assert ":wrong@" not in str(info.value)


def test_committed_view_has_the_key_as_json(tmp_path):
    from pyflink.common import Types
    from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

    from pyflink_ndb.testing import LocalSubtask

    store = open_store(NdbStateOptions(url=f"sqlite:///{tmp_path}/k.sqlite", namespace="k"))
    subtask = LocalSubtask(store, local_dir=str(tmp_path / "rocks"))
    value = subtask.context.get_state(ValueStateDescriptor("v", Types.INT()))
    votes = subtask.context.get_map_state(MapStateDescriptor("m", Types.STRING(), Types.INT()))
    subtask.key(("N725MQ", 2013))
    value.update(7)
    votes.put("yes", 1)
    subtask.checkpoint(1)
    rows = {r["state_name"]: r for r in store.query_committed("op")}
    assert rows["v"]["kjson"] == '["N725MQ",2013]' and rows["v"]["vjson"] == "7"
    assert rows["m"]["kjson"] == '["N725MQ",2013]' and rows["m"]["vjson"] == "1"
    subtask.close()
    store.close()


def test_readers_do_not_create_tables(tmp_path):
    from pyflink_ndb.errors import StateCompatibilityError, StoreUnavailableError

    with pytest.raises(StoreUnavailableError, match="No SQLite store"):
        open_store(NdbStateOptions(url=f"sqlite:///{tmp_path}/absent.sqlite"), create=False)
    open_store(NdbStateOptions(url=f"sqlite:///{tmp_path}/x.sqlite", namespace="a")).close()
    with pytest.raises(StateCompatibilityError, match="has no pyflink-ndb tables"):
        open_store(NdbStateOptions(url=f"sqlite:///{tmp_path}/x.sqlite", namespace="b"),
                   create=False)


# -- JSON column ------------------------------------------------------------------------

_json_scalars = (st.none() | st.booleans() | st.integers() | st.text()
                 | st.floats(allow_nan=True, allow_infinity=True))
_json_like = st.recursive(
    _json_scalars,
    lambda inner: (st.lists(inner, max_size=4) | st.tuples(inner, inner)
                   | st.dictionaries(st.text(max_size=3) | st.integers(), inner, max_size=3)),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(_json_like)
def test_value_json_fast_path_equals_the_reference_conversion(value) -> None:
    """The plain-data check (no copy) renders exactly what the recursive conversion does:
    tuples as arrays, dicts with a non-str key, NaN and lone surrogates as None."""
    from pyflink_ndb.serialization.values import _ENCODER, _jsonable

    try:
        expected: str | None = _ENCODER.encode(_jsonable(value))
        expected.encode("utf-8")
    except (ValueError, RecursionError, UnicodeEncodeError):
        expected = None
    assert value_json(value) == expected


def test_value_json_depth_limit_matches_the_reference() -> None:
    from pyflink_ndb.serialization.values import MAX_JSON_DEPTH

    def nested(depth: int) -> object:
        value: object = 1
        for _ in range(depth):
            value = [value]
        return value
    assert value_json(nested(MAX_JSON_DEPTH)) == "[" * MAX_JSON_DEPTH + "1" + "]" * MAX_JSON_DEPTH
    assert value_json(nested(MAX_JSON_DEPTH + 1)) is None
    assert value_json({"a": {1: "x"}}) is None  # a non-str key anywhere: no JSON
