"""`python -m bench.run [--quick]`: PyFlink's hashmap and RocksDB backends against
pyflink-ndb on SQLite and MariaDB, on the same jobs and machine in one run.

Figures (see README, "Benchmarks"):

1. records/s of the flight-delays job (uniform keys: the tail numbers; Zipf keys: each
   flight re-keyed to one of 50,000 synthetic keys, s=1.1, fixed seed), from the job's
   net runtime;
2. recovery: time from submitting a job that restores a stop-with-savepoint of N keys until
   its first record is processed (RocksDB vs pyflink-ndb on MariaDB, lazy restore);
3. checkpoint pause (`backend.snapshot(n)`) versus dirty-set size, without Flink;
4. point reads of the committed state with plain SQL on MariaDB from a separate connection.

Results go to `bench/results/` (summary.md, results.json, bench.png).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.functions import END_PREFIX, KeyedCounter, parse_key_line  # noqa: E402
from jobs.flight_data import departed_flights, flights_csv, parse_line  # noqa: E402
from jobs.flight_delays import OPERATOR_UID, AircraftDelays, make_environment  # noqa: E402
from pyflink_ndb.config import NdbStateOptions  # noqa: E402
from pyflink_ndb.stores.factory import create_store  # noqa: E402

WORK = ROOT / "var" / "bench"
DEFAULT_MYSQL_URL = os.environ.get("PYFLINK_NDB_TEST_MYSQL_URL",
                                   "mysql://root@127.0.0.1:3306/test")
CHECKPOINT_MS = 1000
ZIPF_KEYS = 50_000
ZIPF_S = 1.1
SEED = 20130101

BACKENDS = ("hashmap", "rocksdb", "ndb-sqlite", "ndb-mariadb")
LABELS = {"hashmap": "Flink hashmap", "rocksdb": "Flink RocksDB",
          "ndb-sqlite": "pyflink-ndb SQLite", "ndb-mariadb": "pyflink-ndb MariaDB"}
COLORS = {"hashmap": "#4c72b0", "rocksdb": "#dd8452", "ndb-sqlite": "#55a868",
          "ndb-mariadb": "#c44e52"}


def log(message: str) -> None:
    click.echo(f"[bench {time.strftime('%H:%M:%S')}] {message}", err=True)


# -- helpers ------------------------------------------------------------------------------
def mysql_connection(url: str) -> Any:
    import pymysql

    from pyflink_ndb.stores.mysql import parse_mysql_url

    args = parse_mysql_url(url)
    return pymysql.connect(host=args["host"], port=args["port"], user=args["user"],
                           password=args["password"] or "", database=args["database"],
                           charset="utf8mb4", autocommit=True, connect_timeout=5)


def drop_namespace(url: str, namespace: str) -> None:
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///"):]).unlink(missing_ok=True)
        return
    store = create_store(NdbStateOptions(url=url, namespace=namespace))
    try:
        store.drop_tables()
    finally:
        store.close()


def ndb_options(url: str, namespace: str) -> dict[str, str]:
    return {"state.backend.ndb.url": url, "state.backend.ndb.namespace": namespace,
            "state.backend.ndb.on-fresh-start": "truncate"}


def store_url(kind: str, mysql_url: str, name: str) -> str:
    if kind == "ndb-sqlite":
        return f"sqlite:///{WORK / (name + '.sqlite')}"
    return mysql_url


def flink_extra(kind: str, checkpoint_dir: Path) -> dict[str, str]:
    """Flink configuration of a backend; every backend checkpoints to the same kind of
    storage (a local folder) at the same interval."""
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    extra = {"state.checkpoints.dir": checkpoint_dir.as_uri()}
    if kind in ("hashmap", "rocksdb"):
        extra["state.backend.type"] = kind
    return extra


def discard(stream: Any) -> None:
    from pyflink.datastream.connectors import Sink
    from pyflink.java_gateway import get_gateway

    jvm = get_gateway().jvm
    stream.sink_to(Sink(jvm.org.apache.flink.streaming.api.functions.sink.v2
                        .DiscardingSink())).uid("discard")


def keyed_process(kind: str, keyed: Any, function: Any, output_type: Any, uid: str,
                  options: Mapping[str, str]) -> Any:
    """`keyed.process(fn)` for Flink's backends, `pyflink_ndb.process` for pyflink-ndb."""
    if kind in ("hashmap", "rocksdb"):
        return keyed.process(function, output_type).uid(uid)
    import pyflink_ndb

    return pyflink_ndb.process(keyed, function, output_type=output_type, uid=uid,
                               options=options)


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise click.ClickException(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.1)


