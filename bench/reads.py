"""Bench part `reads` (`python -m bench.run --only reads`): committed-state point reads
from one SQL client on MariaDB (issue 9, item 5).

A namespace is filled through the package's own API (two `LocalSubtask`s, i.e. two
subtasks of parallelism 2, their checkpoints written by the background writer and
completed through the checkpoint protocol): a ValueState and a MapState per key; the
first job commits checkpoints 1 and 2 (10 % of the keys updated in 2), a second job
restores checkpoint 2 and commits 3 (another 10 % updated), so that the committed
checkpoint's version ranges span two branches per key-group segment and many entries
have an older version, as on a namespace a job has run on for a while.

Then ONE client (pymysql, one connection, sequential, parameterised SQL, autocommit;
the floor and the primary-key reads also from a client in C, MySQL Connector/Python's C
extension, when the bench extra installed it: through its cursor, and through its C API
without the cursor layer, :class:`CApiConnection`) reads random keys with the queries README
documents (pyflink_ndb.stores.views): by
primary key on the state table, through the `<ns>_committed` view by primary key, by
`kjson` through the view; and the package's own read path (`pyflink-ndb get`, i.e.
`inspect.iter_entries`). Each after a warm-up; reads/s, p50, p99, p99.9. Every query's
EXPLAIN is recorded with whether it reads the state table by an index. Then every read
again, on other random keys, while the part holds a CPU latency request of 0 µs
(bench/cpu_latency.py: on this machine's vCPUs a sequential client and its server wait for
each other's CPU to wake from its halt), unless the whole run holds one.

What a view costs this server, apart from what the documented views compute
(:func:`model_views`, rows `model_*`, C API): the same primary-key read through a view of
the state table alone, and through `<ns>_committed_rows` rebuilt on a table of the version
ranges instead of `<ns>_committed_ranges`'s JSON_TABLEs (the stored-format change a faster
view would need), with and without its newest-version check. Models, not documented reads:
issue 9's targets leave them out (bench/targets.py).

Last, the package's own read of keys that miss together (:func:`bundle_reads`: a
read-ahead bundle of 100 keys after a restore), as the UNION ALL of primary-key reads and
as the MySQL store's join, both on the same bundles.
"""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench import cpu_latency

OPERATOR = "reads"
VALUE_STATE = "profile"
MAP_STATE = "visits"
#: Map entries per key in the MapState.
MAP_ENTRIES = 2
SEED = 20130101


def _local_dir(prefix: str) -> str:
    shm = Path("/dev/shm")
    base = str(shm) if shm.is_dir() else None
    return tempfile.mkdtemp(prefix=prefix, dir=base)


def key_name(i: int) -> str:
    return f"user-{i:07d}"


def profile(i: int, version: int) -> list[Any]:
    """The ValueState value of key `i` written in checkpoint `version` (JSON: an array)."""
    return [i, f"name-{i}", version, round(i * 0.25, 2)]


def visits(i: int) -> dict[str, int]:
    """The MapState of key `i`."""
    return {f"page-{m}": i * 10 + m for m in range(MAP_ENTRIES)}


def fill(mysql_url: str, namespace: str, keys: int, log: Callable[[str], None] = print,
         update_share: float = 0.1) -> dict[str, Any]:
    """Fill `namespace` (dropped first) with committed state through the package's API.

    Returns `keys`, `rows` (of the state table), the seconds of each phase, and
    `version`: per key index the checkpoint whose ValueState value is committed.
    """
    from pyflink.common import Types
    from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

    from pyflink_ndb.config import NdbStateOptions
    from pyflink_ndb.stores.factory import open_store
    from pyflink_ndb.testing import (
        CheckpointStorage,
        LocalSubtask,
        key_group_ranges,
        local_key_group,
    )

    options = NdbStateOptions(url=mysql_url, namespace=namespace)
    store = open_store(options)
    store.drop_tables()
    store.close()
    store = open_store(options)
    ranges = key_group_ranges(2)
    storage = CheckpointStorage()
    dirs: list[str] = []
    rng = np.random.default_rng(SEED)
    owner = [0 if local_key_group(key_name(i)) <= ranges[0][1] else 1 for i in range(keys)]
    version = [1] * keys
    out: dict[str, Any] = {"keys": keys, "phases_s": {}}

    def subtasks(restore: int | None) -> list[LocalSubtask]:
        made = []
        for index, (a, b) in enumerate(ranges):
            dirs.append(_local_dir("pyflink-ndb-bench-reads-"))
            made.append(LocalSubtask(store, options, operator=OPERATOR, subtask_index=index,
                                     key_group_start=a, key_group_end=b, local_dir=dirs[-1],
                                     storage=storage, restored_checkpoint_id=restore))
        return made

    def write(tasks: list[LocalSubtask], which: Sequence[int], epoch: int,
              maps: bool) -> None:
        states = [(t.context.get_state(ValueStateDescriptor(VALUE_STATE,
                                                            Types.PICKLED_BYTE_ARRAY())),
                   t.context.get_map_state(MapStateDescriptor(MAP_STATE, Types.STRING(),
                                                              Types.LONG())))
                  for t in tasks]
        for i in which:
            tasks[owner[i]].key(key_name(i))
            value, mapped = states[owner[i]]
            value.update(profile(i, epoch))
            version[i] = epoch
            if maps:
                for map_key, count in visits(i).items():
                    mapped.put(map_key, count)

    def checkpoint(tasks: list[LocalSubtask], n: int, what: str) -> None:
        started = time.perf_counter()
        for task in tasks:  # both subtasks' writers run at once, as in a job
            task.snapshot(n, durable=False)
        for task in tasks:
            task.wait_durable(n)
        for task in tasks:
            task.complete(n)
        out["phases_s"][what] = time.perf_counter() - started
        log(f"reads: {what}: {out['phases_s'][what]:.1f} s")

    def some() -> list[int]:
        return sorted(int(i) for i in rng.choice(keys, size=int(keys * update_share),
                                                 replace=False))

    try:
        tasks = subtasks(None)
        write(tasks, range(keys), 1, maps=True)
        checkpoint(tasks, 1, f"checkpoint 1 ({keys:,} keys, {keys * (1 + MAP_ENTRIES):,} "
                             "entries)")
        updated = some()
        write(tasks, updated, 2, maps=False)
        checkpoint(tasks, 2, f"checkpoint 2 ({len(updated):,} values)")
        for task in tasks:
            task.close()
        tasks = subtasks(2)  # a new job restores checkpoint 2: new branches
        updated = some()
        write(tasks, updated, 3, maps=False)
        checkpoint(tasks, 3, f"checkpoint 3 after a restore ({len(updated):,} values)")
        for task in tasks:
            task.close()
        out["rows"] = store.count_rows()
    finally:
        store.close()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    out["version"] = version
    return out


