"""The MySQL store's reads and deletes of many entries as one join from a derived table
of the entries (InnoDB), and NDB's fallback to the base class's statements.

Why: OR-ed primary keys (or the arms of a UNION ALL) each cost MariaDB a range analysis
with index dives — 13–17 ms per 100 keys of a read-ahead bundle, 13–20 ms per 100
versions a garbage-collection DELETE names — while the join reads each by `ref` on the
primary key (4.5 and 3–6 ms; bench part 6 measures the bundle). These tests run the real
statements on the MariaDB test server: what they return and delete equals the base
class's statements, and EXPLAIN shows the plan the docstrings claim."""

from __future__ import annotations

import pytest
from test_stores import KG, SID, branch, row, write

from pyflink_ndb.checkpoint.gc import Deletion
from pyflink_ndb.stores import StateStore
from pyflink_ndb.stores import mysql as mysql_store
from pyflink_ndb.stores.base import CHUNK_BYTES
from pyflink_ndb.stores.lineage import own_range, version_of

KEYS = [b"k%03d" % i for i in range(40)]


@pytest.fixture
def filled(store_factory):
    """A MySQL store with 40 entries in 3 versions each (the middle one over 3 chunks for
    a few), key groups KG and KG + 1; returns (store, fence)."""
    store = store_factory("mysql")
    fence = branch(store)
    big = bytes(range(256)) * (CHUNK_BYTES // 256 * 2 + 1)
    for epoch in (1, 2, 3):
        write(store, fence, epoch, [row(k, big if epoch == 2 and i % 10 == 0 else
                                        b"%s@%d" % (k, epoch), kg=KG + i % 2)
                                    for i, k in enumerate(KEYS)])
    return store, fence


def with_base_statements(store: StateStore, read):
    """What `read()` returns with the base class's statements (the engine taken for NDB's,
    which keeps them), run on the same MariaDB tables."""
    engine, store.engine = store.engine, "NDBCLUSTER"
    try:
        return read()
    finally:
        store.engine = engine


def state_access(store: StateStore, sql: str, params=(), table: str = "s"
                 ) -> tuple[str, str]:
    """(access type, key) of the state table (alias `table`) in EXPLAIN of `sql`."""
    plan = store._query("EXPLAIN " + sql, params)
    rows = [r for r in plan if r[2] == table]
    assert len(rows) == 1, plan
    return rows[0][3], rows[0][5]


def test_each_join_reads_the_state_table_by_primary_key_ref(filled):
    store, fence = filled
    b = fence.branch
    entries = [(SID, KG + i % 2, k) for i, k in enumerate(KEYS)]
    refs = [(kg, sid, k) for sid, kg, k in entries]
    deletions = [Deletion(kg, sid, k, version_of(b, 1)) for sid, kg, k in entries]
    for sql in (mysql_store.keys_join_query(store.t_state, entries,
                                            lambda kg: (own_range(b, 3),)),
                mysql_store.versions_join_query(store.t_state, refs),
                mysql_store.delete_versions_join(store.t_state, deletions),
                mysql_store.delete_rows_join(store.t_state, [(*r, version_of(b, 1), 0)
                                                             for r in refs])):
        access, key = state_access(store, sql)
        assert access in ("ref", "eq_ref") and key == "PRIMARY", sql[:200]


def test_read_versions_and_deletes_equal_the_base_statements(filled):
    """The joins return and delete exactly what the OR-ed statements (NDB's) do."""
    store, fence = filled
    b = fence.branch
    refs = [(KG + i % 2, SID, k) for i, k in enumerate(KEYS)] + [(KG, SID, b"absent")]
    joined = store.read_versions(refs)
    assert joined == with_base_statements(store, lambda: store.read_versions(refs))
    assert joined[(KG, SID, KEYS[0])] == [(version_of(b, e), False) for e in (1, 2, 3)]
    assert joined[(KG, SID, b"absent")] == []
    rows = store.count_rows()
    store.write_batch_rows = 7  # several statements
    doomed = [Deletion(KG + i % 2, SID, k, version_of(b, 2)) for i, k in enumerate(KEYS)]
    assert store.delete_exact(fence, doomed) == 40 + 4 * 2  # 4 values of 3 chunks
    assert store.count_rows() == rows - 48
    assert store.read_versions(refs[:1]) == {refs[0]: [(version_of(b, 1), False),
                                                       (version_of(b, 3), False)]}
    # the cleanup's delete by whole primary keys: only the rows named
    assert store._delete_rows([(KG, SID, KEYS[0], version_of(b, 3), 0),
                               (KG, SID, KEYS[0], version_of(b, 3), 1),  # no such chunk
                               (KG, SID, b"absent", version_of(b, 1), 0)]) == 1
    assert store.count_rows() == rows - 49
    assert store.read_versions(refs[:1]) == {refs[0]: [(version_of(b, 1), False)]}


def test_ndb_keeps_the_base_class_statements(filled, monkeypatch):
    """With the engine detected as NDBCLUSTER no join is built (NDB's transactions stay
    bounded by `DELETE ... LIMIT`), and the answers are the same."""
    store, fence = filled
    b = fence.branch
    entries = [(SID, KG + i % 2, k) for i, k in enumerate(KEYS)]
    refs = [(kg, sid, k) for sid, kg, k in entries]
    ranges = (own_range(b, 3),)
    batch, versions = (store.read_latest_batch(entries, lambda kg: ranges),
                       store.read_versions(refs))

    def no_join(*args):
        raise AssertionError("NDB must not get the join")
    for name in ("keys_join_query", "versions_join_query", "delete_versions_join",
                 "delete_rows_join"):
        monkeypatch.setattr(mysql_store, name, no_join)
    store.engine = "NDBCLUSTER"
    assert store.read_latest_batch(entries, lambda kg: ranges) == batch
    assert len(batch) == 40
    assert store.read_versions(refs) == versions
    assert store.delete_exact(fence, [Deletion(kg, sid, k, version_of(b, 1))
                                      for sid, kg, k in entries]) == 40
    assert store._delete_rows([(kg, sid, k, version_of(b, 3), 0)
                               for sid, kg, k in entries[:5]]) == 5


def test_point_reads_name_the_primary_key(filled, monkeypatch):
    """A point read and a read of several keys of one key group name the primary key
    (`FORCE INDEX (PRIMARY)`): without it MariaDB also estimates the cleanup index with
    index dives (Statistics 0.13 against 0.05 ms; 0.29–0.44 against 0.21–0.29 ms per
    read here)."""
    store, fence = filled
    ranges = (own_range(fence.branch, 3),)
    seen = []
    execute = store._execute
    monkeypatch.setattr(store, "_execute",
                        lambda text, params=(): seen.append((text, params))
                        or execute(text, params))
    assert store.read_latest(SID, KG, KEYS[0], ranges).value == KEYS[0] + b"@3"
    assert len(store.read_latest_many(SID, KG, KEYS[:6:2], ranges)) == 3
    monkeypatch.undo()
    assert len(seen) == 2
    for text, params in seen:
        assert "FORCE INDEX (PRIMARY)" in text
        access, key = state_access(store, store._sql(text), params, table=store.t_state)
        assert key == "PRIMARY", text


def test_duplicate_refs_and_long_lineages_answer_like_the_base_statements(filled,
                                                                         monkeypatch):
    """A ref named twice lists its versions once (as the OR-ed statement does); a key group
    that sees more than `MAX_JOIN_RANGES` version ranges (a lineage of many restores) is
    read with the UNION ALL, not a derived table of that many columns."""
    store, fence = filled
    b = fence.branch
    refs = [(KG, SID, KEYS[0]), (KG + 1, SID, KEYS[1]), (KG, SID, KEYS[0])]
    assert store.read_versions(refs) == with_base_statements(
        store, lambda: store.read_versions(refs))
    assert store.read_versions(refs)[(KG, SID, KEYS[0])] == [
        (version_of(b, e), False) for e in (1, 2, 3)]
    many = tuple((10**12 + 10 * j, 10**12 + 10 * j + 5)
                 for j in range(mysql_store.MAX_JOIN_RANGES)) + (own_range(b, 3),)
    entries = [(SID, KG + i % 2, k) for i, k in enumerate(KEYS)]
    expected = StateStore.read_latest_batch(store, entries, lambda kg: many)

    def no_join(*args):
        raise AssertionError("too many ranges for a join")
    monkeypatch.setattr(mysql_store, "keys_join_query", no_join)
    got = store.read_latest_batch(entries, lambda kg: many)
    assert got == expected and len(got) == 40
    assert got[(SID, KEYS[0])].version == version_of(b, 3)