def du_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def ratio(a: float | None, b: float | None) -> str:
    return "–" if not a or not b else f"{a / b:.2f}×"


# -- 1. throughput ------------------------------------------------------------------------
def zipf_csv(source: Path) -> tuple[Path, dict[str, Any]]:
    """`source` with each flight's tail number replaced by one of :data:`ZIPF_KEYS` keys
    drawn from a Zipf(s) law (numpy, fixed seed): deterministic for a given input."""
    target = WORK / f"{source.stem}-zipf.csv"
    lines = source.read_text().splitlines(keepends=True)
    header, body = lines[0], lines[1:]
    ranks = np.arange(1, ZIPF_KEYS + 1, dtype=np.float64)
    weights = ranks ** -ZIPF_S
    keys = np.random.default_rng(SEED).choice(ZIPF_KEYS, size=len(body),
                                               p=weights / weights.sum())
    tail = header.rstrip("\n").split(",").index("tailnum")
    out = [header]
    for line, key in zip(body, keys, strict=True):
        fields = line.split(",")
        fields[tail] = f"Z{key:05d}"
        out.append(",".join(fields))
    target.write_text("".join(out))
    counts = np.bincount(keys, minlength=ZIPF_KEYS)
    info = {"distinct_keys": int((counts > 0).sum()),
            "top_key_share": float(counts.max() / len(body))}
    return target, info


def run_flights(kind: str, csv: Path, dist: str, mysql_url: str, parallelism: int) -> dict:
    from pyflink.common import Types, WatermarkStrategy
    from pyflink.datastream.connectors.file_system import FileSource, StreamFormat

    name = f"bench_tp_{dist}"
    url = store_url(kind, mysql_url, name)
    options = ndb_options(url, name)
    if kind.startswith("ndb"):
        drop_namespace(url, name)
    env = make_environment(parallelism, CHECKPOINT_MS,
                           extra=flink_extra(kind, WORK / "checkpoints" / f"tp-{kind}-{dist}"))
    source = FileSource.for_record_stream_format(
        StreamFormat.text_line_format(), str(csv)).build()
    flights = (env.from_source(source, WatermarkStrategy.no_watermarks(), "flights")
               .uid("flights-source").map(parse_line).filter(lambda f: f is not None))
    output_type = Types.TUPLE([Types.STRING(), Types.LONG(), Types.LONG(), Types.LONG(),
                               Types.STRING()])
    updates = keyed_process(kind, flights.key_by(lambda f: f[0], key_type=Types.STRING()),
                            AircraftDelays(), output_type, OPERATOR_UID, options)
    discard(updates)
    started = time.monotonic()
    result = env.execute(f"bench-{kind}-{dist}")
    wall_s = time.monotonic() - started
    return {"net_s": result.get_net_runtime() / 1000, "wall_s": wall_s}


