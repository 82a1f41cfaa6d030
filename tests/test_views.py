"""`pyflink-ndb views create|drop`: the `<ns>_committed` view on the MySQL-protocol server
shows exactly the latest completed checkpoint (values as JSON, map keys, lists as arrays,
TTL-expired rows hidden), also to a reader that runs while checkpoints complete, abort
and stay pending, garbage collection deletes versions, and a new job restores an older
checkpoint."""

from __future__ import annotations

import json
import shutil
import threading
import time
from typing import Any

import pytest
from conftest import drop_namespace, fast_tmpdir, mysql_connect, unique_namespace
from pyflink.common import Types
from pyflink.datastream.state import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from test_cli_state import OPERATOR, Flights, base, populate, run

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.stores import open_store
from pyflink_ndb.testing import LocalSubtask, key_group_ranges, local_key_group

pytestmark = pytest.mark.mysql


@pytest.fixture(scope="module")
def flights(mysql_url) -> Any:
    namespace = unique_namespace("views")
    store = open_store(NdbStateOptions(url=mysql_url, namespace=namespace))
    try:
        model = populate(store, mysql_url)
        run("views", "create", *base(model))
        yield model
    finally:
        store.close()
        drop_namespace(mysql_url, namespace)
        conn = mysql_connect(mysql_url)
        with conn.cursor() as cur:
            for view in ("committed", "committed_rows", "committed_ranges"):
                cur.execute(f"DROP VIEW IF EXISTS {namespace}_{view}")
        conn.close()


def select(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    conn = mysql_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())
    finally:
        conn.close()


def by_state(model: Flights, state: str) -> list[tuple[Any, ...]]:
    return select(model.url, f"SELECT key_text, mkey, vjson, checkpoint, chunks FROM "
                  f"{model.namespace}_committed WHERE state = %s", (state,))


def test_the_view_shows_the_committed_checkpoint_of_every_kind(flights: Flights):
    aircraft = by_state(flights, "aircraft")
    assert {k: tuple(json.loads(v)) for k, _, v, _, _ in aircraft} == flights.aircraft
    assert {c for *_, c, _ in aircraft} == {3}
    assert {k: json.loads(v) for k, _, v, _, _ in by_state(flights, "route")} == flights.route
    maps: dict[str, dict[str, int]] = {}
    for key, mkey, vjson, _, _ in by_state(flights, "per_dest"):
        maps.setdefault(key, {})[json.loads(mkey)] = json.loads(vjson)
    assert maps == flights.per_dest
    hours = {k: json.loads(v) for k, _, v, _, _ in by_state(flights, "last_hour")}
    assert hours == {k: v for k, v in flights.last_hour.items() if k not in flights.expired}
    ((key, _, vjson, _, chunks),) = by_state(flights, "blob")
    assert vjson is None and chunks == 3  # larger than one chunk: `pyflink-ndb get` reads it


def test_views_print_sql_and_drop(flights: Flights, tmp_path):
    out = run("views", "create", *base(flights), "--print-sql")
    assert out.output.count("CREATE OR REPLACE VIEW") == 3
    sqlite = run("views", "create", "--url", f"sqlite:///{tmp_path / 's.sqlite'}", ok=False)
    assert "need a MySQL-protocol server" in sqlite.output or "No SQLite store" in sqlite.output


def test_views_drop_leaves_the_tables(mysql_url):
    store = open_store(NdbStateOptions(url=mysql_url, namespace=unique_namespace("views")))
    try:
        model = populate(store, mysql_url, chunks=1, chunk=30)
        run("views", "create", *base(model))
        out = run("views", "drop", *base(model))
        assert f"{model.namespace}_committed" in out.output
        assert "has no views" in run("views", "drop", *base(model)).output
        assert store.count_rows() > 0
    finally:
        store.close()
        drop_namespace(mysql_url, store.namespace)


KEYS = [f"key-{i}" for i in range(60)]