# -- measuring -----------------------------------------------------------------------------
def latency_summary(latencies: Sequence[float], elapsed: float) -> dict[str, float]:
    ms = np.asarray(latencies) * 1000
    return {"reads": len(latencies), "reads_per_s": len(latencies) / elapsed,
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "p999_ms": float(np.percentile(ms, 99.9)), "max_ms": float(ms.max())}


def explain(cur: Any, sql: str, params: Sequence[Any], tables: Sequence[str]
            ) -> dict[str, Any]:
    """EXPLAIN of one query: its rows, and whether every access to the tables named in
    `tables` (the state table's aliases) is by an index (const, eq_ref, ref, range) rather
    than a scan of the table."""
    cur.execute("EXPLAIN " + sql, params)
    names = [d[0] for d in cur.description]
    plan = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    hits = [r for r in plan if r.get("table") in tables]
    indexed = bool(hits) and all(r.get("type") in ("const", "eq_ref", "ref", "range",
                                                   "ref_or_null") and r.get("key")
                                 for r in hits)
    return {"indexed": indexed,
            "state_table_access": [f"{r['table']}: {r['type']} on {r['key']} "
                                   f"(~{r['rows']} rows)" for r in hits],
            "plan": [{k: (None if v is None else str(v)) for k, v in r.items()} for r in plan]}


_OPTIMIZE_RE = re.compile(r'"query_optimization":\s*\{\s*"r_total_time_ms":\s*([0-9.e+-]+)')
_EXECUTE_RE = re.compile(r'"query_block":\s*\{[^{]*?"r_total_time_ms":\s*([0-9.e+-]+)')


def server_times(cur: Any, sql: str, params: Sequence[Any], repeat: int = 20
                 ) -> dict[str, float]:
    """Median server time (ms) to optimize and to execute the query, from MariaDB's
    `ANALYZE FORMAT=JSON` (read by pattern: the document quotes the query's constants
    unescaped); empty elsewhere."""
    optimize, execute = [], []
    for _ in range(repeat):
        try:
            cur.execute("ANALYZE FORMAT=JSON " + sql, params)
            text = str(cur.fetchone()[0])
        except Exception:  # noqa: BLE001 - not MariaDB: no server-side split
            return {}
        opt, ex = _OPTIMIZE_RE.search(text), _EXECUTE_RE.search(text)
        if opt is None or ex is None:
            return {}
        optimize.append(float(opt.group(1)))
        execute.append(float(ex.group(1)))
    return {"optimize_ms": float(np.median(optimize)), "execute_ms": float(np.median(execute))}


#: Reads per round: every query runs one round in turn, so that all of them see the same
#: moments of the machine (other work on it slows some rounds).
ROUND_READS = 1_000


class Reader:
    """One query's timed reads, in rounds."""

    def __init__(self, run: Callable[[int], Any], check: Callable[[int, Any], bool]) -> None:
        self.run, self.check = run, check
        self.latencies: list[float] = []
        self.rounds: list[dict[str, float]] = []
        self.elapsed = 0.0
        self.found = self.correct = 0

    def warm(self, picks: Sequence[int]) -> None:
        for i in picks:
            self.run(i)

    def round(self, picks: Sequence[int]) -> None:
        latencies = []
        started = time.perf_counter()
        for i in picks:
            t = time.perf_counter()
            result = self.run(i)
            latencies.append(time.perf_counter() - t)
            if result:
                self.found += 1
                self.correct += self.check(i, result)
        elapsed = time.perf_counter() - started
        self.elapsed += elapsed
        self.latencies += latencies
        self.rounds.append(latency_summary(latencies, elapsed))

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = latency_summary(self.latencies, self.elapsed)
        best = max(self.rounds, key=lambda r: r["reads_per_s"])
        out.update(found=self.found, correct=self.correct, rounds=len(self.rounds),
                   best_round=best,
                   median_round_reads_per_s=float(np.median([r["reads_per_s"]
                                                             for r in self.rounds])))
        return out


def bench_reads(mysql_url: str, namespace: str, keys: int = 100_000, reads: int = 20_000,
                warmup: int = 2_000, scan_reads: int = 5, get_reads: int | None = None,
                write_cost_entries: int = 20_000, log: Callable[[str], None] = print,
                held_us: int | None = None) -> dict[str, Any]:
    """The part: fill, create the views, then time each documented read from one client,
    then every read again, on other random keys, while a CPU latency request of 0 µs is
    held (where this process may hold one; `low_latency` in the result).

    :param keys: keys of the namespace (a ValueState and a MapState of
        :data:`MAP_ENTRIES` entries each).
    :param reads: timed reads per query, random keys (uniform), after `warmup`.
    :param scan_reads: reads by `key_text`, which has no index (each reads the table).
    :param get_reads: reads through the package's read path (default: `reads`).
    :param write_cost_entries: entries per checkpoint of :func:`index_write_cost` (0: not
        measured).
    :param held_us: the CPU latency request the whole run holds (bench.run
        `--cpu-latency-us`): every read runs under it, none again; None: none held.
    """
    started = time.perf_counter()
    filled = fill(mysql_url, namespace, keys, log)
    out = measure_reads(mysql_url, namespace, filled, reads, warmup, scan_reads, get_reads,
                        log, held_us)
    out["cpu_latency_us"] = held_us
    if write_cost_entries:
        out["write_cost"] = index_write_cost(mysql_url, f"{namespace}_wc", write_cost_entries,
                                             log=log)
    out["elapsed_s"] = time.perf_counter() - started
    return out