def bench_throughput(limit: int | None, mysql_url: str, parallelism: int,
                     repeat: int) -> dict:
    uniform = flights_csv(limit)
    zipf, zipf_info = zipf_csv(uniform)
    out: dict[str, Any] = {"zipf": zipf_info, "runs": {}}
    log("throughput: an untimed warm-up job (JVM, Python worker)")
    run_flights("hashmap", flights_csv(5_000), "warmup", mysql_url, parallelism)
    for dist, csv in (("uniform", uniform), ("zipf", zipf)):
        out[f"{dist}_records"] = sum(1 for _ in departed_flights(csv))
        out[f"{dist}_keys"] = len({f[0] for f in departed_flights(csv)})
    runs: dict[str, list[dict]] = {}
    for rep in range(repeat):  # the order of the backends rotates between rounds
        for dist, csv in (("uniform", uniform), ("zipf", zipf)):
            for kind in BACKENDS[rep % 4:] + BACKENDS[:rep % 4]:
                log(f"throughput round {rep + 1}/{repeat}, {dist} "
                    f"({out[f'{dist}_records']} records) on {kind}")
                run = run_flights(kind, csv, dist, mysql_url, parallelism)
                run["records_per_s"] = out[f"{dist}_records"] / run["net_s"]
                runs.setdefault(f"{kind}/{dist}", []).append(run)
                log(f"  {run['records_per_s']:,.0f} records/s (net {run['net_s']:.1f} s)")
    for key, all_runs in runs.items():
        rates = [r["records_per_s"] for r in all_runs]
        out["runs"][key] = {"records_per_s": statistics.median(rates), "all": rates,
                            "net_s": statistics.median(r["net_s"] for r in all_runs)}
    return out


# -- 2. recovery --------------------------------------------------------------------------
def key_stream(env: Any, path: Path, continuous: bool) -> Any:
    from pyflink.common import Duration, Types, WatermarkStrategy
    from pyflink.datastream.connectors.file_system import FileSource, StreamFormat

    builder = FileSource.for_record_stream_format(StreamFormat.text_line_format(), str(path))
    if continuous:
        builder = builder.monitor_continuously(Duration.of_seconds(1))
    uid = "keys-continuous" if continuous else "keys-bounded"
    return (env.from_source(builder.build(), WatermarkStrategy.no_watermarks(), uid).uid(uid)
            .map(parse_key_line, output_type=Types.STRING())
            .filter(lambda k: k is not None)
            .key_by(lambda k: k, key_type=Types.STRING()))


