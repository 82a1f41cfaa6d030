"""The store contract (tier 3), run on SQLite and on the MySQL-protocol server."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import pymysql
import pytest
from conftest import mysql_connect, unique_namespace
from pyflink.common.typeinfo import Types
from pyflink.datastream.state import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.errors import StateCompatibilityError, StoreUnavailableError
from pyflink_ndb.serialization import encode_key, encode_value, value_json
from pyflink_ndb.serialization.keys import encode_map_key
from pyflink_ndb.stores import StateStore, WriteRow, open_store
from pyflink_ndb.stores.base import CHUNK_BYTES, FORMAT_VERSION
from pyflink_ndb.testing import LocalSubtask

SID = 7
OTHER_SID = 8
KG = 3

#: Byte and text values that trip drivers, collations and JSON columns.
EDGE_VALUES: list[Any] = [
    b"", "", "\x00abc", b"\xff\xfe", b"\x00", "😀", "e\u0301", "\u00e9", "\U0001d11e",
    "a\U0001f468\u200d\U0001f469\u200d\U0001f467b", "\ufeff", "'\"\\;--", b"\\'\"",
]


def row(ukey: bytes, value: bytes | None, *, kg: int = KG, sid: int = SID,
        expires: int | None = None, value_json: str | None = None) -> WriteRow:
    return WriteRow(kg, sid, ukey, value is None, value, value_json, expires)


def latest_value(store: StateStore, ukey: bytes, max_epoch: int | None = None,
                 kg: int = KG, sid: int = SID) -> bytes | None:
    version = store.read_latest(sid, kg, ukey, max_epoch)
    assert version is not None
    return version.value


def scan_all(store: StateStore, prefix: bytes, page: int, kg: int = KG, sid: int = SID
             ) -> Iterator[tuple[bytes, Any]]:
    after = None
    while True:
        rows = store.scan_latest(sid, kg, prefix, after, page)
        assert len(rows) <= page
        yield from rows
        if len(rows) < page:
            return
        after = rows[-1][0]


# -- writes and reads -------------------------------------------------------------------

def test_write_epoch_and_read_latest(store: StateStore) -> None:
    assert store.read_latest(SID, KG, b"k") is None
    store.write_epoch(1, [row(b"k", b"v1"), row(b"j", b"j1")])
    store.write_epoch(2, [row(b"k", b"v2")])
    store.write_epoch(5, [row(b"k", b"v5", expires=123)])

    newest = store.read_latest(SID, KG, b"k")
    assert newest is not None
    assert (newest.epoch, newest.tombstone, newest.value, newest.expires_at_ms) == \
        (5, False, b"v5", 123)
    assert latest_value(store, b"k", max_epoch=4) == b"v2"
    assert latest_value(store, b"k", max_epoch=1) == b"v1"
    assert store.read_latest(SID, KG, b"k", max_epoch=0) is None
    assert latest_value(store, b"j") == b"j1"
    # Other key group, other state id, prefix of the key: not the same entry.
    assert store.read_latest(SID, KG + 1, b"k") is None
    assert store.read_latest(OTHER_SID, KG, b"k") is None
    assert store.read_latest(SID, KG, b"") is None


def test_write_epoch_is_an_idempotent_upsert(store: StateStore) -> None:
    assert store.write_epoch(3, [row(b"k", b"first")]) == 1
    assert store.write_epoch(3, [row(b"k", b"second")]) == 1
    assert latest_value(store, b"k") == b"second"
    assert store.count_rows() == 1


def test_rewrite_of_a_chunked_version_with_fewer_chunks(store: StateStore) -> None:
    big = random.Random(1).randbytes(3 * CHUNK_BYTES + 17)
    store.write_epoch(4, [row(b"k", big)])
    store.write_epoch(4, [row(b"k", b"small")])
    assert latest_value(store, b"k") == b"small"
    store.write_epoch(4, [row(b"k", big[: CHUNK_BYTES + 1])])
    assert latest_value(store, b"k") == big[: CHUNK_BYTES + 1]
    assert store.scan_latest(SID, KG, b"", None, 10)[0][1].value == big[: CHUNK_BYTES + 1]


def test_write_batches_respect_batch_size(store_kind: str,
                                          store_factory: Callable[..., StateStore]) -> None:
    store = store_factory(store_kind)
    store.write_batch_rows = 7
    written = store.write_epoch(1, [row(b"k%04d" % i, b"v%d" % i) for i in range(100)])
    assert written == 100
    assert store.count_rows() == 100
    assert [latest_value(store, b"k%04d" % i) for i in range(100)] == \
        [b"v%d" % i for i in range(100)]


def test_tombstones(store: StateStore) -> None:
    store.write_epoch(1, [row(b"k", b"v1")])
    store.write_epoch(2, [row(b"k", None)])
    tomb = store.read_latest(SID, KG, b"k")
    assert tomb is not None
    assert (tomb.epoch, tomb.tombstone, tomb.value) == (2, True, None)
    assert latest_value(store, b"k", max_epoch=1) == b"v1"
    scanned = store.scan_latest(SID, KG, b"", None, 10)
    assert [(u, v.tombstone, v.value) for u, v in scanned] == [(b"k", True, None)]
    store.write_epoch(3, [row(b"k", b"v3")])
    assert latest_value(store, b"k") == b"v3"
    # The committed view never shows tombstones.
    store.commit_epoch("op", 2)
    assert store.query_committed() == []


# -- scans ------------------------------------------------------------------------------

def test_scan_latest_pages_over_more_rows_than_a_page(store: StateStore) -> None:
    n = 2_345
    prefix = encode_key("flink-key")
    ukeys = [prefix + encode_map_key(i) for i in range(n)]
    store.write_epoch(1, [row(u, b"e1-%d" % i) for i, u in enumerate(ukeys)])
    # A second epoch overwrites every third entry and deletes every fifth.
    second = []
    for i, u in enumerate(ukeys):
        if i % 5 == 0:
            second.append(row(u, None))
        elif i % 3 == 0:
            second.append(row(u, b"e2-%d" % i))
    store.write_epoch(2, second)
    # Neighbours that must stay outside the prefix.
    other = encode_key("flink-kez")
    store.write_epoch(1, [row(other + encode_map_key(0), b"x"), row(b"\x00", b"y"),
                          row(prefix + encode_map_key(1), b"other-sid", sid=OTHER_SID),
                          row(prefix + encode_map_key(1), b"other-kg", kg=KG + 1)])

    seen = list(scan_all(store, prefix, page=1000))
    assert [u for u, _ in seen] == sorted(ukeys)
    by_key = dict(seen)
    for i, u in enumerate(ukeys):
        version = by_key[u]
        if i % 5 == 0:
            assert version.tombstone and version.value is None and version.epoch == 2
        elif i % 3 == 0:
            assert (version.value, version.epoch) == (b"e2-%d" % i, 2)
        else:
            assert (version.value, version.epoch) == (b"e1-%d" % i, 1)
    # Smaller pages give the same sequence; `after` excludes the given key itself.
    assert [u for u, _ in scan_all(store, prefix, page=333)] == sorted(ukeys)
    middle = sorted(ukeys)[1000]
    rest = store.scan_latest(SID, KG, prefix, middle, 5000)
    assert [u for u, _ in rest] == sorted(ukeys)[1001:]


def test_scan_prefix_of_ff_bytes(store: StateStore) -> None:
    store.write_epoch(1, [row(b"\xff\xff", b"a"), row(b"\xff\xff\x00", b"b"),
                          row(b"\xff\xfe", b"c"), row(b"\xff", b"d")])
    assert [u for u, _ in store.scan_latest(SID, KG, b"\xff\xff", None, 10)] == \
        [b"\xff\xff", b"\xff\xff\x00"]
    assert [u for u, _ in store.scan_latest(SID, KG, b"", None, 10)] == \
        [b"\xff", b"\xff\xfe", b"\xff\xff", b"\xff\xff\x00"]


def test_scan_key_groups_for_eager_restore(store: StateStore) -> None:
    store.write_epoch(1, [row(b"a%d" % i, b"v", kg=kg) for kg in range(5) for i in range(7)])
    found = list(store.scan_key_groups([SID], 1, 3, page_rows=3))
    assert sorted((kg, u) for _, kg, u, _ in found) == \
        sorted((kg, b"a%d" % i) for kg in range(1, 4) for i in range(7))


# -- roll-back, commit markers, garbage collection --------------------------------------

def test_rollback_after(store: StateStore) -> None:
    for epoch in (1, 2, 3):
        store.write_epoch(epoch, [row(b"k", b"v%d" % epoch),
                                  row(b"k", b"o%d" % epoch, kg=KG + 10),
                                  row(b"k", b"s%d" % epoch, sid=OTHER_SID)])
    removed = store.rollback_after([SID], KG - 1, KG + 1, 1)
    assert removed == 2
    assert latest_value(store, b"k") == b"v1"
    # Outside the key-group range or the state ids: untouched.
    assert latest_value(store, b"k", kg=KG + 10) == b"o3"
    assert latest_value(store, b"k", sid=OTHER_SID) == b"s3"
    assert store.rollback_after([SID, OTHER_SID], 0, 100, 0) == 7
    assert store.count_rows() == 0


def test_rollback_removes_every_chunk(store: StateStore) -> None:
    big = bytes(range(256)) * (CHUNK_BYTES // 256 * 2 + 1)
    store.write_epoch(1, [row(b"k", b"small")])
    store.write_epoch(2, [row(b"k", big)])
    assert latest_value(store, b"k") == big
    store.rollback_after([SID], KG, KG, 1)
    assert latest_value(store, b"k") == b"small"
    assert store.count_rows([SID]) == 1


def test_commit_markers(store: StateStore) -> None:
    assert store.latest_committed_epoch("op") is None
    assert store.committed_epochs("op") == []
    store.commit_epoch("op", 2)
    store.commit_epoch("op", 1)
    store.commit_epoch("op", 2)  # idempotent
    store.commit_epoch("op", 5, is_savepoint=True)
    store.commit_epoch("other", 9)
    assert store.committed_epochs("op") == [(1, False), (2, False), (5, True)]
    # A savepoint pin is no completed checkpoint.
    assert store.latest_committed_epoch("op") == 2
    store.commit_epoch("op", 5)
    assert store.committed_epochs("op") == [(1, False), (2, False), (5, False), (5, True)]
    assert store.latest_committed_epoch("op") == 5
    assert store.release_savepoint("op", 5) == 1
    assert store.committed_epochs("op") == [(1, False), (2, False), (5, False)]
    store.delete_commit_markers("op", after_epoch=1)
    assert store.committed_epochs("op") == [(1, False)]
    store.delete_commit_markers("op")
    assert store.committed_epochs("op") == []
    assert store.committed_epochs("other") == [(9, False)]


def test_committed_view_reads_the_latest_committed_version(store: StateStore) -> None:
    sid = store.register_state("op", "v", "value", "pickle-5", None)
    ukey = encode_key("k")
    store.write_epoch(1, [row(ukey, encode_value(1), sid=sid, value_json="1")])
    store.write_epoch(2, [row(ukey, encode_value(2), sid=sid, value_json="2")])
    store.commit_epoch("op", 1)
    rows = store.query_committed("op", "v")
    assert [(r["ukey"], r["epoch"], r["vbytes"]) for r in rows] == [(ukey, 1, encode_value(1))]
    assert json.loads(rows[0]["vjson"]) == 1
    store.commit_epoch("op", 2)
    assert [r["epoch"] for r in store.query_committed("op", "v")] == [2]


def test_delete_versions_and_expired(store: StateStore) -> None:
    from pyflink_ndb.checkpoint.gc import Deletion

    for epoch in (1, 2, 3, 4):
        store.write_epoch(epoch, [row(b"k", b"v%d" % epoch)])
    store.write_epoch(1, [row(b"ttl-old", b"x", expires=1_000),
                          row(b"ttl-new", b"y", expires=5_000)])
    assert store.delete_versions([Deletion(KG, SID, b"k", "<", 3),
                                  Deletion(KG, SID, b"k", "=", 4)]) == 3
    assert latest_value(store, b"k") == b"v3"
    assert store.delete_expired([SID], KG, KG, now=2_000) == 1
    assert store.read_latest(SID, KG, b"ttl-old") is None
    assert latest_value(store, b"ttl-new") == b"y"


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
    big = random.Random(16).randbytes(16 * 1024 * 1024)
    store.write_epoch(1, [row(b"big", big), row(b"small", b"s")])
    assert store.count_rows() == 16 * 1024 * 1024 // CHUNK_BYTES + 1
    assert latest_value(store, b"big") == big
    scanned = dict(store.scan_latest(SID, KG, b"", None, 10))
    assert scanned[b"big"].value == big
    assert scanned[b"small"].value == b"s"


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
    rows = _edge_rows(SID)
    store.write_epoch(1, rows)
    for r in rows:
        version = store.read_latest(SID, KG, r.ukey)
        assert version is not None and version.value == r.value
    scanned = dict(store.scan_latest(SID, KG, b"", None, 1000))
    assert {u: v.value for u, v in scanned.items()} == {r.ukey: r.value for r in rows}


class WarningCollector:
    """Runs `SHOW WARNINGS` on the store's own connection after every statement."""

    def __init__(self, store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.warnings: list[tuple[str, tuple[Any, ...]]] = []
        self._store = store
        execute, executemany = store._execute, store._executemany

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

        monkeypatch.setattr(store, "_execute", checked_execute)
        monkeypatch.setattr(store, "_executemany", checked_executemany)

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
    rows = _edge_rows(sid)
    store.write_epoch(1, rows)
    store.commit_epoch("raw-op", 1)
    for r in rows:
        version = store.read_latest(sid, KG, r.ukey)
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

    # INSERT IGNORE of an existing catalog entry or commit marker is the intended
    # idempotence (note 1062); any other warning would mean altered data.
    data_warnings = [w for w in collector.warnings
                     if not (w[0].startswith("INSERT IGNORE") and w[1][1] == 1062)]
    assert data_warnings == []
    # What SQL readers see: the bytes column byte-identical, the JSON column the same text.
    conn = mysql_connect(mysql_url)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT ukey, vbytes, vjson FROM {store.t_state} WHERE state_id = %s "
                        "AND epoch = 1", (sid,))
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