def measure_reads(mysql_url: str, namespace: str, filled: dict[str, Any], reads: int,
                  warmup: int, scan_reads: int, get_reads: int | None,
                  log: Callable[[str], None], held_us: int | None = None) -> dict[str, Any]:
    """The reads of :func:`bench_reads` on a namespace :func:`fill` filled (`filled`: what
    it returned)."""
    import pymysql

    from pyflink_ndb.serialization.keys import encode_key
    from pyflink_ndb.stores import views
    from pyflink_ndb.stores.inspect import iter_entries, states_of
    from pyflink_ndb.stores.mysql import MysqlStateStore, parse_mysql_url
    from pyflink_ndb.testing import local_key_group

    filled = dict(filled)
    version = filled.pop("version")
    keys = filled["keys"]
    store = MysqlStateStore(mysql_url, namespace)
    store.open(create=False)
    args = parse_mysql_url(mysql_url)
    conn = pymysql.connect(host=args["host"], port=args["port"], user=args["user"],
                           password=args["password"] or "", database=args["database"],
                           charset="utf8mb4", autocommit=True, binary_prefix=True)
    cconn = capi = None
    drop_models: list[str] = []
    out: dict[str, Any] = {"namespace": namespace, **filled, "queries": {},
                           "loadavg_before": list(os.getloadavg())}
    try:
        cconn = c_client(args)
        capi = c_api_client(args)
        out["c_client"] = None if cconn is None else c_client_name()
        # The statistics InnoDB recalculates in the background after bulk writes, now (the
        # plans of a table that has been written, not of the empty one).
        store._query(f"ANALYZE TABLE {store.t_state}")
        views.create_views(store)
        out["kjson_index"] = views.has_kjson_index(store)
        cur = conn.cursor()
        create_models, drop_models = model_views(namespace, views.views_sql(store)[1])
        for statement in create_models:
            cur.execute(statement)
        cur.execute("SELECT VERSION()")
        out["server"] = cur.fetchone()[0]
        infos = {s.name: s for s in states_of(store, OPERATOR)}
        value_id = infos[VALUE_STATE].state_id
        kgs = [local_key_group(key_name(i)) for i in range(keys)]
        ukeys = [encode_key(key_name(i)) for i in range(keys)]
        kjsons = [json.dumps(key_name(i)) for i in range(keys)]
        cur.execute(views.ranges_query(namespace), (OPERATOR,))
        ranges = cur.fetchall()
        committed = ranges[0][5]
        by_group: dict[int, list[int]] = {}
        for kg in range(128):
            by_group[kg] = [x for a, b, lo, hi, _, _ in ranges if a <= kg <= b for x in (lo, hi)]
        pk_sql = {n: views.point_read_query(namespace, n)
                  for n in {len(v) // 2 for v in by_group.values()}}
        rng = np.random.default_rng(SEED + 1)
        picks = [int(i) for i in rng.integers(0, keys, size=warmup + reads)]

        def expect_value(i: int, vjson: Any) -> bool:
            return vjson is not None and json.loads(vjson) == profile(i, version[i])

        def expect_key(i: int, rows: Sequence[Any]) -> bool:
            got = {(r[0], r[1]): json.loads(r[2]) for r in rows}
            want = {(VALUE_STATE, None): profile(i, version[i])}
            want.update({(MAP_STATE, json.dumps(k)): v for k, v in visits(i).items()})
            return got == want

        def fetch(sql: str, params: Sequence[Any]) -> list[Any]:
            cur.execute(sql, params)
            return list(cur.fetchall())

        versions_sql = views.versions_read_query(namespace)
        check_sql = views.committed_query(namespace)
        pairs = {kg: list(zip(v[0::2], v[1::2], strict=True)) for kg, v in by_group.items()}

        def validated(run: Callable[[str, Sequence[Any]], list[Any]]
                      ) -> Callable[[str, Sequence[Any]], list[Any]]:
            """`run` (a client's statement: the rows) as the batch-validated read: a read
            of every version, the pick of the ranges' one, and every VALIDATE_EVERY reads
            the check that `committed` has not moved (in the time)."""
            count = [0]

            def fetch_validated(sql: str, params: Sequence[Any]) -> list[Any]:
                row = views.newest_in_ranges(run(sql, params), pairs[params[0]])
                count[0] += 1
                if count[0] % VALIDATE_EVERY == 0:
                    if run(check_sql, (OPERATOR,))[0][0] != committed:
                        raise RuntimeError("committed moved while nothing ran: not a bench")
                return [] if row is None else [row]
            return fetch_validated

        cli_text, cli_params = store.committed_sql(OPERATOR)
        cli_pk = (f"SELECT q.version, q.vjson FROM ({store._sql(cli_text)}) q WHERE "
                  "q.key_group = %s AND q.state_name = %s AND q.ukey = %s")
        view_pk = views.view_point_read_query(namespace)
        rows_pk = views.rows_point_read_query(namespace)
        rows_key = views.rows_key_query(namespace)
        view_key = views.view_key_query(namespace)
        ranges_pk = views.ranges_point_read_query(namespace)
        queries: list[tuple[str, str, Callable[[int], tuple[str, list[Any]]] | None,
                            Callable[[int, Any], bool], Sequence[str], int]] = [
            ("floor", "`SELECT 1` (the client's and the round trip's floor)",
             lambda i: ("SELECT 1", []), lambda i, r: True, (), reads),
            ("pk", "state table by primary key, ranges read once (`NS_committed_ranges`) "
                   "and checked in the statement",
             lambda i: (pk_sql[len(by_group[kgs[i]]) // 2],
                        [OPERATOR, committed, kgs[i], value_id, ukeys[i],
                         *by_group[kgs[i]]]),
             lambda i, r: bool(r[0][0]) and not r[0][2] and expect_value(i, r[0][3]),
             ("s",), reads),
            ("pk_ranges_view", "state table by primary key joined with "
                               "`NS_committed_ranges`",
             lambda i: (ranges_pk, [OPERATOR, kgs[i], value_id, ukeys[i]]),
             lambda i, r: not r[0][1] and expect_value(i, r[0][2]), ("s",), reads),
            ("pk_versions", "state table by primary key, every version, the one the ranges "
                            "see picked by the client, `committed` checked after every "
                            f"{VALIDATE_EVERY} reads",
             (lambda i: (versions_sql, [kgs[i], value_id, ukeys[i]]), validated(fetch)),
             lambda i, r: bool(r) and not r[0][1] and expect_value(i, r[0][2]), ("s",),
             reads),
            ("query_sql_pk", "`pyflink-ndb query --sql` statement filtered by primary key",
             lambda i: (cli_pk, [*cli_params, kgs[i], VALUE_STATE, ukeys[i]]),
             lambda i, r: expect_value(i, r[0][1]), ("s",), reads),
            ("view_pk", "`NS_committed` by primary key (operator, state, key_group, ukey)",
             lambda i: (view_pk, [OPERATOR, VALUE_STATE, kgs[i], ukeys[i]]),
             lambda i, r: expect_value(i, r[0][2]), ("s",), reads),
            ("view_kjson", "`NS_committed` by `kjson` (every state of the key: 1 value + "
                           f"{MAP_ENTRIES} map rows)",
             lambda i: (view_key, [OPERATOR, kjsons[i]]), expect_key, ("s",), reads),
            ("rows_pk", "`NS_committed_rows` by primary key",
             lambda i: (rows_pk, [OPERATOR, VALUE_STATE, kgs[i], ukeys[i]]),
             lambda i, r: expect_value(i, r[0][1]), ("s",), reads),
            ("rows_kjson", "`NS_committed_rows` by `kjson_key` (3 rows)",
             lambda i: (rows_key, [OPERATOR, kjsons[i]]),
             lambda i, r: len(r) == 1 + MAP_ENTRIES and expect_value(
                 i, next(x[2] for x in r if x[0] == VALUE_STATE)), ("s",), reads),
            ("view_key_text", "`NS_committed` by `key_text` (no index)",
             lambda i: (view_key.replace("kjson = %s", "key_text = %s"),
                        [OPERATOR, key_name(i)]), expect_key, ("s",), scan_reads),
        ]
        if cconn is not None:
            # The same two reads from a client in C: what the server allows one sequential
            # connection, without pymysql's Python work per statement.
            ccur = cconn.cursor()

            def cfetch(sql: str, params: Sequence[Any]) -> list[Any]:
                ccur.execute(sql, params)
                return list(ccur.fetchall())
            pk_query = queries[1]
            queries += [(f"{label}_c", f"{text}; C client", (make, cfetch), check, (), count)
                        for label, text, make, check, _, count in (queries[0], pk_query)]
        by_label = {q[0]: q for q in queries}
        if capi is not None:
            # The floor, the two primary-key reads and the two views' from the C API
            # itself: what one sequential connection of a client in C reads, without a
            # cursor layer (for the views: what the server's own work leaves).
            for label, run in (("floor", capi.execute), ("pk", capi.execute),
                               ("pk_versions", validated(capi.execute)),
                               ("view_pk", capi.execute), ("rows_pk", capi.execute)):
                _, text, make, check, _, count = by_label[label]
                make = make[0] if isinstance(make, tuple) else make
                queries.append((f"{label}_capi", f"{text}; C API", (make, run), check, (),
                                count))
        # The models of what a view costs (model_views), from the best client here.
        model_run = fetch if capi is None else capi.execute
        suffix = "" if capi is None else "_capi"
        client = "" if capi is None else "; C API"
        key_where = "key_group = %s AND state_id = %s AND ukey = %s AND chunk = 0"
        rows_where = "operator = %s AND state = %s AND key_group = %s AND ukey = %s"

        def newest_is_expected(i: int, rows: Sequence[Any]) -> bool:
            row = views.newest_in_ranges(rows, pairs[kgs[i]])
            return row is not None and not row[1] and expect_value(i, row[2])

        queries += [
            (f"{MODEL_PREFIX}plain{suffix}", "model: a view of the state table alone, by "
             "primary key, every version (the one the ranges see picked by the client)"
             + client,
             (lambda i: (f"SELECT version, tombstone, vjson FROM {namespace}_model_plain "
                         f"WHERE {key_where}", [kgs[i], value_id, ukeys[i]]), model_run),
             newest_is_expected, (f"{namespace}_state",), reads),
            (f"{MODEL_PREFIX}rows{suffix}", "model: `NS_committed_rows` with its ranges "
             "from a table, by primary key" + client,
             (lambda i: (f"SELECT kind, vjson, checkpoint FROM {namespace}_model_rows "
                         f"WHERE {rows_where}", [OPERATOR, VALUE_STATE, kgs[i], ukeys[i]]),
              model_run),
             lambda i, r: len(r) == 1 and expect_value(i, r[0][1]), ("s",), reads),
            (f"{MODEL_PREFIX}rows_all{suffix}", "model: that view without its "
             "newest-version check (every visible version; the newest picked by the "
             "client)" + client,
             (lambda i: (f"SELECT version, 0, vjson FROM {namespace}_model_rows_all "
                         f"WHERE {rows_where}", [OPERATOR, VALUE_STATE, kgs[i], ukeys[i]]),
              model_run),
             newest_is_expected, ("s",), reads),
        ]
        states = [infos[VALUE_STATE]]

        def get(i: int) -> Any:
            return next(iter(iter_entries(store, OPERATOR, states, key=key_name(i),
                                          key_given=True, limit=1)), None)
        queries.append(("get", "the package's read path (`pyflink-ndb get`: "
                               "`inspect.iter_entries`), its own connection", None,
                        lambda i, e: e.value == profile(i, version[i]), (),
                        reads if get_reads is None else get_reads))
        readers: dict[str, Reader] = {}
        for label, text, make, check, tables, count in queries:
            entry: dict[str, Any] = {"what": text}
            via = fetch
            if isinstance(make, tuple):  # (make, the C client's fetch)
                make, via = make
            if make is not None:
                sql, params = make(picks[0])
                entry["sql"] = sql
                if tables:
                    entry["explain"] = explain(cur, sql, params, tables)
                    entry["server"] = server_times(cur, sql, params,
                                                   repeat=3 if count < 100 else 20)
            reader = readers[label] = Reader(
                get if make is None else (lambda i, make=make, via=via: via(*make(i))), check)
            reader.warm(picks[:min(warmup, max(1, count // 10))])
            out["queries"][label] = entry
        counts = {label: q[5] for label, q in zip(readers, queries, strict=True)}
        for label, summary in timed_rounds(readers, counts, picks, warmup, reads,
                                           log).items():
            out["queries"][label].update(summary)
        if held_us is None and cpu_latency.available():
            # Every read again with the CPUs kept out of their halt state: what the
            # machine's idle policy takes from every round trip (bench/cpu_latency.py);
            # other random keys, so that neither pass reads the keys the other just read
            # (unless the whole run holds a request: bench.run --cpu-latency-us).
            low = {label: Reader(r.run, r.check) for label, r in readers.items()}
            low_picks = [int(i) for i in np.random.default_rng(SEED + 2).integers(
                0, keys, size=warmup + reads)]
            with cpu_latency.held(0) as held:
                if held:
                    for label, reader in low.items():
                        reader.warm(low_picks[:min(100, max(1, counts[label] // 10))])
                    out["low_latency"] = {
                        "latency_us": 0, "idle_states": cpu_latency.idle_states(),
                        "queries": timed_rounds(low, counts, low_picks, warmup, reads, log,
                                                " (CPU latency 0 µs)")}
        for label, entry in out["queries"].items():
            if "explain" in entry:
                log(f"reads {label}: index: {'yes' if entry['explain']['indexed'] else 'NO'} "
                    f"({'; '.join(entry['explain']['state_table_access'])})")
        out["bundles"] = bundle_reads(store, ranges, value_id, keys, log=log)
        out["loadavg_after"] = list(os.getloadavg())
    finally:
        try:
            for statement in drop_models:
                conn.cursor().execute(statement)
        except pymysql.err.MySQLError:  # the server is gone: the namespace's drop takes them
            pass
        conn.close()
        if cconn is not None:
            cconn.close()
        if capi is not None:
            capi.close()
        store.close()
    return out


def timed_rounds(readers: dict[str, Reader], counts: dict[str, int], picks: Sequence[int],
                 warmup: int, reads: int, log: Callable[[str], None], setting: str = ""
                 ) -> dict[str, dict[str, Any]]:
    """Time `counts[label]` reads of each reader, in rounds of :data:`ROUND_READS` taken in
    turn (each round of each query its own random keys of `picks`, after the first
    `warmup`), and return each reader's :meth:`Reader.summary` (logged with `setting`)."""
    # The client's garbage collector would otherwise scan the fixtures (100,000 keys'
    # parameters) again and again while it times the reads.
    gc.collect()
    gc.freeze()
    try:
        done = dict.fromkeys(readers, 0)
        slots = max(1, reads // ROUND_READS)
        turn = 0
        while any(done[k] < counts[k] for k in readers):
            for label, reader in readers.items():
                n = min(ROUND_READS, counts[label] - done[label])
                if n > 0:
                    start = warmup + (turn % slots) * ROUND_READS
                    reader.round(picks[start:start + n])
                    done[label] += n
                turn += 1
            log(f"reads: round {max(len(r.rounds) for r in readers.values())} done{setting}")
    finally:
        gc.unfreeze()
    return _summaries(readers, setting, log)


def _summaries(readers: dict[str, Reader], setting: str, log: Callable[[str], None]
               ) -> dict[str, dict[str, Any]]:
    out = {}
    for label, reader in readers.items():
        entry = out[label] = reader.summary()
        log(f"reads {label}{setting}: {entry['reads_per_s']:,.0f}/s, p50 "
            f"{entry['p50_ms']:.3f} ms, p99 {entry['p99_ms']:.3f} ms, p99.9 "
            f"{entry['p999_ms']:.3f} ms (best round {entry['best_round']['reads_per_s']:,.0f}"
            f"/s, p99 {entry['best_round']['p99_ms']:.3f} ms); "
            f"{entry['correct']:,}/{entry['reads']:,} correct")
    return out


#: Reads between two checks of `committed` in the batch-validated read (part 6).
VALIDATE_EVERY = 100
#: Keys per bundle of :func:`bundle_reads` (`state.backend.ndb.read-ahead.records`'
#: default) and bundles per form.
BUNDLE_KEYS = 100
BUNDLES = 40


#: Prefix of part 6's model reads (:func:`model_views`): not reads users are told to make.
MODEL_PREFIX = "model_"


def model_views(namespace: str, rows_view_sql: str) -> tuple[list[str], list[str]]:
    """What a view costs on this server, as objects of the bench's own namespace: the
    statements that create them, and those that drop them.

    * `NS_model_ranges`: a table of `NS_committed_ranges`'s rows (operator, key-group
      segment, version range, checkpoint), copied once;
    * `NS_model_plain`: a view of the state table alone (no join, no condition): what any
      view adds to a statement;
    * `NS_model_rows`: `NS_committed_rows` exactly as :func:`views_sql
      <pyflink_ndb.stores.views.views_sql>` makes it (`rows_view_sql`), its ranges read
      from that table instead of the JSON_TABLE view: the view a stored table of ranges
      (a format change, kept up to date by every move of `committed`) would give;
    * `NS_model_rows_all`: that view without its newest-version check (`NOT EXISTS`), so
      it returns every visible version (a deleted entry's older ones too: a model of the
      cost, not a read of the committed state): what the join alone costs.
    """
    ranges_view, rows_view = f"{namespace}_committed_ranges", f"{namespace}_committed_rows"
    table, plain = f"{namespace}_model_ranges", f"{namespace}_model_plain"
    rows, rows_all = f"{namespace}_model_rows", f"{namespace}_model_rows_all"
    if rows_view_sql.count(ranges_view) != 2 or " AND NOT EXISTS (" not in rows_view_sql:
        raise ValueError("the rows view's text changed: update bench.reads.model_views")
    model = rows_view_sql.replace(ranges_view, table).replace(f"VIEW {rows_view} AS",
                                                              f"VIEW {rows} AS")
    everything = model[:model.index(" AND NOT EXISTS (")].replace(f"VIEW {rows} AS",
                                                                  f"VIEW {rows_all} AS")
    create = [f"DROP TABLE IF EXISTS {table}",
              f"CREATE TABLE {table} (operator VARCHAR(255) NOT NULL, kg_start SMALLINT NOT "
              "NULL, kg_end SMALLINT NOT NULL, lo BIGINT NOT NULL, hi BIGINT NOT NULL, "
              "checkpoint BIGINT NOT NULL, PRIMARY KEY (operator, kg_start, lo))",
              f"INSERT INTO {table} SELECT operator, kg_start, kg_end, lo, hi, checkpoint "
              f"FROM {ranges_view}",
              f"CREATE OR REPLACE VIEW {plain} AS SELECT * FROM {namespace}_state",
              model, everything]
    drop = [f"DROP VIEW IF EXISTS {rows_all}", f"DROP VIEW IF EXISTS {rows}",
            f"DROP VIEW IF EXISTS {plain}", f"DROP TABLE IF EXISTS {table}"]
    return create, drop


def bundle_reads(store: Any, ranges: Sequence[Sequence[Any]], value_id: int, keys: int,
                 bundles: int = BUNDLES, size: int = BUNDLE_KEYS,
                 log: Callable[[str], None] = print) -> dict[str, Any]:
    """The package's own reads of keys that miss together (a read-ahead bundle after a
    restore, `StateStore.read_latest_batch`): `size` random keys' ValueState entries per
    bundle, each bundle read in both forms in turn — the UNION ALL of primary-key reads
    (the base class; what NDB keeps) and the MySQL store's join from a derived table of
    the keys (`keys_join_query`). Both must return the same versions.

    :param ranges: rows of :func:`views.ranges_query` (the committed checkpoint's version
        ranges per key-group segment).
    :returns: per form `ms_per_bundle` (median), `keys_per_s`, and `equal` (bundles whose
        answers agree) and `found` (entries returned of those asked).
    """
    from pyflink_ndb.serialization.keys import encode_key
    from pyflink_ndb.stores.base import StateStore
    from pyflink_ndb.testing import local_key_group

    by_group = {kg: tuple((lo, hi) for a, b, lo, hi, _, _ in ranges if a <= kg <= b)
                for kg in range(128)}
    forms: dict[str, Callable[[list[tuple[int, int, bytes]]], dict[Any, Any]]] = {
        "union": lambda e: StateStore.read_latest_batch(store, e, by_group.__getitem__),
        "join": lambda e: store.read_latest_batch(e, by_group.__getitem__)}
    rng = np.random.default_rng(SEED + 2)
    times: dict[str, list[float]] = {name: [] for name in forms}
    equal = found = asked = 0
    for b in range(bundles + 2):  # two warm-up bundles
        picks = sorted({int(i) for i in rng.integers(0, keys, size=size)})
        entries = [(value_id, local_key_group(key_name(i)), encode_key(key_name(i)))
                   for i in picks]
        answers = []
        for name, read in (forms.items() if b % 2 else reversed(forms.items())):
            started = time.perf_counter()
            answers.append(read(entries))
            if b >= 2:
                times[name].append(time.perf_counter() - started)
        if b >= 2:
            equal += answers[0] == answers[1]
            found += len(answers[0])
            asked += len(entries)
    out: dict[str, Any] = {"bundles": bundles, "size": size, "equal": equal,
                           "found": found, "asked": asked}
    for name, spent in times.items():
        out[name] = {"ms_per_bundle": float(np.median(spent)) * 1000,
                     "keys_per_s": asked / sum(spent)}
    log(f"reads: bundles of {size} keys: UNION ALL {out['union']['ms_per_bundle']:.1f} ms "
        f"({out['union']['keys_per_s']:,.0f} keys/s), join "
        f"{out['join']['ms_per_bundle']:.1f} ms ({out['join']['keys_per_s']:,.0f} keys/s); "
        f"{equal}/{bundles} bundles equal, {found:,}/{asked:,} found")
    return out


def c_client(args: dict[str, Any]) -> Any:
    """A connection of MySQL Connector/Python's C extension (`mysql-connector-python`,
    the bench extra: its client library is in C, as most SQL clients' are), or None when
    it is not installed or its extension does not load here (its 26.x wheels need OpenSSL
    3.2; the bench extra pins 9.x)."""
    try:
        import mysql.connector
        from mysql.connector import HAVE_CEXT
    except ImportError:
        return None
    if not HAVE_CEXT:
        return None
    return mysql.connector.connect(host=args["host"], port=args["port"], user=args["user"],
                                   password=args["password"] or "",
                                   database=args["database"], autocommit=True,
                                   charset="utf8mb4", use_pure=False)


class CApiConnection:
    """One connection of the C API that MySQL Connector/Python's C extension wraps
    (`_mysql_connector.MySQL`), used as a program in C uses its client library: the
    statement sent with `mysql_query`, the buffered result's rows fetched one by one,
    without the connector's cursor layer in Python. The connector opens it
    (:func:`c_client`: utf8mb4, autocommit, its authentication plugins); `connection` is
    that connection. Parameters become SQL literals by the
    library's own conversion (`convert_to_mysql`: converted, escaped and quoted in C, what
    the connector's cursor does with them; bytes get the `_binary` introducer, as pymysql's
    `binary_prefix` gives them), so statements stay parameterised (`%s`, as with pymysql;
    no other `%` in them)."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection
        self._api = connection._cmysql
        self._api.buffered(True)  # each result read whole (mysql_store_result), then its rows
        self._encoded: dict[str, bytes] = {}

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows `sql` returns with `params` (ints, bytes and str) in its `%s`s."""
        stmt = self._encoded.get(sql)
        if stmt is None:
            stmt = self._encoded[sql] = sql.encode("utf-8")
        if params:
            literals = self._api.convert_to_mysql(*params)
            stmt = stmt % tuple(b"_binary" + lit if isinstance(value, bytes) else lit
                                for value, lit in zip(params, literals, strict=True))
        self._api.query(stmt)
        rows = []
        while (row := self._api.fetch_row()) is not None:
            rows.append(row)
        self._api.free_result()
        return rows

    def close(self) -> None:
        self._connection.close()


def c_api_client(args: dict[str, Any]) -> CApiConnection | None:
    """A :class:`CApiConnection`, or None where :func:`c_client` finds no C extension."""
    connection = c_client(args)
    return None if connection is None else CApiConnection(connection)


def c_client_name() -> str:
    import mysql.connector

    return f"mysql-connector-python {mysql.connector.__version__} (C extension)"


def index_write_cost(mysql_url: str, namespace: str, entries: int = 20_000, rounds: int = 3,
                     log: Callable[[str], None] = print) -> dict[str, Any]:
    """What the `kjson_key` index costs the job's checkpoints: one subtask writes
    `entries` ValueState entries per checkpoint (every entry re-dirtied each round), into
    a namespace with the index and one without (dropped after the open), alternately;
    timed: `snapshot(n)` until durable (the background writer's REPLACEs), median."""
    from pyflink.common import Types
    from pyflink.datastream.state import ValueStateDescriptor

    from pyflink_ndb.config import NdbStateOptions
    from pyflink_ndb.stores.factory import open_store
    from pyflink_ndb.testing import LocalSubtask

    out: dict[str, Any] = {"entries": entries, "rounds": rounds}
    subs: dict[str, Any] = {}
    stores: dict[str, Any] = {}
    dirs: list[str] = []
    try:
        for label in ("with", "without"):
            options = NdbStateOptions(url=mysql_url, namespace=f"{namespace}_{label[:2]}")
            store = open_store(options)
            store.drop_tables()
            store.close()
            store = stores[label] = open_store(options)
            if label == "without":
                store._execute(f"ALTER TABLE {store.t_state} DROP INDEX ix_kjson, "
                               "DROP COLUMN kjson_key")
            dirs.append(_local_dir("pyflink-ndb-bench-wcost-"))
            sub = LocalSubtask(store, options, local_dir=dirs[-1])
            subs[label] = (sub, sub.context.get_state(
                ValueStateDescriptor(VALUE_STATE, Types.PICKLED_BYTE_ARRAY())))
        times: dict[str, list[float]] = {"with": [], "without": []}
        for epoch in range(1, rounds + 1):
            for label in (("with", "without") if epoch % 2 else ("without", "with")):
                sub, state = subs[label]
                for i in range(entries):
                    sub.key(key_name(i))
                    state.update(profile(i, epoch))
                started = time.perf_counter()
                sub.snapshot(epoch)
                times[label].append(time.perf_counter() - started)
                sub.complete(epoch)
        for label, values in times.items():
            out[f"{label}_s"] = values
            out[f"{label}_median_s"] = float(np.median(values))
        log(f"reads: kjson index write cost, {entries:,} entries per checkpoint: durable after "
            f"{out['with_median_s']:.2f} s with the index, {out['without_median_s']:.2f} s "
            "without")
    finally:
        for sub, _ in subs.values():
            sub.close()
        for store in stores.values():
            store.drop_tables()
            store.close()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    return out


LABELS = {
    "floor": "`SELECT 1` (floor: client + round trip)",
    "pk": "state table by primary key, ranges read once",
    "pk_ranges_view": "state table by primary key ⋈ `NS_committed_ranges`",
    "floor_c": "`SELECT 1`, C client",
    "pk_c": "state table by primary key, ranges read once, C client",
    "floor_capi": "`SELECT 1`, C API",
    "pk_capi": "state table by primary key, ranges read once, C API",
    "pk_versions_capi": f"state table by primary key, every version, picked by the client "
                        f"(`committed` checked every {VALIDATE_EVERY} reads), C API",
    "pk_versions": f"state table by primary key, every version, picked by the client "
                   f"(`committed` checked every {VALIDATE_EVERY} reads)",
    "query_sql_pk": "`pyflink-ndb query --sql` filtered by primary key",
    "view_pk": "`NS_committed` by primary key",
    "view_kjson": "`NS_committed` by `kjson`",
    "rows_pk": "`NS_committed_rows` by primary key",
    "rows_kjson": "`NS_committed_rows` by `kjson_key`",
    "view_key_text": "`NS_committed` by `key_text` (no index)",
    "get": "`pyflink-ndb get` read path (Python)",
    "view_pk_capi": "`NS_committed` by primary key, C API",
    "rows_pk_capi": "`NS_committed_rows` by primary key, C API",
    "model_plain_capi": "model: a view of the state table alone, C API",
    "model_rows_capi": "model: `NS_committed_rows` on a table of ranges, C API",
    "model_rows_all_capi": "model: the same without the newest-version check, C API",
    "model_plain": "model: a view of the state table alone",
    "model_rows": "model: `NS_committed_rows` on a table of ranges",
    "model_rows_all": "model: the same without the newest-version check",
}


def markdown(r: dict[str, Any]) -> list[str]:
    """The part's section of summary.md."""
    lines = ["## Committed-state point reads (one SQL client, MariaDB)", "",
             f"{r['keys']:,} keys (a ValueState and a {MAP_ENTRIES}-entry MapState each), "
             f"{r['rows']:,} state-table rows, committed through the checkpoint protocol "
             "(checkpoints 1-2 of one job, 3 of a job that restored 2). One pymysql "
             "connection, sequential, parameterised, autocommit; random keys after a "
             "warm-up; the rows marked \"C client\": one connection of "
             f"{r.get('c_client') or 'a C client (not installed in this run)'}; "
             "\"C API\": the same library's C API without its cursor layer (the statement "
             "with its parameters converted and escaped by the library, the rows fetched one "
             "by one: what a program in C does). "
             f"Server {r.get('server', '?')}; kjson index: "
             f"{'yes' if r.get('kjson_index') else 'no'}; load average "
             f"{r.get('loadavg_before', [0])[0]:.1f} before, "
             f"{r.get('loadavg_after', [0])[0]:.1f} after (other work on the machine "
             "inflates every figure; compare with the `SELECT 1` floor). Target: "
             "≥ 10,000 reads/s, p99 ≤ 1 ms. Server optimize / execute: medians of "
             "`ANALYZE FORMAT=JSON`.",
             "", f"Reads in rounds of {ROUND_READS:,} per query, the queries in turn; "
             "best round: the round of the query with the most reads/s (the least "
             "disturbed).", "",
             "| read | reads | reads/s | p50 ms | p99 ms | p99.9 ms | best round: reads/s, "
             "p99 ms | correct | index | server optimize / execute ms |"
             + (" CPU latency 0 µs: reads/s, p50 ms, p99 ms, correct |"
                if r.get("low_latency") else ""),
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"
             + ("---:|" if r.get("low_latency") else "")]
    low = (r.get("low_latency") or {}).get("queries")
    for label, q in r["queries"].items():
        ex = q.get("explain")
        server = q.get("server") or {}
        best = q.get("best_round") or {}
        lq = None if low is None else low.get(label)
        lines.append(
            f"| {LABELS.get(label, label)} | {q['reads']:,} | {q['reads_per_s']:,.0f} | "
            f"{q['p50_ms']:.3f} | {q['p99_ms']:.3f} | {q['p999_ms']:.3f} | "
            + ("–" if not best else f"{best['reads_per_s']:,.0f}, {best['p99_ms']:.3f}")
            + " | "
            f"{q['correct']:,} | {'–' if ex is None else ('yes' if ex['indexed'] else 'NO')} | "
            + ("–" if not server else
               f"{server['optimize_ms']:.3f} / {server['execute_ms']:.3f}") + " |"
            + ("" if low is None else " " + (
                "–" if lq is None else
                f"{lq['reads_per_s']:,.0f}, {lq['p50_ms']:.3f}, {lq['p99_ms']:.3f}, "
                f"{lq['correct']:,}/{lq['reads']:,}") + " |"))
    if r.get("cpu_latency_us") is not None:
        lines += ["", f"Every read of this part ran while the whole run held a CPU latency "
                  f"request of {r['cpu_latency_us']} µs (`--cpu-latency-us`); none ran again."]
    else:
        lines += ["", "CPU latency 0 µs: every read again, after all the others and on other "
                  "random keys, while the part held a Linux CPU latency QoS request of 0 µs "
                  "(`/dev/cpu_dma_latency`: the idle CPUs poll instead of halting; "
                  "bench/cpu_latency.py); idle states "
                  + (", ".join(f"`{n}`" for n in r["low_latency"]["idle_states"])
                     if r.get("low_latency") else "–")
                  + ("" if r.get("low_latency") else
                     ". Not measured in this run: the part could not hold the request (it "
                     "needs root and /dev/cpu_dma_latency)") + "."]
    bundles = r.get("bundles")
    if bundles:
        lines += ["", f"The package's own reads of keys that miss together (a read-ahead bundle "
                  f"after a restore): {bundles['bundles']} bundles of {bundles['size']} "
                  "random keys' ValueState entries, each read in both forms in turn "
                  f"({bundles['equal']}/{bundles['bundles']} bundles answered alike, "
                  f"{bundles['found']:,}/{bundles['asked']:,} entries found):", "",
                  "| form | ms per bundle (median) | keys/s |", "|---|---:|---:|"]
        for name, text in (("union", "UNION ALL of primary-key reads (NDB's form)"),
                           ("join", "join from a derived table of the keys (InnoDB)")):
            lines.append(f"| {text} | {bundles[name]['ms_per_bundle']:.1f} | "
                         f"{bundles[name]['keys_per_s']:,.0f} |")
    wc = r.get("write_cost")
    if wc:
        lines += ["", f"What the `kjson_key` index costs the writes: {wc['entries']:,} "
                  "ValueState entries re-written per checkpoint by one subtask, snapshot → "
                  f"durable, median of {wc['rounds']}: {wc['with_median_s'] * 1000:,.0f} ms "
                  f"with the index, {wc['without_median_s'] * 1000:,.0f} ms without "
                  f"({wc['with_median_s'] / wc['without_median_s']:.2f}×)."]
    lines += ["", "Fill: " + "; ".join(f"{k} {v:.1f} s" for k, v in r["phases_s"].items())
              + f". Part took {r.get('elapsed_s', 0) / 60:.1f} min.", ""]
    return lines