def run_recovery(kind: str, n: int, probes: int, mysql_url: str, parallelism: int) -> dict:
    """Build `n` keys with a continuous job, stop it with a savepoint, then time a job that
    restores it (or, for n == 0, starts fresh) until its first record is processed."""
    from pyflink.common import Types

    work = WORK / "recovery" / f"{kind}-{n}"
    shutil.rmtree(work, ignore_errors=True)
    for sub in ("input", "markers", "markers2", "probe"):
        (work / sub).mkdir(parents=True)
    rng = np.random.default_rng(SEED + n)
    probe_keys = rng.integers(0, n or 10_000, size=probes)  # n == 0: new keys
    (work / "probe" / "probe.csv").write_text("".join(f"k{k:07d}\n" for k in probe_keys))
    namespace = f"bench_rec_{n}"
    options = ndb_options(mysql_url, namespace)
    if kind.startswith("ndb"):
        drop_namespace(mysql_url, namespace)
    extra = flink_extra(kind, work / "checkpoints")
    out: dict[str, Any] = {}
    restore_extra = dict(extra)
    if n > 0:
        (work / "input" / "keys.csv").write_text(
            "".join(f"k{i:07d}\n" for i in range(n))
            + "".join(f"{END_PREFIX}{i:02d}\n" for i in range(64)))
        env = make_environment(parallelism, CHECKPOINT_MS, extra=extra)
        discard(keyed_process(kind, key_stream(env, work / "input", True),
                              KeyedCounter(str(work / "markers")), Types.STRING(),
                              "bench-state", options))
        started = time.monotonic()
        client = env.execute_async(f"bench-build-{kind}-{n}")
        wait_until(lambda: len(list((work / "markers").glob("end-*"))) >= parallelism,
                   600, "the state-building job to process its input")
        if kind.startswith("ndb"):  # a savepoint of pyflink-ndb needs a committed checkpoint
            from pyflink_ndb.config import from_flink_keys
            from pyflink_ndb.stores.factory import open_store

            store = open_store(from_flink_keys(options))
            try:
                wait_until(lambda: store.latest_committed_checkpoint("bench-state") is not None,
                           120, "a committed checkpoint")
            finally:
                store.close()
        savepoint = client.stop_with_savepoint(False, (work / "savepoints").as_uri()).result()
        out["build_s"] = time.monotonic() - started
        if kind.startswith("ndb"):
            conn = mysql_connection(mysql_url)
            try:
                with conn.cursor() as cur:
                    cur.execute(f"SELECT COUNT(*), COALESCE(SUM(LENGTH(vbytes)), 0) "
                                f"FROM {namespace}_state")
                    rows, vbytes = cur.fetchone()
            finally:
                conn.close()
            out["state_rows"], out["state_bytes"] = int(rows), int(vbytes)
        else:
            out["state_bytes"] = du_bytes(Path(savepoint.removeprefix("file:")))
        restore_extra.update({"execution.savepoint.path": savepoint,
                              "execution.savepoint.ignore-unclaimed-state": "true"})
        restore_extra.update(flink_extra(kind, work / "checkpoints-restore"))
    env = make_environment(parallelism, CHECKPOINT_MS, extra=restore_extra)
    discard(keyed_process(kind, key_stream(env, work / "probe" / "probe.csv", False),
                          KeyedCounter(str(work / "markers2")), Types.STRING(),
                          "bench-state", options))
    submitted = time.time()
    client = env.execute_async(f"bench-restore-{kind}-{n}")
    result = client.get_job_execution_result().result()
    firsts = [float(p.read_text()) for p in (work / "markers2").glob("first-*")]
    if len(firsts) < parallelism:
        raise click.ClickException(f"only {len(firsts)} subtasks processed a record")
    out["first_record_s"] = max(firsts) - submitted
    out["probe_net_s"] = result.get_net_runtime() / 1000
    return out


def bench_recovery(sizes: list[int], probes: int, mysql_url: str, parallelism: int,
                   repeat: int) -> dict:
    log("recovery: an untimed warm-up job")
    run_recovery("rocksdb", 0, probes, mysql_url, parallelism)
    out: dict[str, Any] = {}
    for rep in range(repeat):
        for n in [0, *sizes]:  # backends alternate so that drift hits both alike
            kinds = ("rocksdb", "ndb-mariadb") if rep % 2 == 0 else ("ndb-mariadb", "rocksdb")
            for kind in kinds:
                log(f"recovery round {rep + 1}/{repeat}, {kind}, {n} keys"
                    + (" (fresh start baseline)" if n == 0 else ""))
                run = run_recovery(kind, n, probes, mysql_url, parallelism)
                log(f"  first record {run['first_record_s']:.2f} s after submit")
                previous = out.get(f"{kind}/{n}")
                firsts = (previous["all"] if previous else []) + [run["first_record_s"]]
                probe_s = (previous["all_probe_net_s"] if previous else []) + [
                    run["probe_net_s"]]
                run.update(all=firsts, first_record_s=statistics.median(firsts),
                           all_probe_net_s=probe_s, probe_net_s=statistics.median(probe_s))
                out[f"{kind}/{n}"] = run
    return out


