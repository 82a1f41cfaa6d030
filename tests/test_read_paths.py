"""The documented point reads of the committed state on the MySQL-protocol server
(README, "SQL views"; pyflink_ndb.stores.views): by primary key on the state table (the
version ranges read once, or joined from `<ns>_committed_ranges`), through
`<ns>_committed` by primary key and by `kjson`. Each returns the committed values (not
a pending checkpoint's, not a deleted entry), and EXPLAIN shows the state table read by
an index, never scanned. Also: the `kjson_key` index of the InnoDB DDL, and how
`pyflink-ndb views create` adds it to a namespace made before it existed. No timings here
(bench part `reads` measures them)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pymysql
import pytest
from conftest import drop_namespace, fast_tmpdir, mysql_connect, unique_namespace
from pyflink.common import Types
from pyflink.datastream.state import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.serialization.keys import encode_key, encode_map_key
from pyflink_ndb.stores import open_store, views
from pyflink_ndb.stores.base import StateStore
from pyflink_ndb.stores.mysql import (
    KJSON_KEY_CHARS,
    KJSON_KEY_COLUMN,
    MysqlStateStore,
    kjson_index_ddl,
    mysql_ddl,
)
from pyflink_ndb.testing import CheckpointStorage, LocalSubtask, key_group_ranges, local_key_group

pytestmark = pytest.mark.mysql

OPERATOR = "profiles"
KEYS = [f"user-{i:05d}" for i in range(1_500)]
#: A key whose JSON is longer than the indexed column holds.
LONG_KEY = "L" * (KJSON_KEY_CHARS + 40)
#: Keys with a ListState too.
LISTED = KEYS[:40]
DELETED = KEYS[7]
#: Access types of an index (EXPLAIN `type`); `ALL` (and `index`: the whole index) scan.
INDEX_ACCESS = {"const", "eq_ref", "ref", "range", "ref_or_null"}


@dataclass
class Model:
    """What readers must see at the committed checkpoint (3), and what they must not."""

    store: StateStore
    namespace: str
    profile: dict[str, list[Any]] = field(default_factory=dict)
    visits: dict[str, dict[str, int]] = field(default_factory=dict)
    history: dict[str, list[str]] = field(default_factory=dict)
    state_ids: dict[str, int] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)
    subtasks: list[LocalSubtask] = field(default_factory=list)
    states: list[dict[str, Any]] = field(default_factory=list)


def _states(task: LocalSubtask) -> dict[str, Any]:
    ctx = task.context
    return {"profile": ctx.get_state(ValueStateDescriptor("profile", Types.PICKLED_BYTE_ARRAY())),
            "visits": ctx.get_map_state(MapStateDescriptor("visits", Types.STRING(),
                                                           Types.LONG())),
            "history": ctx.get_list_state(ListStateDescriptor("history", Types.STRING()))}


def _owner(key: str) -> int:
    a, b = key_group_ranges(2)[0]
    return 0 if a <= local_key_group(key) <= b else 1


@pytest.fixture(scope="module")
def model(mysql_url: str) -> Iterator[Model]:
    """Checkpoints 1 and 2 of one job (two subtasks), checkpoint 3 of a second job that
    restored 2 (new branches: the committed ranges span two branches per segment), in
    which one key's value is deleted; then checkpoint 4 is written but never completes."""
    namespace = unique_namespace("reads")
    store = open_store(NdbStateOptions(url=mysql_url, namespace=namespace))
    storage = CheckpointStorage()
    ranges = key_group_ranges(2)
    dirs: list[str] = []
    m = Model(store, namespace)

    def start(restore: int | None) -> None:
        m.subtasks = []
        for index, (a, b) in enumerate(ranges):
            dirs.append(fast_tmpdir("read-paths-"))
            m.subtasks.append(LocalSubtask(store, NdbStateOptions(cache_max_entries=200),
                                           operator=OPERATOR, subtask_index=index,
                                           key_group_start=a, key_group_end=b,
                                           local_dir=dirs[-1], storage=storage,
                                           restored_checkpoint_id=restore))
        m.states = [_states(t) for t in m.subtasks]

    def put(key: str, epoch: int, model: bool = True) -> None:
        i = _owner(key)
        m.subtasks[i].key(key)
        value = [epoch, key, len(key)]
        m.states[i]["profile"].update(value)
        if model:
            m.profile[key] = value

    def checkpoint(n: int, complete: bool = True) -> None:
        for task in m.subtasks:
            task.snapshot(n)
        if complete:
            for task in m.subtasks:
                task.complete(n)

    try:
        start(None)
        for key in [*KEYS, LONG_KEY]:
            put(key, 1)
            st = m.states[_owner(key)]
            pages = {"home": len(key), "cart": 1}
            for page, count in pages.items():
                st["visits"].put(page, count)
            m.visits[key] = pages
            if key in LISTED:
                st["history"].add("a")
                m.history[key] = ["a"]
        checkpoint(1)
        for key in KEYS[::5]:
            put(key, 2)
        for key in LISTED[::2]:
            m.subtasks[_owner(key)].key(key)
            m.states[_owner(key)]["history"].add("b")
            m.history[key].append("b")
        checkpoint(2)
        for task in m.subtasks:
            task.close()
        start(2)
        for key in KEYS[::7]:
            put(key, 3)
        m.subtasks[_owner(DELETED)].key(DELETED)
        m.states[_owner(DELETED)]["profile"].clear()
        del m.profile[DELETED]
        checkpoint(3)
        for key in KEYS[1::3]:  # written, snapshotted, never completed: no reader sees it
            put(key, 4, model=False)
            m.pending.add(key)
        checkpoint(4, complete=False)
        m.state_ids = {r["state_name"]: r["state_id"] for r in store.catalog(OPERATOR)}
        # The statistics InnoDB recalculates in the background after the bulk writes (>10 %
        # of the rows changed), now: the plans are those of a table that has been written.
        store._query(f"ANALYZE TABLE {store.t_state}")
        views.create_views(store)
        yield m
    finally:
        for task in m.subtasks:
            task.close()
        conn = mysql_connect(mysql_url)
        with conn.cursor() as cur:
            for view in views.view_names(namespace):
                cur.execute(f"DROP VIEW IF EXISTS {view}")
        conn.close()
        store.close()
        drop_namespace(mysql_url, namespace)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def cur(model: Model, mysql_url: str) -> Iterator[Any]:
    conn = mysql_connect(mysql_url)
    try:
        with conn.cursor() as cursor:
            yield cursor
    finally:
        conn.close()