def test_a_reader_never_sees_a_checkpoint_that_did_not_complete(mysql_url):
    """Every SELECT on the view returns one completed checkpoint, whole: each value, map
    entry and list element is tagged with the (run, checkpoint) that wrote it, every key
    is written in every checkpoint, and the tag must be one whose completion the writer
    announced before the read ended."""
    namespace = unique_namespace("viewsrace")
    store = open_store(NdbStateOptions(url=mysql_url, namespace=namespace))
    options = NdbStateOptions(cache_max_entries=20, checkpoints_retained=2)
    ranges = key_group_ranges(2)
    dirs = [fast_tmpdir("views-race-") for _ in range(4)]
    completed: set[str] = set()
    lock = threading.Lock()
    done = threading.Event()
    seen: list[str] = []
    problems: list[str] = []

    def subtasks(restore: int | None, offset: int) -> list[LocalSubtask]:
        return [LocalSubtask(store, options, operator=OPERATOR, subtask_index=i,
                             key_group_start=a, key_group_end=b, local_dir=dirs[offset + i],
                             restored_checkpoint_id=restore)
                for i, (a, b) in enumerate(ranges)]

    def write(tasks: list[LocalSubtask], tag: str) -> None:
        for key in KEYS:
            kg = local_key_group(key)
            task = tasks[0] if kg <= ranges[0][1] else tasks[1]
            task.key(key)
            ctx = task.context
            ctx.get_state(ValueStateDescriptor("v", Types.STRING())).update(tag)
            ctx.get_map_state(MapStateDescriptor("m", Types.STRING(), Types.STRING())).put(
                "tag", tag)
            ctx.get_list_state(ListStateDescriptor("l", Types.STRING())).add(tag)

    def reader() -> None:
        sql = (f"SELECT state, key_text, mkey, vjson, checkpoint FROM {namespace}_committed")
        conn = mysql_connect(mysql_url)
        try:
            while not done.is_set():
                with conn.cursor() as cur:
                    cur.execute(sql)
                    rows = cur.fetchall()
                with lock:
                    announced = set(completed)
                if not rows:
                    continue
                tags = set()
                for state, _key, mkey, vjson, _ in rows:
                    value = json.loads(vjson)
                    tags.update(value[-1:] if state == "l" else [value])
                    if state == "m" and json.loads(mkey) != "tag":
                        problems.append(f"map key {mkey!r}")
                if len(tags) != 1 or not tags <= announced or len(rows) != 3 * len(KEYS):
                    problems.append(f"{len(rows)} rows with tags {sorted(tags)[:5]}, "
                                    f"completed: {sorted(announced)[-3:]}")
                seen.append(tags.pop())
        finally:
            conn.close()

    thread = threading.Thread(target=reader, daemon=True)
    try:
        run("views", "create", "--url", mysql_url, "--namespace", namespace)
        tasks = subtasks(None, 0)
        thread.start()

        def checkpoint(run_id: int, n: int, fate: str) -> None:
            write(tasks, f"{run_id}:{n}")
            for t in tasks:
                t.snapshot(n)
            if fate == "complete":
                with lock:
                    completed.add(f"{run_id}:{n}")
                for t in tasks:
                    t.complete(n)
            elif fate == "abort":
                for t in tasks:
                    t.abort(n)

        fates = ["complete", "complete", "pending", "complete", "abort", "complete"]
        for n in range(1, 19):
            checkpoint(1, n, fates[n % len(fates)])
        restore = sorted(int(t.split(":")[1]) for t in completed)[-2]  # still retained
        for t in tasks:
            t.crash()
        tasks = subtasks(restore, 2)  # a new job from an older retained checkpoint
        for n in range(restore + 1, restore + 13):
            checkpoint(2, n, fates[n % len(fates)])
        # A loaded machine may starve the reader: let it read the new job's state.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(t.startswith("2:") for t in seen):
            time.sleep(0.05)
    finally:
        done.set()
        thread.join(timeout=60)
        for t in tasks:
            t.close()
        store.close()
        run("drop", "--url", mysql_url, "--namespace", namespace, "--yes")
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    assert not problems, problems[:5]
    assert len(seen) > 10, f"only {len(seen)} reads ran"
    assert {tag.split(":")[0] for tag in seen} == {"1", "2"}, sorted(set(seen))
    assert f"1:{restore}" in seen or any(t.startswith("2:") for t in seen)