# -- 3. checkpoint pause ------------------------------------------------------------------
def bench_snapshot(sizes: list[int], rounds: int, mysql_url: str) -> dict:
    from pyflink.common import Types
    from pyflink.datastream.state import ValueStateDescriptor

    from pyflink_ndb.config import NdbStateOptions
    from pyflink_ndb.stores.factory import open_store
    from pyflink_ndb.testing import LocalSubtask

    out: dict[str, Any] = {}
    for kind in ("ndb-sqlite", "ndb-mariadb"):
        for n in sizes:
            namespace = f"bench_snap_{n}"
            url = store_url(kind, mysql_url, namespace)
            drop_namespace(url, namespace)
            options = NdbStateOptions(url=url, namespace=namespace,
                                      local_dir=str(WORK / "local"))
            store = open_store(options)
            sub = LocalSubtask(store, options, local_dir=str(WORK / "local"))
            try:
                state = sub.context.get_state(
                    ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
                pauses = []
                for epoch in range(1, rounds + 1):
                    for i in range(n):
                        sub.key(f"k{i:07d}")
                        state.update((epoch, i, "x" * 100))
                    started = time.perf_counter()
                    sub.backend.snapshot(epoch)
                    pauses.append(time.perf_counter() - started)
                    sub.backend.notify_checkpoint_complete(epoch)
            finally:
                sub.close()
                store.close()
            out[f"{kind}/{n}"] = {"pauses_s": pauses, "median_s": statistics.median(pauses)}
            log(f"snapshot {kind} {n} dirty: median {statistics.median(pauses) * 1000:.0f} ms")
    return out


# -- 4. SQL reads -------------------------------------------------------------------------
def bench_sql_reads(mysql_url: str, reads: int, view_reads: int) -> dict:
    """Point reads of the committed state of the MariaDB throughput run (uniform keys)."""
    namespace = "bench_tp_uniform"
    conn = mysql_connection(mysql_url)
    out: dict[str, Any] = {}
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT MAX(epoch) FROM {namespace}_epochs WHERE operator = %s "
                        "AND is_savepoint = 0", (OPERATOR_UID,))
            (latest,) = cur.fetchone()
            cur.execute(f"SELECT DISTINCT s.key_group, s.state_id, s.ukey, s.kjson FROM "
                        f"{namespace}_state s WHERE s.chunk = 0 AND s.epoch <= %s", (latest,))
            keys = cur.fetchall()
            cur.execute(f"SELECT COUNT(*) FROM {namespace}_state")
            out["table_rows"] = int(cur.fetchone()[0])
            out["keys"] = len(keys)
            rng = np.random.default_rng(SEED)
            pk_sql = (f"SELECT vjson FROM {namespace}_state WHERE key_group = %s AND "
                      "state_id = %s AND ukey = %s AND chunk = 0 AND epoch <= %s "
                      "ORDER BY epoch DESC LIMIT 1")
            view_sql = (f"SELECT q.vjson FROM ({_view_sql(mysql_url, namespace)}) q "
                        "WHERE q.kjson = %s")
            for label, sql, count, params in (
                    ("pk", pk_sql, reads, lambda k: (k[0], k[1], k[2], latest)),
                    ("view", view_sql, view_reads, lambda k: (k[3],))):
                picks = rng.integers(0, len(keys), size=count)
                latencies = []
                found = 0
                started = time.perf_counter()
                for i in picks:
                    t = time.perf_counter()
                    cur.execute(sql, params(keys[i]))
                    found += cur.fetchone() is not None
                    latencies.append(time.perf_counter() - t)
                elapsed = time.perf_counter() - started
                out[label] = {"reads": count, "found": found, "reads_per_s": count / elapsed,
                              "p50_ms": float(np.percentile(latencies, 50) * 1000),
                              "p99_ms": float(np.percentile(latencies, 99) * 1000)}
                log(f"sql {label}: {count / elapsed:,.0f} reads/s, "
                    f"p99 {out[label]['p99_ms']:.2f} ms")
    finally:
        conn.close()
    return out


def _view_sql(mysql_url: str, namespace: str) -> str:
    from pyflink_ndb.stores.mysql import MysqlStateStore

    return MysqlStateStore(mysql_url, namespace).committed_view_sql()