def fetch(cur: Any, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    cur.execute(sql, tuple(params))
    return list(cur.fetchall())


def committed_ranges(cur: Any, model: Model) -> tuple[str, dict[int, list[int]]]:
    """The committed descriptor and, per key group, the flat `lo, hi, ...` of its ranges."""
    rows = fetch(cur, views.ranges_query(model.namespace), (OPERATOR,))
    committed = {r[5] for r in rows}
    assert len(committed) == 1
    by_group = {kg: [x for a, b, lo, hi, _, _ in rows if a <= kg <= b for x in (lo, hi)]
                for kg in range(128)}
    return committed.pop(), by_group


def pk_read(cur: Any, model: Model, key: str, committed: str,
            by_group: dict[int, list[int]], state: str = "profile",
            ukey: bytes | None = None) -> list[tuple[Any, ...]]:
    kg = local_key_group(key)
    flat = by_group[kg]
    return fetch(cur, views.point_read_query(model.namespace, len(flat) // 2),
                 [OPERATOR, committed, kg, model.state_ids[state],
                  encode_key(key) if ukey is None else ukey, *flat])


def sample() -> list[str]:
    return [*KEYS[::37], DELETED, *LISTED[:3], *sorted(set(KEYS[1::3]))[:5]]


def test_the_committed_ranges_span_both_jobs(cur, model: Model):
    _, by_group = committed_ranges(cur, model)
    assert all(len(flat) == 4 for flat in by_group.values())  # ancestor + own branch


def test_point_reads_by_primary_key_return_the_committed_values(cur, model: Model):
    committed, by_group = committed_ranges(cur, model)
    for key in sample():
        (row,) = pk_read(cur, model, key, committed, by_group)
        current, version, tombstone, vjson, chunks, expires = row
        assert current == 1 and chunks == 1 and expires is None
        if key == DELETED:
            assert tombstone == 1 and vjson is None  # deleted in checkpoint 3
            continue
        assert tombstone == 0 and json.loads(vjson) == model.profile[key], key
        assert version & 0xFFFFFFFF == model.profile[key][0]  # the epoch that wrote it
        joined = fetch(cur, views.ranges_point_read_query(model.namespace),
                       [OPERATOR, local_key_group(key), model.state_ids["profile"],
                        encode_key(key)])
        assert [r[:3] for r in joined] == [(version, 0, vjson)]
    # A map entry: its ukey is the key's and the map key's.
    key = KEYS[3]
    (row,) = pk_read(cur, model, key, committed, by_group, "visits",
                     encode_key(key) + encode_map_key("home"))
    assert row[0] == 1 and json.loads(row[3]) == len(key)
    assert pk_read(cur, model, "no-such-key", committed, by_group) == []


def test_batch_validated_reads_pick_the_committed_version(cur, model: Model):
    """Every stored version by primary key, the ranges' one picked by the client: the
    same answers as the fast path, although checkpoint 4's newer versions of a third of
    the keys are stored (written, never completed); `committed` is unchanged after the
    batch, which validates it."""
    committed, by_group = committed_ranges(cur, model)
    pairs = {kg: list(zip(flat[0::2], flat[1::2], strict=True))
             for kg, flat in by_group.items()}
    sql = views.versions_read_query(model.namespace)
    newer_stored = 0
    for key in sample():
        kg = local_key_group(key)
        rows = fetch(cur, sql, [kg, model.state_ids["profile"], encode_key(key)])
        row = views.newest_in_ranges(rows, pairs[kg])
        (fast,) = pk_read(cur, model, key, committed, by_group)
        assert row is not None and tuple(row[:3]) == (fast[1], fast[2], fast[3]), key
        newer_stored += any(r[0] > row[0] for r in rows)
    assert newer_stored >= 3, "the sample holds keys with versions of checkpoint 4"
    assert views.newest_in_ranges(
        fetch(cur, sql, [local_key_group("no-such-key"), model.state_ids["profile"],
                         encode_key("no-such-key")]), pairs[0]) is None
    assert fetch(cur, views.committed_query(model.namespace), [OPERATOR]) == [(committed,)]


def test_newest_in_ranges_takes_the_greatest_version_inside_a_range():
    rows = [(5, 0, "a"), (12, 0, "b"), (30, 1, None), (7, 0, "c")]
    assert views.newest_in_ranges(rows, [(0, 10)]) == (7, 0, "c")
    assert views.newest_in_ranges(rows, [(0, 6), (11, 20)]) == (12, 0, "b")
    assert views.newest_in_ranges(rows, [(0, 40)]) == (30, 1, None)  # a tombstone
    assert views.newest_in_ranges(rows, [(13, 29)]) is None
    assert views.newest_in_ranges([], [(0, 40)]) is None


def test_the_view_by_primary_key_returns_the_committed_entry(cur, model: Model):
    sql = views.view_point_read_query(model.namespace)
    for key in sample():
        rows = fetch(cur, sql, [OPERATOR, "profile", local_key_group(key), encode_key(key)])
        if key == DELETED:
            assert rows == []
            continue
        ((kind, mkey, vjson, checkpoint),) = rows
        assert kind == "value" and mkey is None and checkpoint == 3
        assert json.loads(vjson) == model.profile[key]
    key = KEYS[11]
    ((kind, mkey, vjson, _),) = fetch(cur, sql, [OPERATOR, "visits", local_key_group(key),
                                                 encode_key(key) + encode_map_key("cart")])
    assert (kind, json.loads(mkey), json.loads(vjson)) == ("map", "cart", 1)
    # The leaner view of stored entry rows answers the same, by primary key and by key.
    rows_pk, rows_key = (views.rows_point_read_query(model.namespace),
                         views.rows_key_query(model.namespace))
    for key in sample():
        rows = fetch(cur, rows_pk, [OPERATOR, "profile", local_key_group(key), encode_key(key)])
        assert [json.loads(r[1]) for r in rows] == ([] if key == DELETED
                                                     else [model.profile[key]])
        by_state: dict[str, list[Any]] = {}
        for state, _ukey, vjson, *_ in fetch(cur, rows_key, [OPERATOR, json.dumps(key)]):
            by_state.setdefault(state, []).append(None if vjson is None else json.loads(vjson))
        assert sorted(by_state["visits"]) == sorted(model.visits[key].values())
        assert by_state.get("profile") == ([model.profile[key]] if key in model.profile
                                           else None)



def test_bench_models_of_the_view_read_what_the_view_reads(cur, model: Model):
    """Bench part 6's models of what a view costs (bench.reads.model_views) are measured
    against the documented view: `NS_model_rows` (the rows view on a table of the ranges)
    answers exactly as `NS_committed_rows`, and `NS_model_rows_all` (no newest-version
    check) returns every visible version, the newest of which is the view's row."""
    from bench.reads import model_views

    create, drop = model_views(model.namespace, views.views_sql(model.store)[1])
    _, by_group = committed_ranges(cur, model)
    rows_pk = views.rows_point_read_query(model.namespace)
    try:
        for statement in create:
            cur.execute(statement)
        older = 0
        for key in sample():
            params = [OPERATOR, "profile", local_key_group(key), encode_key(key)]
            want = fetch(cur, rows_pk, params)
            assert fetch(cur, rows_pk.replace("_committed_rows", "_model_rows"),
                         params) == want, key
            every = fetch(cur, f"SELECT version, vjson FROM {model.namespace}_model_rows_all"
                               " WHERE operator = %s AND state = %s AND key_group = %s AND "
                               "ukey = %s ORDER BY version", params)
            if key != DELETED:  # without the check, its older version shows (a model)
                assert [r[1] for r in every[-1:]] == [r[1] for r in want], key
            older += len(every) > 1
            flat = by_group[local_key_group(key)]
            pairs = list(zip(flat[0::2], flat[1::2], strict=True))
            assert all(any(lo <= v <= hi for lo, hi in pairs) for v, _ in every)
        assert older, "the sample holds keys with an older visible version (checkpoint 1)"
        plain = fetch(cur, f"SELECT COUNT(*) FROM {model.namespace}_model_plain", [])
        assert plain == fetch(cur, f"SELECT COUNT(*) FROM {model.store.t_state}", [])
    finally:
        for statement in drop:
            cur.execute(statement)
    with pytest.raises(ValueError, match="model_views"):
        model_views(model.namespace, "CREATE OR REPLACE VIEW x AS SELECT 1")

def by_key(rows: Sequence[tuple[Any, ...]]) -> dict[tuple[str, Any], Any]:
    return {(state, None if mkey is None else json.loads(mkey)): json.loads(vjson)
            for state, mkey, vjson, *_ in rows}


def expected(model: Model, key: str) -> dict[tuple[str, Any], Any]:
    want: dict[tuple[str, Any], Any] = {("visits", k): v for k, v in model.visits[key].items()}
    if key in model.profile:
        want[("profile", None)] = model.profile[key]
    if key in model.history:
        want[("history", None)] = model.history[key]
    return want


def test_the_view_by_kjson_returns_every_state_of_the_key(cur, model: Model):
    sql = views.view_key_query(model.namespace)
    for key in sample():
        rows = fetch(cur, sql, [OPERATOR, json.dumps(key)])
        assert by_key(rows) == expected(model, key), key
        assert {r[4] for r in rows} == {3}
    # A key whose JSON is longer than the index holds has no `kjson` in the view; its
    # `key_text` (no index) still finds it.
    assert fetch(cur, sql, [OPERATOR, json.dumps(LONG_KEY)]) == []
    text = sql.replace("kjson = %s", "key_text = %s")
    assert by_key(fetch(cur, text, [OPERATOR, LONG_KEY])) == expected(model, LONG_KEY)


def state_table_access(cur: Any, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
    """The EXPLAIN rows that read the state table (aliases `s` and `t` in the views and
    the documented queries)."""
    cur.execute("EXPLAIN " + sql, tuple(params))
    names = [d[0] for d in cur.description]
    plan = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    rows = [r for r in plan if r["table"] in ("s", "t")]
    assert rows, plan
    return rows


def assert_indexed(rows: Sequence[dict[str, Any]]) -> None:
    for r in rows:
        assert r["type"] in INDEX_ACCESS and r["key"], rows


def assert_reads_the_table(rows: Sequence[dict[str, Any]]) -> None:
    """The entry rows (the first access) are found by reading the table, or every row of
    a state through `ix_cleanup` (state_id first): no index has the key."""
    first = rows[0]
    assert first["type"] == "ALL" or first["key"] == "ix_cleanup", rows


def test_explain_shows_index_lookups_for_the_documented_reads(cur, model: Model):
    committed, by_group = committed_ranges(cur, model)
    key = KEYS[42]
    kg, ukey, sid = local_key_group(key), encode_key(key), model.state_ids["profile"]
    flat = by_group[kg]
    pk = state_table_access(cur, views.point_read_query(model.namespace, len(flat) // 2),
                            [OPERATOR, committed, kg, sid, ukey, *flat])
    assert_indexed(pk)
    assert [r["key"] for r in pk] == ["PRIMARY"]
    joined = state_table_access(cur, views.ranges_point_read_query(model.namespace),
                                [OPERATOR, kg, sid, ukey])
    assert_indexed(joined)
    assert [r["key"] for r in joined] == ["PRIMARY"]
    view_pk = state_table_access(cur, views.view_point_read_query(model.namespace),
                                 [OPERATOR, "profile", kg, ukey])
    assert_indexed(view_pk)
    view_key = state_table_access(cur, views.view_key_query(model.namespace),
                                  [OPERATOR, json.dumps(key)])
    assert_indexed(view_key)
    # The entry rows are found through the kjson index (the others are the newest-version
    # check and a list's segments, by primary key).
    assert view_key[0]["key"] == "ix_kjson"
    for sql, params in ((views.rows_point_read_query(model.namespace),
                         [OPERATOR, "profile", kg, ukey]),
                        (views.rows_key_query(model.namespace), [OPERATOR, json.dumps(key)])):
        assert_indexed(state_table_access(cur, sql, params))
    # `key_text` has no index: the view reads the table, or every row of the operator's
    # states through `ix_cleanup` (what README says).
    text = views.view_key_query(model.namespace).replace("kjson = %s", "key_text = %s")
    assert_reads_the_table(state_table_access(cur, text, [OPERATOR, key]))


def test_the_point_read_tells_when_its_ranges_are_old(cur, model: Model):
    """Ranges read before a completion: the same statement reports them stale (`current`
    0); read again, they show the new checkpoint. (Last of the tests on `model`: it
    completes the pending checkpoint 4.)"""
    committed, by_group = committed_ranges(cur, model)
    descriptor = model.store.read_operator(OPERATOR).committed
    assert descriptor is not None and descriptor.to_json() == committed
    key = sorted(model.pending)[0]
    assert pk_read(cur, model, key, committed, by_group)[0][0] == 1
    for task in model.subtasks:
        task.complete(4)
    (stale,) = pk_read(cur, model, key, committed, by_group)
    assert stale[0] == 0
    committed, by_group = committed_ranges(cur, model)
    ((current, _, tombstone, vjson, _, _),) = pk_read(cur, model, key, committed, by_group)
    assert (current, tombstone, json.loads(vjson)) == (1, 0, [4, key, len(key)])


def test_the_innodb_ddl_has_the_kjson_index_and_ndb_keeps_its_ddl():
    store = MysqlStateStore("mysql://root@127.0.0.1:1/test", "ddl_ns")  # never connects
    innodb, ndb = mysql_ddl(store, ndb=False)[0], mysql_ddl(store, ndb=True)[0]
    assert KJSON_KEY_COLUMN in innodb and "KEY ix_kjson (kjson_key)" in innodb
    assert "VIRTUAL" in KJSON_KEY_COLUMN
    assert "kjson_key" not in ndb and "ix_kjson" not in ndb  # NDB indexes no virtual column
    alter = kjson_index_ddl(store)
    assert all(s.startswith("ALTER TABLE ddl_ns_state ADD ") and
               s.endswith("ALGORITHM=INPLACE, LOCK=NONE") for s in alter)


def test_views_create_adds_the_index_to_a_namespace_made_before_it(mysql_url: str):
    """A state table without `kjson_key` (an earlier release): views over the JSON
    column (kjson lookups read the table), and `views create` adds the column and the
    index online, once; the values are the same either way."""
    namespace = unique_namespace("readsold")
    store = open_store(NdbStateOptions(url=mysql_url, namespace=namespace))
    local = fast_tmpdir("read-paths-old-")
    try:
        store._execute(f"ALTER TABLE {store.t_state} DROP INDEX ix_kjson, DROP COLUMN kjson_key")
        assert not views.has_kjson_index(store)
        task = LocalSubtask(store, NdbStateOptions(), operator=OPERATOR, local_dir=local)
        value = task.context.get_state(ValueStateDescriptor("profile", Types.PICKLED_BYTE_ARRAY()))
        for key in KEYS[:50]:
            task.key(key)
            value.update([1, key])
        task.checkpoint(1)
        task.close()
        sql = views.view_key_query(namespace)
        for statement in views.views_sql(store):  # what an earlier release's views read
            store._execute(statement)
        conn = mysql_connect(mysql_url)
        try:
            with conn.cursor() as cur:
                before = fetch(cur, sql, [OPERATOR, json.dumps(KEYS[5])])
                assert [json.loads(r[2]) for r in before] == [[1, KEYS[5]]]
                assert_reads_the_table(state_table_access(cur, sql,
                                                          [OPERATOR, json.dumps(KEYS[5])]))
                views.create_views(store)
                assert views.has_kjson_index(store)
                assert views.ensure_kjson_index(store)  # again: nothing to do
                views.create_views(store)
                after = fetch(cur, sql, [OPERATOR, json.dumps(KEYS[5])])
                assert after == before
                assert_indexed(state_table_access(cur, sql, [OPERATOR, json.dumps(KEYS[5])]))
        finally:
            conn.close()
    finally:
        try:
            views.drop_views(store)
        except pymysql.err.MySQLError:
            pass
        store.close()
        drop_namespace(mysql_url, namespace)
        shutil.rmtree(local, ignore_errors=True)


def test_views_without_the_right_to_alter_fall_back_to_the_json_column(
        mysql_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture):
    """A user who may not ALTER the state table still gets the views (kjson lookups then
    read the table), and a warning that names the statements to run."""
    namespace = unique_namespace("readsro")
    store = open_store(NdbStateOptions(url=mysql_url, namespace=namespace))
    try:
        store._execute(f"ALTER TABLE {store.t_state} DROP INDEX ix_kjson, DROP COLUMN kjson_key")
        execute = store._execute

        def refuse_alter(text: str, params: Sequence[Any] = ()) -> Any:
            if text.startswith("ALTER TABLE"):
                raise pymysql.err.OperationalError(1142, "ALTER command denied to user")
            return execute(text, params)
        monkeypatch.setattr(store, "_execute", refuse_alter)
        with caplog.at_level("WARNING", logger="pyflink_ndb.stores.views"):
            assert views.create_views(store) == list(reversed(views.view_names(namespace)))
        assert not views.has_kjson_index(store)
        assert "ADD COLUMN kjson_key" in caplog.text and "1142" in caplog.text
        monkeypatch.undo()
        assert views.ensure_kjson_index(store)  # with the right, it is added
    finally:
        views.drop_views(store)
        store.close()
        drop_namespace(mysql_url, namespace)