# -- report -------------------------------------------------------------------------------
def summary_markdown(meta: dict, results: dict) -> str:
    lines = [f"# pyflink-ndb benchmark ({'quick' if meta['quick'] else 'full'} run)", "",
             f"{meta['when']}, commit {meta['commit']}, {meta['cpus']} CPUs, "
             f"parallelism {meta['parallelism']}, checkpoints every {CHECKPOINT_MS} ms, "
             f"median of {meta.get('rounds', 1)} round(s) for throughput and recovery, "
             "pyflink-ndb cache 10,000 entries per subtask. One run on a noisy machine: "
             "read the ratios, not the absolute figures.", ""]
    tp = results.get("throughput")
    if tp:
        lines += ["## 1. Throughput (flight-delays job, records/s from net runtime)", "",
                  f"Uniform: {tp['uniform_records']:,} flights, {tp['uniform_keys']:,} tail "
                  f"numbers. Zipf: the same flights re-keyed to {ZIPF_KEYS:,} keys (s={ZIPF_S}, "
                  f"{tp['zipf']['distinct_keys']:,} used, hottest key "
                  f"{tp['zipf']['top_key_share']:.1%} of records).", "",
                  "| backend | uniform rec/s | zipf rec/s | uniform / hashmap | "
                  "uniform / RocksDB | zipf / hashmap | zipf / RocksDB |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for kind in BACKENDS:
            row = [LABELS[kind]]
            for dist in ("uniform", "zipf"):
                row.append(f"{tp['runs'][f'{kind}/{dist}']['records_per_s']:,.0f}")
            for dist in ("uniform", "zipf"):
                mine = tp["runs"][f"{kind}/{dist}"]["records_per_s"]
                row += [ratio(mine, tp["runs"][f"hashmap/{dist}"]["records_per_s"]),
                        ratio(mine, tp["runs"][f"rocksdb/{dist}"]["records_per_s"])]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    rec = results.get("recovery")
    if rec:
        lines += ["## 2. Recovery (submit → first record processed, after stop-with-savepoint)",
                  "", "N keys of ~120 bytes each; 0 = a fresh start without state (the job "
                  "start-up cost both share). pyflink-ndb on MariaDB, lazy restore.", "",
                  "| N keys | RocksDB s | pyflink-ndb s | ndb / RocksDB | RocksDB − fresh s "
                  "| ndb − fresh s | RocksDB savepoint | ndb state (value bytes) "
                  "| probe job net s RocksDB / ndb |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for n in sorted({int(k.split("/")[1]) for k in rec}):
            r, d = rec[f"rocksdb/{n}"], rec[f"ndb-mariadb/{n}"]
            rf, df = rec["rocksdb/0"]["first_record_s"], rec["ndb-mariadb/0"]["first_record_s"]
            lines.append(
                f"| {n:,} | {r['first_record_s']:.2f} | {d['first_record_s']:.2f} | "
                f"{ratio(d['first_record_s'], r['first_record_s'])} | "
                f"{r['first_record_s'] - rf:+.2f} | {d['first_record_s'] - df:+.2f} | "
                f"{r.get('state_bytes', 0) / 1e6:.1f} MB | "
                f"{d.get('state_bytes', 0) / 1e6:.1f} MB | "
                f"{r['probe_net_s']:.2f} / {d['probe_net_s']:.2f} |")
        lines.append("")
    snap = results.get("snapshot")
    if snap:
        lines += ["## 3. Checkpoint pause versus dirty entries (`backend.snapshot(n)`, no Flink)",
                  "", "Median over the rounds; each round re-dirties every entry.", "",
                  "| dirty entries | SQLite ms | MariaDB ms | SQLite µs/entry | "
                  "MariaDB µs/entry |", "|---:|---:|---:|---:|---:|"]
        for n in sorted({int(k.split("/")[1]) for k in snap}):
            s, m = snap[f"ndb-sqlite/{n}"]["median_s"], snap[f"ndb-mariadb/{n}"]["median_s"]
            lines.append(f"| {n:,} | {s * 1000:,.0f} | {m * 1000:,.0f} | {s / n * 1e6:.1f} | "
                         f"{m / n * 1e6:.1f} |")
        lines.append("")
    sql = results.get("sql")
    if sql:
        lines += ["## 4. Committed-state SQL reads (MariaDB, separate connection)", "",
                  f"State of the uniform MariaDB run: {sql['keys']:,} keys, "
                  f"{sql['table_rows']:,} rows.", "",
                  "| query | reads | reads/s | p50 ms | p99 ms |", "|---|---:|---:|---:|---:|"]
        for label, text in (("pk", "PK: newest version ≤ latest committed epoch"),
                            ("view", "`committed_view_sql()` filtered by kjson")):
            q = sql[label]
            lines.append(f"| {text} | {q['reads']:,} | {q['reads_per_s']:,.0f} | "
                         f"{q['p50_ms']:.2f} | {q['p99_ms']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def chart(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax = axes[0][0]
    tp = results.get("throughput")
    if tp:
        width = 0.2
        for i, kind in enumerate(BACKENDS):
            values = [tp["runs"][f"{kind}/{d}"]["records_per_s"] for d in ("uniform", "zipf")]
            bars = ax.bar(np.arange(2) + (i - 1.5) * width, values, width, label=LABELS[kind],
                          color=COLORS[kind])
            ax.bar_label(bars, fmt="{:,.0f}", fontsize=7)
        ax.set_xticks(range(2), [f"uniform ({tp['uniform_keys']:,} keys)",
                                 f"Zipf s={ZIPF_S} ({ZIPF_KEYS:,} keys)"])
        ax.set_ylabel("records/s (net runtime)")
        ax.legend(fontsize=8)
    ax.set_title("1. Flight-delays job throughput")
    ax = axes[0][1]
    rec = results.get("recovery")
    if rec:
        for kind in ("rocksdb", "ndb-mariadb"):
            ns = sorted(int(k.split("/")[1]) for k in rec if k.startswith(kind + "/"))
            secs = [rec[f"{kind}/{n}"]["first_record_s"] for n in ns]
            ax.plot(ns, secs, "o-", color=COLORS[kind],
                    label=LABELS[kind] + (" (lazy)" if "ndb" in kind else ""))
            for n, v in zip(ns, secs, strict=True):
                ax.annotate(f"{v:.2f} s", (n, v), textcoords="offset points",
                            xytext=(6, 6 if "ndb" in kind else -12), fontsize=8,
                            color=COLORS[kind])
        ax.margins(x=0.12, y=0.15)
        ax.set_xlabel("keys in the restored savepoint (0 = fresh start)")
        ax.set_ylabel("s from submit to first record")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    ax.set_title("2. Recovery time versus state size")
    ax = axes[1][0]
    snap = results.get("snapshot")
    if snap:
        for kind in ("ndb-sqlite", "ndb-mariadb"):
            ns = sorted(int(k.split("/")[1]) for k in snap if k.startswith(kind + "/"))
            ms = [snap[f"{kind}/{n}"]["median_s"] * 1000 for n in ns]
            ax.plot(ns, ms, "o-", color=COLORS[kind], label=LABELS[kind])
            for n, v in zip(ns, ms, strict=True):
                ax.annotate(f"{v:,.0f} ms", (n, v), textcoords="offset points",
                            xytext=(6, -12 if "sqlite" in kind else 6), fontsize=8,
                            color=COLORS[kind])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.margins(x=0.15, y=0.15)
        ax.set_xlabel("dirty ValueState entries")
        ax.set_ylabel("snapshot pause (ms, median)")
        ax.legend(fontsize=8)
    ax.set_title("3. Checkpoint pause versus dirty-set size (no Flink)")
    ax = axes[1][1]
    sql = results.get("sql")
    if sql:
        labels = ["PK read", "committed view\nby kjson"]
        values = [sql["pk"]["reads_per_s"], sql["view"]["reads_per_s"]]
        bars = ax.bar(labels, values, color=[COLORS["ndb-mariadb"], "#8172b3"], width=0.5)
        ax.bar_label(bars, labels=[f"{v:,.0f}/s, p99 {sql[k]['p99_ms']:.2f} ms"
                                   for v, k in zip(values, ("pk", "view"), strict=True)],
                     fontsize=9)
        ax.set_ylim(0, max(values) * 1.2)
        ax.set_ylabel("reads/s (one connection)")
    ax.set_title("4. Committed-state SQL reads on MariaDB")
    fig.suptitle("pyflink-ndb vs Flink state backends (one run, same machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@click.command()
@click.option("--quick", is_flag=True, help="Smaller sizes: a smoke run of a few minutes.")
@click.option("--mysql-url", default=DEFAULT_MYSQL_URL, show_default=True,
              help="MariaDB/MySQL server for pyflink-ndb's MariaDB runs.")
@click.option("--parallelism", default=2, show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=ROOT / "bench" / "results", show_default=True)
@click.option("--only", multiple=True,
              type=click.Choice(["throughput", "recovery", "snapshot", "sql"]),
              help="Run only these parts (repeatable; default: all). `sql` reads the state "
                   "of the throughput run.")
@click.option("--repeat", type=int, default=None,
              help="Rounds of the throughput and recovery jobs, median reported "
                   "(default: 3, --quick: 1).")
@click.option("--replot", is_flag=True,
              help="Only redraw summary.md and bench.png from OUT/results.json.")
def main(quick: bool, mysql_url: str, parallelism: int, out_dir: Path,
         only: tuple[str, ...], repeat: int | None, replot: bool) -> None:
    """Benchmark pyflink-ndb against PyFlink's hashmap and RocksDB backends."""
    if replot:
        saved = json.loads((out_dir / "results.json").read_text())
        (out_dir / "summary.md").write_text(
            summary_markdown(saved["meta"], saved["results"]) + "\n")
        chart(saved["results"], out_dir / "bench.png")
        click.echo((out_dir / "summary.md").read_text())
        return
    parts = set(only or ("throughput", "recovery", "snapshot", "sql"))
    rounds = repeat or (1 if quick else 3)
    WORK.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    mysql_connection(mysql_url).close()
    meta = {"quick": quick, "rounds": rounds, "when": time.strftime("%Y-%m-%d %H:%M"),
            "commit": git_commit(),
            "cpus": os.cpu_count(), "parallelism": parallelism,
            "python": platform.python_version()}
    results: dict[str, Any] = {}
    started = time.monotonic()
    if "throughput" in parts:
        results["throughput"] = bench_throughput(40_000 if quick else None, mysql_url,
                                                 parallelism, rounds)
    if "recovery" in parts:
        results["recovery"] = bench_recovery([2_000, 10_000] if quick else [10_000, 100_000],
                                             200 if quick else 1000, mysql_url, parallelism,
                                             rounds)
    if "snapshot" in parts:
        results["snapshot"] = bench_snapshot([1_000, 10_000] if quick
                                             else [1_000, 10_000, 100_000],
                                             2 if quick else 3, mysql_url)
    if "sql" in parts:
        results["sql"] = bench_sql_reads(mysql_url, 1_000 if quick else 5_000,
                                         20 if quick else 100)
    meta["elapsed_s"] = time.monotonic() - started
    (out_dir / "results.json").write_text(json.dumps({"meta": meta, "results": results},
                                                     indent=2))
    summary = summary_markdown(meta, results)
    (out_dir / "summary.md").write_text(summary + "\n")
    chart(results, out_dir / "bench.png")
    click.echo(summary)
    log(f"done in {meta['elapsed_s'] / 60:.1f} min: {out_dir}/summary.md, bench.png")


if __name__ == "__main__":
    main()
