"""`python -m bench.run [--quick]`: PyFlink's hashmap and RocksDB backends against
pyflink-ndb on SQLite and MariaDB, on the same jobs and machine in one run.

Figures (see README, "Benchmarks"):

1. records/s of the flight-delays job (uniform keys: the tail numbers; Zipf keys: each
   flight re-keyed to one of 50,000 synthetic keys, s=1.1, fixed seed), from the job's
   net runtime, RocksDB with full and with incremental checkpoints, and each run's
   checkpoints (count, end-to-end, sync and async ms) from Flink's REST API; each backend
   and round in a JVM of its own, whose peak resident set is reported;
2. recovery: time from submitting a job that restores a stop-with-savepoint of N keys until
   its first record is processed (RocksDB vs pyflink-ndb on MariaDB, lazy restore);
3. checkpoint pause (`--only snapshot` or `checkpoint-pause`): the synchronous pause
   (`backend.snapshot(n)`) and the time until the epoch is durable versus dirty-set size,
   without Flink, with `write.async` true and false; and on Flink, a job that updates a
   100,000-key ValueState counter as fast as it can with checkpoints every second (RocksDB
   with incremental checkpoints, pyflink-ndb with and without the asynchronous flush):
   records per second over time, Flink's per-checkpoint sync / async / end-to-end
   durations from the MiniCluster's REST API, and pyflink-ndb's dirty entries per
   checkpoint (checkpoint-pause.png); and the same job at about 1k, 10k and 100k dirty
   entries per subtask (:data:`PAUSE_SWEEP`: Flink's sync duration, RocksDB against
   pyflink-ndb on MariaDB);
4. point reads of the committed state with plain SQL on MariaDB from a separate connection;
5. restore time versus state-table rows: submit → first record after restoring a savepoint
   of pyflink-ndb on MariaDB whose state table was bulk-filled to 10k / 100k / 1M rows, half
   of them an abandoned epoch that a format-1 restore deleted before the first record; and
   the rows the restore deleted (none: cleanup runs later, in the background);
6. committed-state point reads (`--only reads`, bench/reads.py): one SQL client on MariaDB
   reading random keys of 100,000 by primary key, through the `<ns>_committed` view and by
   `kjson`, and through `pyflink-ndb get`'s read path: reads/s, p50/p99/p99.9, EXPLAIN;
   pymysql, a C client and its C API; every read again with a CPU latency request of 0 µs
   held (bench/cpu_latency.py);
7. the user-profile job (`--only profile`, bench/profile.py; issue 9, workload b): per
   Zipf-drawn user a ValueState, a MapState with TTL and a ListState (about 1 KB), on
   hashmap, RocksDB full and incremental, pyflink-ndb on SQLite and MariaDB (and RocksDB
   and pyflink-ndb with unaligned checkpoints), each in a fresh JVM: records/s, Flink's
   checkpoint end-to-end, start delay, alignment and sync durations, the JVM's peak RSS;
8. recovery and rescale (`--only recovery-rescale`, bench/recovery.py; issue 9, workload c): N
   keys × 1 KB built, a failure after a covering checkpoint, a 10,000-record probe of
   random keys; stop-with-savepoint and a restore at another parallelism; on every
   backend of part 7 (RocksDB also with native savepoints), each run in a fresh JVM;
9. state work without Flink (`--only state-work`, bench/statework.py; issue 9, item 4):
   part 7's state calls replayed on a LocalSubtask: CPU microseconds per record of the
   task thread and of the background writer, against a floor of plain dicts;
10. misses after a restore (`--only key-filter`, bench/keyfilter.py; issue 9, item 1): a
   probe of existing and new keys right after a lazy restore, with `restore.key-filter`
   off and on: round trips, seconds, the filter's build time, size and false positives.

Results go to `bench/results/` (summary.md, results.json, bench.png, checkpoint-pause.png).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
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

from bench import cpu_latency  # noqa: E402
from bench.functions import END_PREFIX, KeyedCounter, parse_key_line  # noqa: E402
from jobs.flight_data import departed_flights, flights_csv, parse_line  # noqa: E402
from jobs.flight_delays import OPERATOR_UID, AircraftDelays, make_environment  # noqa: E402
from pyflink_ndb.config import NdbStateOptions  # noqa: E402
from pyflink_ndb.stores.factory import create_store  # noqa: E402
from pyflink_ndb.stores.lineage import MAX_EPOCH, version_of  # noqa: E402

WORK = ROOT / "var" / "bench"
DEFAULT_MYSQL_URL = os.environ.get("PYFLINK_NDB_TEST_MYSQL_URL",
                                   "mysql://root@127.0.0.1:3306/test")
CHECKPOINT_MS = 1000
#: Prefix of every namespace the benchmark creates (`--namespace-prefix`): two runs with
#: different prefixes never touch each other's tables. A one-element list, set by main().
NAMESPACE_PREFIX = ["bench"]
ZIPF_KEYS = 50_000
ZIPF_S = 1.1
SEED = 20130101

#: Part 1's backends; "rocksdb" checkpoints in full, "rocksdb-incremental" uploads only
#: new SST files (`state.backend.incremental`): part 1 compares with the faster of the two.
BACKENDS = ("hashmap", "rocksdb", "rocksdb-incremental", "ndb-sqlite", "ndb-mariadb")
#: Flink's own state backends among the kinds (the others are pyflink-ndb).
FLINK_BACKENDS = ("hashmap", "rocksdb", "rocksdb-incremental")
LABELS = {"hashmap": "Flink hashmap", "rocksdb": "Flink RocksDB",
          "rocksdb-incremental": "Flink RocksDB, incremental",
          "ndb-sqlite": "pyflink-ndb SQLite", "ndb-mariadb": "pyflink-ndb MariaDB"}
COLORS = {"hashmap": "#4c72b0", "rocksdb": "#dd8452", "rocksdb-incremental": "#8c564b",
          "ndb-sqlite": "#55a868", "ndb-mariadb": "#c44e52"}


def log(message: str) -> None:
    click.echo(f"[bench {time.strftime('%H:%M:%S')}] {message}", err=True)


# -- helpers ------------------------------------------------------------------------------
def mysql_connection(url: str) -> Any:
    import pymysql

    from pyflink_ndb.stores.mysql import parse_mysql_url

    args = parse_mysql_url(url)
    return pymysql.connect(host=args["host"], port=args["port"], user=args["user"],
                           password=args["password"] or "", database=args["database"],
                           charset="utf8mb4", autocommit=True, connect_timeout=5,
                           binary_prefix=True)


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


#: Managed memory of the MiniCluster's TaskManager, for every backend: 512 MB per slot at
#: parallelism 2, what a default standalone TaskManager gives its one slot. Flink's
#: local-execution default (128 MB in all) write-stalls RocksDB on write-heavy jobs (its
#: LOG: "Stopping writes because we have 2 immutable memtables"); hashmap and pyflink-ndb
#: do not use managed memory in thread mode.
MANAGED_MEMORY = "1024m"


def flink_extra(kind: str, checkpoint_dir: Path) -> dict[str, str]:
    """Flink configuration of a backend; every backend checkpoints to the same kind of
    storage (a local folder) at the same interval, with the same TaskManager memory
    (:data:`MANAGED_MEMORY`)."""
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    extra = {"state.checkpoints.dir": checkpoint_dir.as_uri(),
             "taskmanager.memory.managed.size": MANAGED_MEMORY}
    if kind in FLINK_BACKENDS:
        extra["state.backend.type"] = kind.split("-")[0]
    if kind == "rocksdb-incremental":
        extra["state.backend.incremental"] = "true"
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
    if kind in FLINK_BACKENDS:
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

    name = f"{NAMESPACE_PREFIX[0]}_tp_{dist}"
    url = store_url(kind, mysql_url, name)
    options = ndb_options(url, name)
    if kind.startswith("ndb"):
        drop_namespace(url, name)
    extra = flink_extra(kind, WORK / "checkpoints" / f"tp-{kind}-{dist}")
    port = free_port()
    extra.update({"rest.port": str(port), "rest.bind-port": str(port),
                  "web.checkpoints.history": "1000"})
    env = make_environment(parallelism, CHECKPOINT_MS, extra=extra)
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
    client = env.execute_async(f"bench-{kind}-{dist}")
    poller = CheckpointPoller(port, str(client.get_job_id()))
    result = client.get_job_execution_result()
    while not result.done():  # the job's REST endpoint ends with it: poll while it runs
        poller.poll()
        time.sleep(1.0)
    net_s = result.result().get_net_runtime() / 1000
    return {"net_s": net_s, "wall_s": time.monotonic() - started, **poller.summary()}


def run_flights_backend(kind: str, jobs: list[list[str]], mysql_url: str, parallelism: int,
                        warmup_csv: str) -> dict[str, Any]:
    """Part 1 on one backend in this process's own JVM (see :func:`child`): an untimed
    warm-up job on `warmup_csv` (the JVM's JIT, the Python worker), then the timed job on
    each `[dist, csv path]` of `jobs`, one after the other.

    :returns: `{"runs": {dist: run}, "java_hwm_kb": int | None}`, each run the figures of
        :func:`run_flights` plus `java_peak_kb`, the JVM's peak resident set while that job
        ran (VmRSS sampled every 0.25 s; None: no sample); `java_hwm_kb`: the JVM's VmHWM
        at the end, its peak over the whole process (warm-up and every job; None: not
        readable).
    """
    from bench.profile import RssSampler, java_pid, proc_status_kb

    run_flights(kind, Path(warmup_csv), "warmup", mysql_url, parallelism)
    jvm = java_pid()
    sampler = RssSampler(jvm)
    sampler.start()
    runs: dict[str, dict[str, Any]] = {}
    try:
        for dist, csv in jobs:
            since = time.time()
            run = run_flights(kind, Path(csv), dist, mysql_url, parallelism)
            run["java_peak_kb"] = sampler.peak_kb(since, time.time())
            runs[dist] = run
    finally:
        sampler.stopped.set()
    return {"runs": runs, "java_hwm_kb": proc_status_kb(jvm, "VmHWM")}


def child() -> None:
    """Entry point of part 1's process per backend and round: `python -c "from bench.run
    import child; child()" '<json arguments>'` (:func:`bench.profile.run_child`), hence a
    JVM of the backend's own, whose peak memory is that backend's alone. The arguments are
    those of :func:`run_flights_backend` plus `prefix` (:data:`NAMESPACE_PREFIX`) and
    `result`, the file the result is written to."""
    args = json.loads(sys.argv[1])
    result_path = Path(args.pop("result"))
    NAMESPACE_PREFIX[0] = args.pop("prefix")
    result_path.write_text(json.dumps(run_flights_backend(**args)))


def bench_throughput(limit: int | None, mysql_url: str, parallelism: int,
                     repeat: int) -> dict:
    """Part 1: the flight job, uniform and Zipf keys, on every backend of :data:`BACKENDS`,
    `repeat` rounds (the backends' order rotates between rounds), each backend and round
    in a Python process and JVM of its own (:func:`child`); medians over the rounds.

    :raises RuntimeError: a backend's process failed (its log is named)."""
    from bench.profile import run_child

    uniform = flights_csv(limit)
    zipf, zipf_info = zipf_csv(uniform)
    warmup = flights_csv(5_000)
    out: dict[str, Any] = {"zipf": zipf_info, "runs": {}}
    dists = (("uniform", uniform), ("zipf", zipf))
    for dist, csv in dists:
        out[f"{dist}_records"] = sum(1 for _ in departed_flights(csv))
        out[f"{dist}_keys"] = len({f[0] for f in departed_flights(csv)})
    runs: dict[str, list[dict]] = {}
    hwm: dict[str, list[int]] = {}
    for rep in range(repeat):  # the order of the backends rotates between rounds
        for kind in BACKENDS[rep % len(BACKENDS):] + BACKENDS[:rep % len(BACKENDS)]:
            log(f"throughput round {rep + 1}/{repeat} on {kind} (a JVM of its own: a "
                f"warm-up, then uniform ({out['uniform_records']} records) and zipf)")
            folder = WORK / "throughput" / f"{kind}-{rep + 1}"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            result_file = folder / "result.json"
            args = {"kind": kind, "jobs": [[d, str(c)] for d, c in dists],
                    "mysql_url": mysql_url, "parallelism": parallelism,
                    "warmup_csv": str(warmup), "prefix": NAMESPACE_PREFIX[0],
                    "result": str(result_file)}
            returncode, loads, _ = run_child("bench.run", args, folder, 1800)
            if returncode != 0 or not result_file.exists():
                raise RuntimeError(f"part 1 on {kind} failed (exit code {returncode}); "
                                   f"see {folder / 'child.log'} and {folder / 'log'}")
            result = json.loads(result_file.read_text())
            if result["java_hwm_kb"] is not None:
                hwm.setdefault(kind, []).append(result["java_hwm_kb"])
            for dist, run in result["runs"].items():
                run["records_per_s"] = out[f"{dist}_records"] / run["net_s"]
                run["load_max"] = max(loads, default=None)
                runs.setdefault(f"{kind}/{dist}", []).append(run)
                log(f"  {dist}: {run['records_per_s']:,.0f} records/s (net "
                    f"{run['net_s']:.1f} s)")
    for key, all_runs in runs.items():
        rates = [r["records_per_s"] for r in all_runs]
        out["runs"][key] = {"records_per_s": statistics.median(rates), "all": rates,
                            "net_s": statistics.median(r["net_s"] for r in all_runs)}
        for field in ("checkpoints", "e2e_median_ms", "sync_median_ms", "sync_max_ms",
                      "async_median_ms", "java_peak_kb"):
            values = [r[field] for r in all_runs if r.get(field) is not None]
            out["runs"][key][field] = statistics.median(values) if values else None
        kind = key.split("/")[0]
        out["runs"][key]["java_hwm_kb"] = statistics.median(hwm[kind]) if kind in hwm else None
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


def build_savepoint(kind: str, work: Path, n: int, extra: Mapping[str, str],
                    options: Mapping[str, str], parallelism: int) -> str:
    """Build keys `k0000000..` (`n` of them, one update each) with a continuous job in
    `work` (subfolders `input`, `markers`), stop it with a savepoint; returns its path."""
    from pyflink.common import Types

    (work / "input" / "keys.csv").write_text(
        "".join(f"k{i:07d}\n" for i in range(n))
        + "".join(f"{END_PREFIX}{i:02d}\n" for i in range(64)))
    env = make_environment(parallelism, CHECKPOINT_MS, extra=extra)
    discard(keyed_process(kind, key_stream(env, work / "input", True),
                          KeyedCounter(str(work / "markers")), Types.STRING(),
                          "bench-state", options))
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
    return str(client.stop_with_savepoint(False, (work / "savepoints").as_uri()).result())


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
    namespace = f"{NAMESPACE_PREFIX[0]}_rec_{n}"
    options = ndb_options(mysql_url, namespace)
    if kind.startswith("ndb"):
        drop_namespace(mysql_url, namespace)
    extra = flink_extra(kind, work / "checkpoints")
    out: dict[str, Any] = {}
    restore_extra = dict(extra)
    if n > 0:
        started = time.monotonic()
        savepoint = build_savepoint(kind, work, n, extra, options, parallelism)
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
#: Protocol-level runs: (store, write.async).
PAUSE_VARIANTS = (("ndb-sqlite", True), ("ndb-sqlite", False), ("ndb-mariadb", True),
                  ("ndb-mariadb", False))
#: Key space of the checkpoint job (bench.functions.ModuloKey).
PAUSE_JOB_KEYS = 100_000
PAUSE_OPERATOR = "bench-cp"
#: Part 3's sweep on Flink (issue 7: the sync pause at 1k, 10k and 100k dirty entries, and
#: Flink RocksDB's sync duration on the same job): (dirty entries per subtask aimed at,
#: checkpoint interval ms, seconds measured). The job has `dirty x parallelism` keys and
#: updates them in turn, so a checkpoint finds every key of its subtask dirty once the
#: interval (plus the previous checkpoint's own duration) covers that many records; the
#: table reports the dirty entries pyflink-ndb logged.
PAUSE_SWEEP = ((1_000, 1_000, 25), (10_000, 3_000, 30), (100_000, 20_000, 65))
#: The backends of the sweep: RocksDB (incremental checkpoints) and pyflink-ndb on
#: MariaDB with the asynchronous flush, each as configured by default otherwise.
PAUSE_SWEEP_KINDS: tuple[tuple[str, bool | None], ...] = (("rocksdb", None),
                                                         ("ndb-mariadb", True))
#: Seconds at the start of a checkpoint job left out of its records/s (warm-up).
PAUSE_WARMUP_S = 3
_RETRY = re.compile(r"WARN .*pyflink_ndb/stores/retry\.py.* failed at ")
_DURABLE = re.compile(r"pyflink-ndb (\S+)/(\d+): checkpoint (\d+) durable: (\d+) entries, "
                      r"(\d+) rows, (\d+) bytes in (\d+) ms \(synchronous phase ([\d.]+) ms\)")


def run_label(kind: str, write_async: bool | None) -> str:
    if write_async is None:
        return LABELS[kind] + (" (incremental)" if kind == "rocksdb" else "")
    return f"{LABELS[kind]}, write.async={'true' if write_async else 'false'}"


def run_key(kind: str, write_async: bool | None) -> str:
    return kind if write_async is None else f"{kind}/{'async' if write_async else 'sync'}"


def pause_protocol(kind: str, write_async: bool, n: int, rounds: int, mysql_url: str
                   ) -> dict[str, Any]:
    """`rounds` checkpoints of `n` dirty ValueState entries on one LocalSubtask (no Flink):
    each round updates every entry, then times `backend.snapshot(epoch)` (the
    synchronous pause), snapshot → `wait_durable` (end to end), and the completion
    (`notify_checkpoint_complete` until the writer marked it, moved the readers and
    collected the garbage: the previous round's versions of every entry)."""
    from pyflink.common import Types
    from pyflink.datastream.state import ValueStateDescriptor

    from pyflink_ndb.stores.factory import open_store
    from pyflink_ndb.testing import LocalSubtask

    namespace = f"{NAMESPACE_PREFIX[0]}_cpp_{'a' if write_async else 's'}_{n}"
    url = store_url(kind, mysql_url, namespace)
    drop_namespace(url, namespace)
    local = str(WORK / "local")
    options = NdbStateOptions(url=url, namespace=namespace, local_dir=local,
                              write_async=write_async)
    store = open_store(options)
    sub = LocalSubtask(store, options, local_dir=local)
    pauses, durable, completion, dirty = [], [], [], []
    try:
        state = sub.context.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
        for epoch in range(1, rounds + 1):
            for i in range(n):
                sub.key(f"k{i:07d}")
                state.update((epoch, i, "x" * 100))
            dirty.append(sub.backend.table.dirty_count)
            started = time.perf_counter()
            sub.snapshot(epoch, durable=False)
            pauses.append(time.perf_counter() - started)
            sub.wait_durable(epoch)
            durable.append(time.perf_counter() - started)
            started = time.perf_counter()
            sub.complete(epoch)  # and wait: mark completed, move readers, collect garbage
            completion.append(time.perf_counter() - started)
    finally:
        sub.close()
        store.close()
    return {"pauses_s": pauses, "durable_s": durable, "complete_s": completion,
            "dirty": dirty, "median_s": statistics.median(pauses),
            "durable_median_s": statistics.median(durable),
            "complete_median_s": statistics.median(completion)}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rest_get(port: int, path: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return json.load(response)


def checkpoint_stats(port: int, job_id: str) -> dict[str, Any]:
    """Flink's checkpoint statistics of the running job (REST): counts, and per completed
    checkpoint its trigger time, end-to-end duration, state size and, per subtask of the
    vertex that holds the keyed process, sync / async / end-to-end durations, the
    barrier's start delay and the alignment (ms)."""
    job = rest_get(port, f"/jobs/{job_id}")
    vertex = next(v for v in job["vertices"] if "KEYED PROCESS" in v["name"].upper())
    overview = rest_get(port, f"/jobs/{job_id}/checkpoints")
    checkpoints, unfinished = [], []
    for h in sorted(overview["history"], key=lambda h: h["id"]):
        if h["status"] != "COMPLETED":
            unfinished.append({"id": h["id"], "status": h["status"],
                               "trigger_ms": h["trigger_timestamp"]})
            continue
        checkpoints.append(completed_checkpoint(port, job_id, vertex["id"], h))
    return {"vertex": vertex["name"], "counts": overview["counts"],
            "checkpoints": checkpoints, "unfinished": unfinished}


def completed_checkpoint(port: int, job_id: str, vertex_id: str,
                         history: Mapping[str, Any]) -> dict[str, Any]:
    """One completed checkpoint of :func:`checkpoint_stats` (`history`: its entry of the
    REST overview), with the per-subtask durations of the vertex `vertex_id`."""
    detail = rest_get(port, f"/jobs/{job_id}/checkpoints/details/{history['id']}/subtasks/"
                            f"{vertex_id}")
    return {"id": history["id"], "trigger_ms": history["trigger_timestamp"],
            "end_to_end_ms": history["end_to_end_duration"],
            "state_size": history["state_size"],
            "checkpointed_size": history["checkpointed_size"],
            "subtasks": [{"index": s["index"], "sync_ms": s["checkpoint"]["sync"],
                          "async_ms": s["checkpoint"]["async"],
                          "end_to_end_ms": s["end_to_end_duration"],
                          "start_delay_ms": s.get("start_delay"),
                          "alignment_ms": (s.get("alignment") or {}).get("duration"),
                          "state_size": s["state_size"]}
                         for s in detail["subtasks"] if "checkpoint" in s]}


class CheckpointPoller:
    """Flink's checkpoint statistics of a bounded job, gathered while it runs (a local
    job's REST endpoint goes away with its MiniCluster): each :meth:`poll` reads the
    overview and the details of the checkpoints completed since the previous one. The
    checkpoints completed after the last poll (at most a second's) are not counted."""

    def __init__(self, port: int, job_id: str) -> None:
        self.port = port
        self.job_id = job_id
        self.vertex_id: str | None = None
        self.completed: dict[int, dict[str, Any]] = {}
        self.counts: dict[str, int] = {}

    def poll(self) -> None:
        """Read what is new; a REST error (not up yet, the job just ended) reads nothing."""
        try:
            if self.vertex_id is None:
                job = rest_get(self.port, f"/jobs/{self.job_id}")
                self.vertex_id = next(v["id"] for v in job["vertices"]
                                      if "KEYED PROCESS" in v["name"].upper())
            overview = rest_get(self.port, f"/jobs/{self.job_id}/checkpoints")
            self.counts = dict(overview["counts"])
            for h in overview["history"]:
                if h["status"] == "COMPLETED" and h["id"] not in self.completed:
                    self.completed[h["id"]] = completed_checkpoint(
                        self.port, self.job_id, self.vertex_id, h)
        except (OSError, ValueError, KeyError, StopIteration):
            return

    def summary(self) -> dict[str, Any]:
        """Checkpoints completed and failed; medians of the end-to-end durations and of
        the keyed vertex's per-subtask sync and async durations (ms); None without any."""
        done = list(self.completed.values())
        return {"checkpoints": len(done), "failed_checkpoints": self.counts.get("failed", 0),
                "e2e_median_ms": None, "sync_median_ms": None, "sync_max_ms": None,
                "async_median_ms": None, **checkpoint_durations(done)}


def checkpoint_durations(checkpoints: list[dict[str, Any]]) -> dict[str, float]:
    """Medians (and maxima) of completed checkpoints' durations, ms: end to end, and the
    keyed vertex's per-subtask sync and async phases; empty without any checkpoint."""
    syncs = [s["sync_ms"] for c in checkpoints for s in c["subtasks"]]
    if not syncs:
        return {}
    ends = [c["end_to_end_ms"] for c in checkpoints]
    return {"sync_median_ms": statistics.median(syncs), "sync_max_ms": max(syncs),
            "async_median_ms": statistics.median(
                s["async_ms"] for c in checkpoints for s in c["subtasks"]),
            "e2e_median_ms": statistics.median(ends), "e2e_max_ms": max(ends)}


def durable_lines(since: float, until: float) -> list[dict[str, Any]]:
    """pyflink-ndb's `checkpoint N durable` log lines of the checkpoint job (per subtask:
    entries written, write time, its own measure of the synchronous phase), and its
    retried database transactions (`{"t", "retry"}`)."""
    out = []
    for t, line in flink_log_events(since):
        if t > until:
            break
        if _RETRY.search(line):
            out.append({"t": t, "retry": line.partition("[] - ")[2][:200]})
            continue
        m = _DURABLE.search(line)
        if m and m.group(1) == PAUSE_OPERATOR:
            out.append({"t": t, "subtask": int(m.group(2)), "checkpoint": int(m.group(3)),
                        "entries": int(m.group(4)), "rows": int(m.group(5)),
                        "bytes": int(m.group(6)), "write_ms": int(m.group(7)),
                        "sync_ms": float(m.group(8))})
    return out


def start_sequence_job(env: Any, kind: str, key_selector: Any, function: Any, operator: str,
                       options: Mapping[str, str], job_name: str, rates: Path,
                       parallelism: int, what: str) -> tuple[Any, str, float, float]:
    """Submit a job of the bench's rate jobs: an endless sequence source keyed by
    `key_selector` (LONG keys) into `function` on backend `kind`, its output discarded;
    returns once every subtask wrote its first per-second rate file into `rates`.

    :returns: (the JobClient, the job id, time submitted, time every subtask had records).
    """
    from pyflink.common import Types, WatermarkStrategy
    from pyflink.datastream.connectors.number_seq import NumberSequenceSource

    source = env.from_source(NumberSequenceSource(0, 2 ** 62), WatermarkStrategy
                             .no_watermarks(), "sequence").uid("sequence")
    keyed = source.key_by(key_selector, key_type=Types.LONG())
    discard(keyed_process(kind, keyed, function, Types.LONG(), operator, options))
    submitted = time.time()
    client = env.execute_async(job_name)
    job_id = str(client.get_job_id())
    wait_until(lambda: len(list(rates.glob("rate-*"))) >= parallelism, 180,
               f"every subtask of the {what} to process records")
    return client, job_id, submitted, time.time()


#: Where the background writer's work runs (bench variants), and the options of each:
#: its own thread; `write.render-process` (the child renders); `write.process` (the child
#: renders and writes).
WRITER_MODES: dict[str, dict[str, str]] = {
    "thread": {"state.backend.ndb.write.render-process": "false",
               "state.backend.ndb.write.process": "false"},
    "render-process": {"state.backend.ndb.write.render-process": "true",
                       "state.backend.ndb.write.process": "false"},
    "process": {"state.backend.ndb.write.render-process": "false",
                "state.backend.ndb.write.process": "true"},
}
_WRITER_KEYS = {"thread": "", "render-process": "/render", "process": "/process"}
_WRITER_LABELS = {"thread": "background thread (`write.process: false`)",
                  "render-process": "write.render-process",
                  "process": "write.process (the default with 2 CPUs or more)"}
#: The writer of the sweep's pyflink-ndb runs: what `write.process: auto` picks on 2 CPUs.
SWEEP_WRITER = "process"


def variant_suffix(kind: str, write_async: bool | None, or_terms: int | None,
                   writer: str = "thread", cpu_pin: bool = False) -> tuple[str, str]:
    """(key suffix, label suffix) of a checkpoint-job variant; `writer` a key of
    :data:`WRITER_MODES`, named in the label where it applies (MariaDB with
    `write.async`); `cpu_pin`: the TaskManager's Python threads on one CPU."""
    key = (f"/or{or_terms}" if or_terms else "") + _WRITER_KEYS[writer]
    label = f", {or_terms} OR-terms (experiment)" if or_terms else ""
    if kind == "ndb-mariadb" and write_async:
        label += f", {_WRITER_LABELS[writer]}"
    if cpu_pin:
        key += "/pin"
        label += ", Python threads on one CPU"
    return key, label


def pause_job(kind: str, write_async: bool | None, duration_s: float, mysql_url: str,
              parallelism: int, or_terms: int | None = None,
              writer: str = "thread", cpu_pin: bool = False, keys: int = PAUSE_JOB_KEYS,
              interval_ms: int = CHECKPOINT_MS) -> dict[str, Any]:
    """A job that updates a ValueState counter of keys `i % keys` (default 100,000) of a
    sequence source as fast as it can, for `duration_s` after its first record, with
    checkpoints every `interval_ms` (default 1,000); then Flink's checkpoint statistics
    over REST, and the job is cancelled. `or_terms`: the experiment of
    :class:`bench.functions.RateCounter`; `writer`: where pyflink-ndb's writer works (a
    key of :data:`WRITER_MODES`); `cpu_pin`: the TaskManager's Python threads on one CPU
    (pyflink-ndb: `python.cpu-pin: auto`; Flink's backends: the same module called by the
    job's function). The interpreter stays pinned for the later jobs of the same JVM: run
    pinned variants last."""

    from bench.functions import ModuloKey, RateCounter

    key_suffix, label_suffix = variant_suffix(kind, write_async, or_terms, writer, cpu_pin)
    if keys != PAUSE_JOB_KEYS:
        key_suffix += f"/k{keys}"
    tag = (run_key(kind, write_async) + key_suffix).replace("/", "-")
    work = WORK / "checkpoint-job" / tag
    shutil.rmtree(work, ignore_errors=True)
    rates = work / "rates"
    rates.mkdir(parents=True)
    # Namespaces have at most 40 characters: the backend's name shortened, and a hash of
    # the tag where that is not enough.
    namespace = (f"{NAMESPACE_PREFIX[0]}_cpj_"
                 f"{tag.replace('ndb-mariadb', 'mdb').replace('ndb-sqlite', 'sqlite')}"
                 .replace("-", "_"))
    if len(namespace) > 40:
        namespace = namespace[:31] + "_" + hashlib.sha1(tag.encode()).hexdigest()[:8]
    url = store_url(kind, mysql_url, namespace)
    options = ndb_options(url, namespace)
    if write_async is not None:
        options["state.backend.ndb.write.async"] = "true" if write_async else "false"
        options.update(WRITER_MODES[writer])
        if cpu_pin:
            options["state.backend.ndb.python.cpu-pin"] = "auto"
        drop_namespace(url, namespace)
    extra = flink_extra(kind, work / "checkpoints")
    if kind == "rocksdb":  # RocksDB's best case here: only new SST files per checkpoint
        extra["state.backend.incremental"] = "true"
    port = free_port()
    extra.update({"rest.port": str(port), "rest.bind-port": str(port),
                  "web.checkpoints.history": "1000"})
    env = make_environment(parallelism, interval_ms, extra=extra)
    client, job_id, submitted, first = start_sequence_job(
        env, kind, ModuloKey(keys),
        RateCounter(str(rates), or_terms, cpu_pin and write_async is None),
        PAUSE_OPERATOR, options, f"bench-checkpoint-{tag}", rates, parallelism,
        "checkpoint job")
    time.sleep(duration_s)
    try:
        stats = checkpoint_stats(port, job_id)
    finally:
        until = time.time()
        try:
            client.cancel().result()
        except Exception as err:  # it failed or ended already
            log(f"  cancel: {str(err).splitlines()[0][:160]}")
    per_second: dict[int, int] = {}
    for path in rates.glob("rate-*"):
        for line in path.read_text().split("\n"):
            if line:
                second, count = line.split()
                per_second[int(second)] = per_second.get(int(second), 0) + int(count)
    start = min(per_second)
    # Whole seconds from the first record to the end of the measurement only.
    timeline = [[s - start, per_second.get(s, 0)]
                for s in range(start, int(until)) if s + 1 <= until]
    steady = [c for s, c in timeline if s >= PAUSE_WARMUP_S]
    stats["checkpoints"] = [c for c in stats["checkpoints"] if c["trigger_ms"] / 1000 >= start]
    out: dict[str, Any] = {
        "label": run_label(kind, write_async) + label_suffix,
        "keys": keys, "interval_ms": interval_ms, "duration_s": until - first,
        "start_s": start, "submit_to_first_s": first - submitted, "per_second": timeline,
        "records_per_s": statistics.mean(steady) if steady else None,
        "min_second": min(steady) if steady else None,
        "max_second": max(steady) if steady else None, **stats}
    out.update(checkpoint_durations(stats["checkpoints"]))
    if write_async is not None:
        events = [d for d in durable_lines(submitted, until) if d["t"] >= start]
        out["retries"] = [d for d in events if "retry" in d]
        lines = out["durable"] = [d for d in events if "retry" not in d]
        if lines and not write_async:
            # Inline, the line is logged inside snapshot(), before its own synchronous
            # phase is measured: it shows the previous checkpoint's.
            out.update(dirty_median=statistics.median(d["entries"] for d in lines),
                       dirty_max=max(d["entries"] for d in lines),
                       write_median_ms=statistics.median(d["write_ms"] for d in lines))
        elif lines:
            out.update(
                dirty_median=statistics.median(d["entries"] for d in lines),
                dirty_max=max(d["entries"] for d in lines),
                py_sync_median_ms=statistics.median(d["sync_ms"] for d in lines),
                py_sync_max_ms=max(d["sync_ms"] for d in lines),
                write_median_ms=statistics.median(d["write_ms"] for d in lines))
    return out


def bench_snapshot(sizes: list[int], rounds: int, mysql_url: str, parallelism: int,
                   duration_s: float,
                   job_kinds: list[tuple[str, bool | None, int | None, str, bool]],
                   warmup: bool,
                   sweep: tuple[tuple[int, int, float], ...] = PAUSE_SWEEP) -> dict:
    """Part 3: the checkpoint pause at the protocol level (LocalSubtask), on Flink by
    dirty entries per subtask (`sweep`, :data:`PAUSE_SWEEP`'s form), and on Flink for
    each of `job_kinds`."""
    out: dict[str, Any] = {"protocol": {}, "job": {}, "job_keys": PAUSE_JOB_KEYS,
                           "duration_s": duration_s, "sweep": {}}
    for kind, write_async in PAUSE_VARIANTS:
        for n in sizes:
            r = pause_protocol(kind, write_async, n, rounds, mysql_url)
            out["protocol"][f"{run_key(kind, write_async)}/{n}"] = r
            log(f"snapshot {run_label(kind, write_async)}, {n:,} dirty: sync pause median "
                f"{r['median_s'] * 1000:,.2f} ms, durable after "
                f"{r['durable_median_s'] * 1000:,.0f} ms, completion "
                f"{r['complete_median_s'] * 1000:,.0f} ms")
    if warmup:
        log("checkpoint job: an untimed warm-up run")
        pause_job("hashmap", None, 5, mysql_url, parallelism)
    for dirty, interval_ms, seconds in sweep:
        for sweep_kind, sweep_async in PAUSE_SWEEP_KINDS:
            keys = dirty * parallelism
            log(f"checkpoint sweep: {run_label(sweep_kind, sweep_async)}, {keys:,} keys, "
                f"checkpoints every {interval_ms / 1000:g} s, {seconds:.0f} s")
            # pyflink-ndb as configured by default on this machine (`write.process: auto`,
            # on with 2 CPUs or more): the child writes.
            r = pause_job(sweep_kind, sweep_async, seconds, mysql_url, parallelism, keys=keys,
                          interval_ms=interval_ms, writer=SWEEP_WRITER)
            out["sweep"][f"{run_key(sweep_kind, sweep_async)}/{dirty}"] = r
            log(f"  {len(r['checkpoints'])} checkpoints, Flink sync median "
                f"{r.get('sync_median_ms', float('nan')):.0f} ms"
                + (f"; dirty per subtask median {r['dirty_median']:,.0f}, freeze median "
                   f"{r['py_sync_median_ms']:.2f} ms" if "py_sync_median_ms" in r else ""))
    for kind, write_async, or_terms, writer, cpu_pin in job_kinds:
        key_suffix, label_suffix = variant_suffix(kind, write_async, or_terms, writer, cpu_pin)
        log(f"checkpoint job: {run_label(kind, write_async)}{label_suffix}, "
            f"{duration_s:.0f} s")
        r = pause_job(kind, write_async, duration_s, mysql_url, parallelism, or_terms,
                      writer, cpu_pin)
        out["job"][run_key(kind, write_async) + key_suffix] = r
        log(f"  {r['records_per_s'] or 0:,.0f} records/s (seconds {r['min_second'] or 0:,}–"
            f"{r['max_second'] or 0:,}); {len(r['checkpoints'])} checkpoints, sync median "
            f"{r.get('sync_median_ms', float('nan')):.0f} ms max "
            f"{r.get('sync_max_ms', float('nan')):.0f} ms, end to end median "
            f"{r.get('e2e_median_ms', float('nan')):.0f} ms"
            + (f"; dirty per subtask and checkpoint median {r['dirty_median']:,.0f}"
               if "dirty_median" in r else ""))
    return out


# -- 4. SQL reads -------------------------------------------------------------------------
def bench_sql_reads(mysql_url: str, reads: int, view_reads: int) -> dict:
    """Point reads of the committed state of the MariaDB throughput run (uniform keys): by
    primary key with the committed checkpoint's version ranges, and through
    `committed_sql()` filtered by kjson."""
    from pyflink_ndb.stores.base import visible
    from pyflink_ndb.stores.mysql import MysqlStateStore

    namespace = f"{NAMESPACE_PREFIX[0]}_tp_uniform"
    store = MysqlStateStore(mysql_url, namespace)
    store.open(create=False)
    conn = mysql_connection(mysql_url)
    out: dict[str, Any] = {}
    try:
        committed = store.read_operator(OPERATOR_UID)
        assert committed is not None and committed.committed is not None
        segments = store.committed_segments(committed.committed)
        keys = [(r["key_group"], r["state_id"], r["ukey"], r["kjson"])
                for r in store.iter_committed(OPERATOR_UID)]
        out["table_rows"] = store.count_rows()
        out["keys"] = len(keys)
        view_text, view_params = store.committed_sql(OPERATOR_UID)
        view_sql = store._sql(f"SELECT q.vjson FROM ({view_text}) q WHERE q.kjson = ?")

        def pk(key: tuple[Any, ...]) -> tuple[str, list[Any]]:
            ranges = next(r for a, b, r, _ in segments if a <= key[0] <= b)
            where, params = visible("version", ranges)
            return (store._sql(f"SELECT vjson FROM {namespace}_state WHERE key_group = ? AND "
                               f"state_id = ? AND ukey = ? AND chunk = 0 AND {where} "
                               "ORDER BY version DESC LIMIT 1"),
                    [key[0], key[1], key[2], *params])

        rng = np.random.default_rng(SEED)
        with conn.cursor() as cur:
            for label, count, make in (
                    ("pk", reads, pk),
                    ("view", view_reads, lambda k: (view_sql, [*view_params, k[3]]))):
                picks = rng.integers(0, len(keys), size=count)
                prepared = [make(keys[i]) for i in picks]
                latencies = []
                found = 0
                started = time.perf_counter()
                for sql, params in prepared:
                    t = time.perf_counter()
                    cur.execute(sql, params)
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
        store.close()
    return out


# -- 5. restore time versus state-table rows ----------------------------------------------
#: Keys (one ValueState entry each) of the job whose savepoint the restore-rows part uses.
RESTORE_ROWS_KEYS = 2_000
RESTORE_ROWS_PROBES = 200
STATE_UID = "bench-state"
STATE_NAME = "counter"  # the ValueState of bench.functions.KeyedCounter
#: Rows of the abandoned epoch carry epoch `savepoint epoch + ABANDONED_AHEAD`: versions a
#: run wrote after the savepoint and that a restore of the savepoint rolls back.
ABANDONED_AHEAD = 5
#: Value of the abandoned versions of the job's own keys: seen by mistake, the restored
#: counters would continue from it.
ABANDONED_COUNT = 1_000_000
INSERT_BATCH_ROWS = 1_000
_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_TASK_SWITCH = re.compile(r"\.taskmanager\.Task .* - NDB KEYED PROCESS[^(]* \((\d+)/\d+\)#\d+ "
                          r".*switched from (\w+) to (\w+)\.")
_CLAIMED = re.compile(r"pyflink-ndb (\S+)/(\d+) \(attempt \d+\) claimed key groups (\d+)-(\d+) "
                      r"as branch (\d+) \((\w+)\)")
_TRIGGERED = re.compile(r"Triggering checkpoint \d+")
_COMPLETED = re.compile(r"Completed checkpoint \d+ for job")
_RECEIVED = re.compile(r"Received JobGraph submission")


def flink_log_events(since: float) -> list[tuple[float, str]]:
    """(time, line) of this process's Flink log (FLINK_LOG_DIR, see `main`) from `since`
    (time.time(); the log's clock is the same machine's local time)."""
    out = []
    for path in Path(os.environ["FLINK_LOG_DIR"]).glob("flink-*.log"):
        with path.open(errors="replace") as f:
            for line in f:
                m = _LOG_LINE.match(line)
                if not m:
                    continue
                t = time.mktime(time.strptime(m.group(1)[:19], "%Y-%m-%d %H:%M:%S")) \
                    + int(m.group(1)[20:]) / 1000
                if t >= since - 0.002:  # the log has ms resolution
                    out.append((t, line.rstrip("\n")))
    return sorted(out)


def restore_timeline(submitted: float, until: float) -> dict[str, Any]:
    """Seconds after submit at which the log shows the job graph received by the
    dispatcher, and per keyed subtask INITIALIZING (deployed, restoring), pyflink-ndb's
    "claimed key groups" (its restore done) and RUNNING; the latest subtask of each; and
    how many checkpoints were triggered and completed before `until`."""
    subtasks: dict[int, dict[str, float]] = {}
    triggered = completed = 0
    received = None
    for t, line in flink_log_events(submitted):
        if t > until:
            break
        if received is None and _RECEIVED.search(line):
            received = t - submitted
        elif (m := _TASK_SWITCH.search(line)) and m.group(3) in ("INITIALIZING", "RUNNING"):
            subtasks.setdefault(int(m.group(1)) - 1, {}).setdefault(
                m.group(3).lower() + "_s", t - submitted)
        elif (m := _CLAIMED.search(line)) and m.group(1) == STATE_UID:
            subtasks.setdefault(int(m.group(2)), {}).setdefault("claimed_s", t - submitted)
        elif _TRIGGERED.search(line):
            triggered += 1
        elif _COMPLETED.search(line):
            completed += 1
    latest = {phase: max(s[phase] for s in subtasks.values())
              for phase in ("initializing_s", "claimed_s", "running_s")
              if subtasks and all(phase in s for s in subtasks.values())}
    if received is not None:
        latest["job_received_s"] = received
    return {"subtasks": {str(k): v for k, v in sorted(subtasks.items())}, "latest": latest,
            "checkpoints_triggered": triggered, "checkpoints_completed": completed}


def savepoint_layout(conn: Any, namespace: str) -> dict[str, Any]:
    """State id of the job's ValueState and the savepoint's tokens (branch, epoch, key
    groups) from `<ns>_catalog`, `<ns>_snapshots` and `<ns>_operators`."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT state_id FROM {namespace}_catalog WHERE operator = %s AND "
                    "state_name = %s", (STATE_UID, STATE_NAME))
        (state_id,) = cur.fetchone()
        cur.execute(f"SELECT branch_id, epoch, kg_start, kg_end, status FROM "
                    f"{namespace}_snapshots WHERE operator = %s AND kind = 'savepoint' "
                    "ORDER BY kg_start", (STATE_UID,))
        tokens = [{"branch": int(b), "epoch": int(e), "kg_start": int(a), "kg_end": int(z),
                   "status": s} for b, e, a, z, s in cur.fetchall()]
        cur.execute(f"SELECT owners FROM {namespace}_operators WHERE operator = %s",
                    (STATE_UID,))
        owners = json.loads(cur.fetchone()[0])
    covered = sorted(g for t in tokens for g in range(t["kg_start"], t["kg_end"] + 1))
    if not tokens or covered != list(range(covered[-1] + 1)) or \
            {t["branch"] for t in tokens} != {int(o[2]) for o in owners}:
        raise click.ClickException(f"unexpected savepoint layout in {namespace}: tokens "
                                   f"{tokens}, owners {owners}")
    return {"state_id": int(state_id), "tokens": tokens, "max_key_group": covered[-1]}


def _abandoned_version(token: Mapping[str, int]) -> int:
    return version_of(token["branch"], token["epoch"] + ABANDONED_AHEAD)


def state_census(conn: Any, namespace: str, layout: Mapping[str, Any]) -> dict[str, int]:
    """Rows of the state table: all; those the savepoint sees (count and a checksum of
    key, version and value); those of the abandoned epoch; any other."""
    sid = layout["state_id"]
    out = {"total": 0, "savepoint": 0, "savepoint_checksum": 0, "abandoned": 0}
    with conn.cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM {namespace}_state")
        out["total"] = int(cur.fetchone()[0])
        for t in layout["tokens"]:
            lo, hi = version_of(t["branch"], 0), version_of(t["branch"], t["epoch"])
            cur.execute(f"SELECT COUNT(*), COALESCE(SUM(CRC32(CONCAT_WS(',', key_group, "
                        "HEX(ukey), version, chunk, tombstone, HEX(vbytes)))), 0) FROM "
                        f"{namespace}_state WHERE state_id = %s AND version BETWEEN %s AND %s "
                        "AND key_group BETWEEN %s AND %s",
                        (sid, lo, hi, t["kg_start"], t["kg_end"]))
            rows, checksum = cur.fetchone()
            out["savepoint"] += int(rows)
            out["savepoint_checksum"] += int(checksum)
            cur.execute(f"SELECT COUNT(*) FROM {namespace}_state WHERE state_id = %s AND "
                        "version = %s AND key_group BETWEEN %s AND %s",
                        (sid, _abandoned_version(t), t["kg_start"], t["kg_end"]))
            out["abandoned"] += int(cur.fetchone()[0])
    out["other"] = out["total"] - out["savepoint"] - out["abandoned"]
    return out


def fill_state_table(conn: Any, namespace: str, layout: Mapping[str, Any],
                     target_rows: int) -> dict[str, Any]:
    """Bulk-insert rows into `<ns>_state` until it holds `target_rows`: half of them rows of
    an abandoned epoch (`ABANDONED_AHEAD` epochs after the savepoint, on the savepoint's
    branches: a newer version of each of the job's keys, then of synthetic keys), the other
    half state that the savepoint sees (the job's keys, then synthetic keys at the
    savepoint's version). Synthetic keys `x0000000..` spread over all key groups; values
    are pickled small ints. Multi-row INSERTs of `INSERT_BATCH_ROWS` rows in primary-key
    order, each committed."""
    from pyflink_ndb.serialization.keys import encode_key, key_json
    from pyflink_ndb.serialization.values import encode_value, value_json

    sid = layout["state_id"]
    token_of = {g: t for t in layout["tokens"] for g in range(t["kg_start"], t["kg_end"] + 1)}
    groups = layout["max_key_group"] + 1
    with conn.cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM {namespace}_state")
        existing = int(cur.fetchone()[0])
        cur.execute(f"SELECT key_group, ukey FROM {namespace}_state WHERE state_id = %s AND "
                    "chunk = 0 AND tombstone = 0", (sid,))
        real = [(int(g), bytes(u)) for g, u in cur.fetchall()]
    abandoned = target_rows // 2
    visible_new = target_rows - abandoned - existing
    abandoned_new = abandoned - len(real)
    if visible_new < 0 or abandoned_new < 0:
        raise click.ClickException(f"{target_rows:,} rows is too small for the {existing:,} "
                                   f"rows of the job's savepoint in {namespace}")
    small = encode_value(1), value_json(1)
    shadow = encode_value((ABANDONED_COUNT, "abandoned"))
    shadow_json = value_json((ABANDONED_COUNT, "abandoned"))
    real_by_group: dict[int, list[bytes]] = {}
    for g, u in real:
        real_by_group.setdefault(g, []).append(u)

    def rows() -> Any:  # (key_group, state_id, ukey, version, vbytes, vjson, kjson), PK order
        for g in range(groups):
            t = token_of[g]
            sp, ab = version_of(t["branch"], t["epoch"]), _abandoned_version(t)
            part = [(u, ab, shadow, shadow_json) for u in real_by_group.get(g, ())]
            for i in range(g, max(visible_new, abandoned_new), groups):
                ukey = encode_key(f"x{i:07d}")
                if i < visible_new:
                    part.append((ukey, sp) + small)
                if i < abandoned_new:
                    part.append((ukey, ab) + small)
            part.sort(key=lambda r: (r[0], r[1]))
            for ukey, version, vbytes, vjson in part:
                yield g, sid, ukey, version, vbytes, vjson, key_json(ukey)

    cols = (f"INSERT INTO {namespace}_state (key_group, state_id, ukey, version, chunk, "
            "tombstone, chunks, expires_at_ms, fmt, vbytes, vjson, kjson) VALUES ")
    one = "(%s, %s, %s, %s, 0, 0, 1, NULL, 2, %s, %s, %s)"
    started = time.monotonic()
    inserted = 0
    batch: list[Any] = []
    with conn.cursor() as cur:
        def flush() -> None:
            cur.execute(cols + ", ".join([one] * (len(batch) // 7)), batch)
            batch.clear()
        for row in rows():
            batch.extend(row)
            inserted += 1
            if len(batch) == 7 * INSERT_BATCH_ROWS:
                flush()
        if batch:
            flush()
    elapsed = time.monotonic() - started
    return {"existing_rows": existing, "job_keys": len(real), "inserted_rows": inserted,
            "inserted_savepoint_rows": visible_new, "inserted_abandoned_rows": abandoned,
            "insert_s": elapsed, "insert_rows_per_s": inserted / elapsed if elapsed else 0.0}


def server_row_counters(conn: Any) -> dict[str, int]:
    """Server-wide handler counters (every client of the server adds to them; MariaDB 10.11
    has no Innodb_rows_*): `rows_read` sums the Handler_read_* (rows fetched by index or
    scan), `rows_deleted` is Handler_delete."""
    with conn.cursor() as cur:
        cur.execute("SHOW GLOBAL STATUS WHERE Variable_name LIKE 'Handler\\_read\\_%' OR "
                    "Variable_name IN ('Handler_delete', 'Handler_write', 'Handler_update')")
        status = {name.lower(): int(value) for name, value in cur.fetchall()}
    return {"rows_read": sum(v for k, v in status.items() if k.startswith("handler_read_")),
            "rows_deleted": status.get("handler_delete", 0),
            "rows_written": status.get("handler_write", 0),
            "rows_updated": status.get("handler_update", 0)}


def submit_restore(work: Path, savepoint: str, options: Mapping[str, str], parallelism: int,
                   tag: str, gate: Path | None) -> tuple[Any, float, Path]:
    """Submit the bounded probe job restoring `savepoint` (its subtasks wait at `gate`
    after their first record, see KeyedCounter); returns (client, submit time, its
    marker folder)."""
    from pyflink.common import Types

    markers = work / f"markers-{tag}"
    checkpoints = work / f"checkpoints-{tag}"
    shutil.rmtree(markers, ignore_errors=True)
    markers.mkdir(parents=True)
    extra = flink_extra("ndb-mariadb", checkpoints)
    extra.update({"execution.savepoint.path": savepoint,
                  "execution.savepoint.ignore-unclaimed-state": "true"})
    env = make_environment(parallelism, CHECKPOINT_MS, extra=extra)
    counter = KeyedCounter(str(markers), None if gate is None else str(gate))
    discard(keyed_process("ndb-mariadb", key_stream(env, work / "probe" / "probe.csv", False),
                          counter, Types.STRING(), STATE_UID, options))
    submitted = time.time()
    return env.execute_async(f"bench-restore-rows-{tag}"), submitted, markers


def first_markers(markers: Path) -> list[Path]:
    """The `first-<i>` files (not the `.tmp` files they are written through)."""
    return [p for p in markers.glob("first-*") if p.suffix != ".tmp"]


def wait_for_firsts(client: Any, markers: Path, parallelism: int) -> list[float]:
    def done() -> bool:
        if len(first_markers(markers)) >= parallelism:
            return True
        if client.get_job_status().result().is_globally_terminal_state():
            client.get_job_execution_result().result()  # raises the job's failure
            raise click.ClickException("the restoring job ended before its first records")
        return False
    wait_until(done, 300, "every subtask of the restoring job to process a record")
    return [float(p.read_text()) for p in first_markers(markers)]


def cancel_job(client: Any, gate: Path) -> None:
    """Cancel a job whose subtasks may wait at `gate`, then open the gate (once the job is
    cancelling no checkpoint can complete) and wait until the job ended (its per-job
    MiniCluster shuts down then)."""
    try:
        client.cancel().result()
    except Exception as err:  # it ended already (the MiniCluster is gone)
        log(f"  cancel: {str(err).splitlines()[0][:120]}")
    gate.touch()

    def ended() -> bool:
        try:
            return bool(client.get_job_status().result().is_globally_terminal_state())
        except Exception:  # Py4JJavaError: "MiniCluster is not yet running or has already
            return True    # been shut down"
    wait_until(ended, 120, "the restoring job to be cancelled")


def restore_round(work: Path, savepoint: str, options: Mapping[str, str], parallelism: int,
                  mysql_url: str, namespace: str, layout: Mapping[str, Any], tag: str
                  ) -> dict[str, Any]:
    """One timed restore: submit → every subtask's first record; then the counters and the
    rows as they are at that moment (the subtasks wait at a gate after their first record:
    no checkpoint can complete, no cleanup runs); cancel."""
    gate = work / f"gate-{tag}"
    gate.unlink(missing_ok=True)
    conn = mysql_connection(mysql_url)
    try:
        before = server_row_counters(conn)
        client, submitted, markers = submit_restore(work, savepoint, options, parallelism,
                                                    tag, gate)
        try:
            firsts = wait_for_firsts(client, markers, parallelism)
            seen = time.time()
            after = server_row_counters(conn)
            census = state_census(conn, namespace, layout)
        finally:
            cancel_job(client, gate)
    finally:
        conn.close()
    return {"first_record_s": max(firsts) - submitted,
            "server_rows": {k: after[k] - before[k] for k in before},
            "census": census, "timeline": restore_timeline(submitted, seen)}


def cleanup_run(work: Path, savepoint: str, options: Mapping[str, str], parallelism: int,
                mysql_url: str, namespace: str, layout: Mapping[str, Any]) -> dict[str, Any]:
    """Untimed: restore the savepoint once more with checkpoints every second and let the
    bounded job finish: its completed checkpoints run the background cleanup. Returns
    the rows left and whether each probed key continued from the savepoint's value."""
    from pyflink_ndb.serialization.keys import decode_key
    from pyflink_ndb.serialization.values import decode_value

    started = time.monotonic()
    client, submitted, _ = submit_restore(work, savepoint, options, parallelism, "cleanup",
                                          None)
    client.get_job_execution_result().result()
    out: dict[str, Any] = {"job_s": time.monotonic() - started}
    out["checkpoints_completed"] = restore_timeline(submitted, time.time())[
        "checkpoints_completed"]
    probes: dict[str, int] = {}
    for line in (work / "probe" / "probe.csv").read_text().split():
        probes[line] = probes.get(line, 0) + 1
    conn = mysql_connection(mysql_url)
    try:
        out["census"] = state_census(conn, namespace, layout)
        with conn.cursor() as cur:
            cur.execute(f"SELECT owners FROM {namespace}_operators WHERE operator = %s",
                        (STATE_UID,))
            branches = sorted({int(o[2]) for o in json.loads(cur.fetchone()[0])})
            written: dict[str, int] = {}
            for b in branches:
                cur.execute(f"SELECT ukey, vbytes FROM {namespace}_state WHERE state_id = %s "
                            "AND version BETWEEN %s AND %s AND tombstone = 0 AND chunk = 0 "
                            "ORDER BY version",
                            (layout["state_id"], version_of(b, 0), version_of(b, MAX_EPOCH)))
                for ukey, vbytes in cur.fetchall():
                    written[decode_key(bytes(ukey))] = decode_value(bytes(vbytes))[0]
    finally:
        conn.close()
    out["probe_keys"] = len(probes)
    out["probe_values_ok"] = written == {k: 1 + n for k, n in probes.items()}
    if not out["probe_values_ok"]:
        wrong = {k: v for k, v in written.items() if v != 1 + probes.get(k, -1)}
        out["probe_values_wrong"] = dict(list(wrong.items())[:10])
        out["probe_keys_written"] = len(written)
    return out


def bench_restore_rows(sizes: list[int], mysql_url: str, parallelism: int,
                       repeat: int) -> dict:
    """Submit → first record after restoring a savepoint of pyflink-ndb on MariaDB whose
    state table was filled to N rows (half of them an abandoned epoch that a format-1
    restore deleted before the first record), and what the restore deleted."""
    part_started = time.monotonic()
    out: dict[str, Any] = {"keys": RESTORE_ROWS_KEYS, "probes": RESTORE_ROWS_PROBES,
                           "abandoned_ahead": ABANDONED_AHEAD, "runs": {}}
    setups: dict[int, dict[str, Any]] = {}
    for n in sizes:
        namespace = f"{NAMESPACE_PREFIX[0]}_rr_{n}"
        work = WORK / "restore-rows" / str(n)
        shutil.rmtree(work, ignore_errors=True)
        for sub in ("input", "markers", "probe"):
            (work / sub).mkdir(parents=True)
        probe_keys = np.random.default_rng(SEED + n).integers(0, RESTORE_ROWS_KEYS,
                                                              size=RESTORE_ROWS_PROBES)
        (work / "probe" / "probe.csv").write_text("".join(f"k{k:07d}\n" for k in probe_keys))
        options = ndb_options(mysql_url, namespace)
        drop_namespace(mysql_url, namespace)
        log(f"restore-rows {n:,}: building a savepoint of {RESTORE_ROWS_KEYS:,} keys")
        started = time.monotonic()
        savepoint = build_savepoint("ndb-mariadb", work, RESTORE_ROWS_KEYS,
                                    flink_extra("ndb-mariadb", work / "checkpoints"),
                                    options, parallelism)
        build_s = time.monotonic() - started
        conn = mysql_connection(mysql_url)
        try:
            layout = savepoint_layout(conn, namespace)
            log(f"  savepoint {layout['tokens']}; inserting rows up to {n:,}")
            fill = fill_state_table(conn, namespace, layout, n)
            census = state_census(conn, namespace, layout)
        finally:
            conn.close()
        log(f"  {fill['inserted_rows']:,} rows in {fill['insert_s']:.1f} s "
            f"({fill['insert_rows_per_s']:,.0f} rows/s); table: {census}")
        if census["total"] != n or census["abandoned"] != n // 2 or census["other"]:
            raise click.ClickException(f"{namespace}_state holds {census} instead of {n:,} "
                                       f"rows, {n // 2:,} of them abandoned")
        setups[n] = {"work": work, "savepoint": savepoint, "options": options,
                     "namespace": namespace, "layout": layout, "census": census}
        out["runs"][str(n)] = {"build_s": build_s, **fill, "table": census,
                               "tokens": layout["tokens"], "rounds": []}
    smallest = sizes[0]
    log("restore-rows: an untimed warm-up restore")
    s = setups[smallest]
    restore_round(s["work"], s["savepoint"], s["options"], parallelism, mysql_url,
                  s["namespace"], s["layout"], "warmup")
    for rep in range(repeat):
        for n in (sizes if rep % 2 == 0 else sizes[::-1]):  # drift hits every size alike
            s = setups[n]
            log(f"restore-rows round {rep + 1}/{repeat}, {n:,} rows")
            run = restore_round(s["work"], s["savepoint"], s["options"], parallelism,
                                mysql_url, s["namespace"], s["layout"], f"{n}-r{rep}")
            c, c0 = run["census"], s["census"]
            # Rows of the table before the restore are savepoint or abandoned ones.
            run["deleted_before_first"] = (max(c0["savepoint"] - c["savepoint"], 0)
                                           + max(c0["abandoned"] - c["abandoned"], 0))
            run["written_before_first"] = c["other"] - c0["other"]
            run["abandoned_kept"] = c["abandoned"] == c0["abandoned"]
            run["savepoint_unchanged"] = (c["savepoint"], c["savepoint_checksum"]) == (
                c0["savepoint"], c0["savepoint_checksum"])
            log(f"  first record {run['first_record_s']:.2f} s after submit (claimed at "
                f"{run['timeline']['latest'].get('claimed_s', float('nan')):.2f} s); "
                f"abandoned rows {c['abandoned']:,} of {c0['abandoned']:,}, savepoint rows "
                f"{'unchanged' if run['savepoint_unchanged'] else 'CHANGED'}, "
                f"rows read server-wide {run['server_rows']['rows_read']:,}")
            out["runs"][str(n)]["rounds"].append(run)
    for n in sizes:
        s, r = setups[n], out["runs"][str(n)]
        log(f"restore-rows {n:,}: a restore that runs to completion (background cleanup)")
        r["cleanup"] = cleanup_run(s["work"], s["savepoint"], s["options"], parallelism,
                                   mysql_url, s["namespace"], s["layout"])
        log(f"  abandoned rows left {r['cleanup']['census']['abandoned']:,} after "
            f"{r['cleanup']['job_s']:.1f} s and {r['cleanup']['checkpoints_completed']} "
            "completed checkpoint(s); probed counters continue from the savepoint: "
            f"{r['cleanup']['probe_values_ok']}")
        rounds = r["rounds"]
        r["first_record_s"] = statistics.median(x["first_record_s"] for x in rounds)
        r["all"] = [x["first_record_s"] for x in rounds]
        claimed = [x["timeline"]["latest"]["claimed_s"] for x in rounds
                   if "claimed_s" in x["timeline"]["latest"]]
        r["claimed_s"] = statistics.median(claimed) if claimed else None
        received = [x["timeline"]["latest"]["job_received_s"] for x in rounds
                    if "job_received_s" in x["timeline"]["latest"]]
        r["received_s"] = statistics.median(received) if received else None
        # The part on the cluster (deploy, restore, first record), without the client's
        # job graph and the MiniCluster start-up that come before it.
        in_cluster = [x["first_record_s"] - x["timeline"]["latest"]["job_received_s"]
                      for x in rounds if "job_received_s" in x["timeline"]["latest"]]
        r["in_cluster_s"] = statistics.median(in_cluster) if in_cluster else None
        r["deleted_before_first"] = max(x["deleted_before_first"] for x in rounds)
        r["abandoned_after_first"] = min(x["census"]["abandoned"] for x in rounds)
        r["savepoint_unchanged"] = all(x["savepoint_unchanged"] for x in rounds)
        # Each round's server-wide count bounds the same restore path: the least is the
        # tightest bound (the other rounds saw more of the other clients).
        r["server_rows_read"] = min(x["server_rows"]["rows_read"] for x in rounds)
        r["server_rows_deleted"] = min(x["server_rows"]["rows_deleted"] for x in rounds)
        r["checkpoints_completed"] = max(x["timeline"]["checkpoints_completed"]
                                         for x in rounds)
    for n in sizes:
        r = out["runs"][str(n)]
        r["ratio_to_smallest"] = r["first_record_s"] / out["runs"][str(smallest)][
            "first_record_s"]
    out["elapsed_s"] = time.monotonic() - part_started
    return out


# -- report -------------------------------------------------------------------------------
def snapshot_markdown(snap: dict) -> list[str]:
    """Section 3: the protocol-level table, then the job-level table."""
    proto = snap["protocol"]
    sizes = sorted({int(k.rsplit("/", 1)[1]) for k in proto})
    variants = [(k, a) for k, a in PAUSE_VARIANTS
                if any(key.startswith(run_key(k, a) + "/") for key in proto)]
    lines = ["## 3. Checkpoint pause", "",
             "### Protocol level (`LocalSubtask`, no Flink)", "",
             "Sync pause: the time in `backend.snapshot(n)` (the task thread is blocked); "
             "durable: from the start of `snapshot(n)` until `wait_durable(n)` returns (the "
             "epoch's rows and snapshot row committed); completion: "
             "`notify_checkpoint_complete(n)` until the writer marked it, moved the readers "
             "and collected the garbage (from round 2 on: the previous version of every "
             "entry; a Flink task goes on meanwhile, but the writer writes the next "
             "checkpoint only after it; inline with `write.async: false`, on the task "
             "thread). Median of the rounds, each of which re-dirties every entry (cache "
             "10,000 entries: the rest are in tier 2). Lower is better.", "",
             "| dirty entries | " + " | ".join(
                 f"{run_label(k, a)}: sync pause ms | durable ms | completion ms"
                 for k, a in variants) + " |",
             "|---:|" + "---:|---:|---:|" * len(variants)]
    for n in sizes:
        row = [f"{n:,}"]
        for k, a in variants:
            r = proto.get(f"{run_key(k, a)}/{n}")
            row += (["–", "–", "–"] if r is None else
                    [f"{r['median_s'] * 1000:,.2f}", f"{r['durable_median_s'] * 1000:,.0f}",
                     "–" if "complete_median_s" not in r
                     else f"{r['complete_median_s'] * 1000:,.0f}"])
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines += sweep_markdown(snap.get("sweep") or {})
    job = snap.get("job") or {}
    if job:
        lines += ["### Job level (Flink MiniCluster)", "",
                  f"A sequence source keyed by `i % {snap['job_keys']:,}`, a ValueState "
                  "counter per key updated for every record (bench.functions.RateCounter), "
                  f"about {snap['duration_s']:.0f} s per backend after the first record, "
                  f"checkpoints every {CHECKPOINT_MS} ms. Flink's figures from its REST API "
                  "(per subtask of the keyed vertex; end to end per checkpoint). records/s: "
                  f"mean of the whole seconds after the first {PAUSE_WARMUP_S} (higher is "
                  "better); worst second: the least records in one second (higher is "
                  "better); variation: stdev / mean of those seconds (lower is steadier); "
                  "write seconds: mean records of the seconds a background write covered "
                  "for at least half a second over the mean of the other seconds (1.00: no "
                  "dip while writing); writer busy: the share of those seconds in which "
                  "a subtask's background writer was writing an epoch (mean of the "
                  "subtasks); durations: lower is better. Dirty entries: per "
                  "subtask and checkpoint, from pyflink-ndb's `checkpoint N durable` log "
                  "lines.", "",
                  "| run | records/s | worst / best second | variation | write seconds "
                  "/ other seconds | writer busy | checkpoints | sync ms median "
                  "| sync ms max | async ms median | end-to-end ms median | end-to-end ms max "
                  "| dirty entries median (max) | background write ms median "
                  "| retried DB transactions |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in job.values():
            even = steadiness(r)
            f = functools.partial(_cell, r)
            dirty = _dirty_cell(r)
            lines.append(
                f"| {r['label']} | {f('records_per_s')} | {f('min_second')} / "
                f"{f('max_second')} | {_cell(even, 'cv', '{:.2f}')} | "
                f"{_cell(even, 'write_seconds_ratio', '{:.2f}')} | "
                f"{_cell(even, 'writer_busy', '{:.0%}')} | {len(r['checkpoints'])} of "
                f"{r['counts']['total']} ({r['counts']['failed']} failed) | "
                f"{f('sync_median_ms')} | {f('sync_max_ms')} | {f('async_median_ms')} | "
                f"{f('e2e_median_ms')} | {f('e2e_max_ms')} | {dirty} | {f('write_median_ms')} | "
                f"{len(r['retries']) if 'retries' in r else '–'} |")
        lines.append("")
    return lines


def _cell(run: Mapping[str, Any], name: str, fmt: str = "{:,.0f}") -> str:
    """A table cell of part 3: `run[name]` formatted, "–" when missing or None."""
    return "–" if run.get(name) is None else fmt.format(run[name])


def _dirty_cell(run: Mapping[str, Any]) -> str:
    """Part 3's dirty entries per subtask and checkpoint: "median (max)", or "–"."""
    return ("–" if "dirty_median" not in run
            else f"{run['dirty_median']:,.0f} ({run['dirty_max']:,})")


def sweep_markdown(sweep: Mapping[str, Any]) -> list[str]:
    """Section 3's sweep: Flink's sync duration of the keyed vertex per dirty-entry count
    (:data:`PAUSE_SWEEP`), RocksDB and pyflink-ndb on the same job."""
    if not sweep:
        return []
    lines = ["### Sync pause by dirty entries (Flink MiniCluster)", "",
             "The job of the next table with `dirty x parallelism` keys updated in turn and "
             "the checkpoint interval of each row, so that a checkpoint finds about that "
             "many entries of its subtask dirty (pyflink-ndb's count from its `checkpoint N "
             "durable` log lines). Flink's sync ms: the keyed vertex's synchronous phase "
             "per subtask from the REST API (for pyflink-ndb it includes taking the "
             "interpreter lock to call into Python); freeze ms: pyflink-ndb's own "
             "synchronous phase as it logs it. Lower is better.", "",
             "| dirty entries per subtask (aimed) | keys | interval s | backend | dirty "
             "entries median (max) | checkpoints | Flink sync ms median / max | freeze ms "
             "median / max | async ms median | end-to-end ms median | records/s |",
             "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key, r in sorted(sweep.items(), key=lambda kv: (int(kv[0].rsplit("/", 1)[1]),
                                                          kv[0])):
        f = functools.partial(_cell, r)
        lines.append(
            f"| {int(key.rsplit('/', 1)[1]):,} | {r['keys']:,} | {r['interval_ms'] / 1000:g} "
            f"| {r['label']} | {_dirty_cell(r)} | {len(r['checkpoints'])} | "
            f"{f('sync_median_ms')} / {f('sync_max_ms')} | {f('py_sync_median_ms', '{:.2f}')} / "
            f"{f('py_sync_max_ms', '{:.2f}')} | {f('async_median_ms')} | "
            f"{f('e2e_median_ms')} | {f('records_per_s')} |")
    return lines + [""]


def steadiness(run: Mapping[str, Any]) -> dict[str, float | None]:
    """How evenly a checkpoint job ran: the coefficient of variation of its whole seconds
    after the warm-up (stdev / mean), and, with pyflink-ndb's asynchronous flush, the mean
    records of the seconds that a background write of either subtask covered for at least
    half a second, over the mean of the other seconds (1.0: the writes cost the stream
    nothing visible; from the `checkpoint N durable` log lines: end time and write ms)."""
    steady = [(s, c) for s, c in run.get("per_second", []) if s >= PAUSE_WARMUP_S]
    if len(steady) < 2:
        return {"cv": None, "write_seconds_ratio": None}
    counts = [c for _, c in steady]
    mean = statistics.mean(counts)
    out: dict[str, float | None] = {
        "cv": statistics.pstdev(counts) / mean if mean else None, "write_seconds_ratio": None}
    durable = run.get("durable") or []
    if durable and "start_s" in run:
        busy: dict[int, float] = {}
        for d in durable:
            end = d["t"] - run["start_s"]
            begin = end - d["write_ms"] / 1000
            second = int(begin)
            while second < end:
                busy[second] = busy.get(second, 0.0) + max(
                    0.0, min(end, second + 1) - max(begin, second))
                second += 1
        writing = [c for s, c in steady if busy.get(s, 0.0) >= 0.5]
        idle = [c for s, c in steady if busy.get(s, 0.0) < 0.5]
        if writing and idle:
            out["write_seconds_ratio"] = statistics.mean(writing) / statistics.mean(idle)
        out["writer_busy"] = writer_busy_share(durable, run["start_s"],
                                               steady[0][0], steady[-1][0] + 1)
    return out


def writer_busy_share(durable: list[dict[str, Any]], start_s: float, begin_s: float,
                      end_s: float) -> float | None:
    """The share of the seconds `begin_s`..`end_s` (from the job's first record at
    `start_s`) in which a subtask's background writer was writing an epoch (from the
    `checkpoint N durable` lines: end time and write ms), averaged over the subtasks.
    Near 1.0 the writer never waits for a checkpoint, so writing an epoch's entries
    ahead of its checkpoint (issue 7's optional pre-flush) has no idle time to use.
    None without lines."""
    if not durable or end_s <= begin_s:
        return None
    busy: dict[int, float] = {}
    for d in durable:
        end = d["t"] - start_s
        begin = end - d["write_ms"] / 1000
        busy[d["subtask"]] = busy.get(d["subtask"], 0.0) + max(
            0.0, min(end, end_s) - max(begin, begin_s))
    return statistics.mean(busy.values()) / (end_s - begin_s)


def summary_markdown(meta: dict, results: dict) -> str:
    lines = [f"# pyflink-ndb benchmark ({'quick' if meta['quick'] else 'full'} run)", "",
             f"{meta['when']}, commit {meta['commit']}, {meta['cpus']} CPUs, "
             f"parallelism {meta['parallelism']}, checkpoints every {CHECKPOINT_MS} ms, "
             f"median of {meta.get('rounds', 1)} round(s) for throughput, recovery and "
             "restore-rows, "
             "pyflink-ndb cache 10,000 entries per subtask. One run on a noisy machine: "
             "read the ratios, not the absolute figures."
             + ("" if meta.get("cpu_latency_us") is None else
                f" The whole run held a CPU latency QoS request of {meta['cpu_latency_us']} µs "
                "(`--cpu-latency-us`, bench/cpu_latency.py): every backend's figures are "
                "those of a machine whose idle CPUs do not halt."), ""]
    from bench.targets import markdown as targets_markdown

    lines += targets_markdown(results)
    tp = results.get("throughput")
    if tp:
        from bench.profile import _mib

        lines += ["## 1. Throughput (flight-delays job, records/s from net runtime)", "",
                  f"Uniform: {tp['uniform_records']:,} flights, {tp['uniform_keys']:,} tail "
                  f"numbers. Zipf: the same flights re-keyed to {ZIPF_KEYS:,} keys (s={ZIPF_S}, "
                  f"{tp['zipf']['distinct_keys']:,} used, hottest key "
                  f"{tp['zipf']['top_key_share']:.1%} of records).", "",
                  "| backend | uniform rec/s | zipf rec/s | uniform / hashmap | "
                  "uniform / best RocksDB | zipf / hashmap | zipf / best RocksDB |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        runs = tp["runs"]
        best_rocksdb = {dist: max(runs[f"{k}/{dist}"]["records_per_s"]
                                  for k in ("rocksdb", "rocksdb-incremental")
                                  if f"{k}/{dist}" in runs)
                        for dist in ("uniform", "zipf")}
        for kind in BACKENDS:
            row = [LABELS[kind]]
            for dist in ("uniform", "zipf"):
                row.append(f"{runs[f'{kind}/{dist}']['records_per_s']:,.0f}")
            for dist in ("uniform", "zipf"):
                mine = runs[f"{kind}/{dist}"]["records_per_s"]
                row += [ratio(mine, runs[f"hashmap/{dist}"]["records_per_s"]),
                        ratio(mine, best_rocksdb[dist])]
            lines.append("| " + " | ".join(row) + " |")
        lines += ["", "Checkpoints and memory of the same runs (Flink's REST API, polled "
                  "every second while the job ran; per subtask of the keyed vertex; medians "
                  "over the rounds of each run's count and medians). Each backend and round "
                  "ran in a JVM of its own (the MiniCluster's JobManager and TaskManager, "
                  "and in thread mode the embedded CPython with pyflink-ndb's tiers): peak "
                  "RSS while the job ran (VmRSS sampled every 0.25 s) and the process's "
                  "VmHWM over its warm-up and both jobs:", "",
                  "| backend | keys | checkpoints | end-to-end ms | sync ms median / max | "
                  "async ms | JVM peak RSS MiB, this job / whole process |",
                  "|---|---|---:|---:|---:|---:|---:|"]

        def ms(value: float | None) -> str:
            return "–" if value is None else f"{value:,.0f}"

        for dist in ("uniform", "zipf"):
            for kind in BACKENDS:
                r = runs[f"{kind}/{dist}"]
                lines.append(f"| {LABELS[kind]} | {dist} | {ms(r.get('checkpoints'))} | "
                             f"{ms(r.get('e2e_median_ms'))} | {ms(r.get('sync_median_ms'))}"
                             f" / {ms(r.get('sync_max_ms'))} | "
                             f"{ms(r.get('async_median_ms'))} | "
                             f"{_mib(r.get('java_peak_kb'))} / {_mib(r.get('java_hwm_kb'))} |")
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
    if snap and "protocol" in snap:
        lines += snapshot_markdown(snap)
    sql = results.get("sql")
    if sql:
        lines += ["## 4. Committed-state SQL reads (MariaDB, separate connection)", "",
                  f"State of the uniform MariaDB run: {sql['keys']:,} keys, "
                  f"{sql['table_rows']:,} rows.", "",
                  "| query | reads | reads/s | p50 ms | p99 ms |", "|---|---:|---:|---:|---:|"]
        for label, text in (("pk", "PK: newest version in the committed checkpoint's ranges"),
                            ("view", "`committed_sql()` filtered by kjson")):
            q = sql[label]
            lines.append(f"| {text} | {q['reads']:,} | {q['reads_per_s']:,.0f} | "
                         f"{q['p50_ms']:.2f} | {q['p99_ms']:.2f} |")
        lines.append("")
    rr = results.get("restore_rows")
    if rr:
        sizes = sorted(int(n) for n in rr["runs"])
        lines += ["## 5. Restore time versus state-table rows (pyflink-ndb on MariaDB)", "",
                  f"A savepoint of {rr['keys']:,} keys (the recovery job, parallelism 2, "
                  "stop-with-savepoint), then `<ns>_state` bulk-filled to N rows: half "
                  "state the savepoint sees (its keys and synthetic keys over all key "
                  "groups), half rows of an abandoned epoch (savepoint epoch + "
                  f"{rr['abandoned_ahead']} on the savepoint's branches), which a format-1 "
                  "restore deleted before the first record. Timed: submit → every subtask "
                  "processed its first record (lower is better). The rows are counted at "
                  "that moment (each subtask waits after its first record until then, so "
                  "no checkpoint can complete), then the job is cancelled. Claimed: the "
                  "latest pyflink-ndb `claimed key groups` log line (its restore done); "
                  "job graph received: the dispatcher's log line (before it: building the "
                  "job graph in the client and starting the per-job MiniCluster, which no "
                  "state touches); received → first record: the part on the cluster "
                  "(deploy, restore, first record), median of the rounds. "
                  "Rows read: the server's Handler_read_* counters from submit to first "
                  "record, least of the rounds; every client of the server and the first "
                  "records' lazy reads count (an upper bound). Left later: abandoned "
                  "rows after one more restore run to its end (its completed checkpoints "
                  "run the background cleanup).", "",
                  f"| rows in state table | abandoned-epoch rows | submit → first record s "
                  f"| × {sizes[0]:,} | job graph received s | claimed s "
                  "| received → first record s "
                  "| rows deleted before first record "
                  "| abandoned rows after first record | savepoint rows unchanged "
                  "| rows read server-wide (upper bound) | checkpoints completed before count "
                  "| abandoned left later | bulk insert |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
        for n in sizes:
            r = rr["runs"][str(n)]
            claimed, received, in_cluster = (
                "–" if r.get(k) is None else f"{r[k]:.2f}"
                for k in ("claimed_s", "received_s", "in_cluster_s"))
            cleanup = r.get("cleanup", {}).get("census", {}).get("abandoned")
            later = "–" if cleanup is None else (
                f"{cleanup:,} ({r['table']['abandoned'] - cleanup:,} deleted in "
                f"{r['cleanup']['checkpoints_completed']} checkpoint(s))")
            lines.append(
                f"| {r['table']['total']:,} | {r['table']['abandoned']:,} | "
                f"{r['first_record_s']:.2f} | {r['ratio_to_smallest']:.2f}× | {received} | "
                f"{claimed} | {in_cluster} | "
                f"{r['deleted_before_first']:,} | {r['abandoned_after_first']:,} | "
                f"{'yes' if r['savepoint_unchanged'] else 'NO'} | "
                f"{r['server_rows_read']:,} | {r['checkpoints_completed']} | "
                f"{later} | "
                f"{r['inserted_rows']:,} rows in {r['insert_s']:.1f} s |")
        ok = {n: rr["runs"][str(n)].get("cleanup", {}).get("probe_values_ok") for n in sizes}
        lines += ["", "Rounds (s): " + "; ".join(
            f"{n:,}: " + ", ".join(f"{v:.2f}" for v in rr["runs"][str(n)]["all"])
            for n in sizes) + ". Probed counters continued from the savepoint's values "
            "(not the abandoned ones) in the full run: " + ", ".join(
            f"{n:,}: {'yes' if ok[n] else 'NO'}" for n in sizes)
            + f". Part took {rr.get('elapsed_s', 0) / 60:.1f} min.", ""]
    if results.get("reads"):
        from bench.reads import markdown as reads_markdown

        lines += reads_markdown(results["reads"])
    if results.get("profile"):
        from bench.profile import markdown as profile_markdown

        lines += profile_markdown(results["profile"])
    if results.get("recovery_rescale"):
        from bench.recovery import markdown as recovery_markdown

        lines += recovery_markdown(results["recovery_rescale"])
    if results.get("state_work"):
        from bench.statework import markdown as statework_markdown

        lines += statework_markdown(results["state_work"])
    if results.get("key_filter"):
        from bench.keyfilter import markdown as keyfilter_markdown

        lines += keyfilter_markdown(results["key_filter"])
    return "\n".join(lines)


def chart(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(13, 13.5))
    ax = axes[0][0]
    tp = results.get("throughput")
    if tp:
        width = 0.8 / len(BACKENDS)
        for i, kind in enumerate(BACKENDS):
            values = [tp["runs"][f"{kind}/{d}"]["records_per_s"] for d in ("uniform", "zipf")]
            bars = ax.bar(np.arange(2) + (i - (len(BACKENDS) - 1) / 2) * width, values, width,
                          label=LABELS[kind], color=COLORS[kind])
            ax.bar_label(bars, fmt="{:,.0f}", fontsize=7)
        ax.set_xticks(range(2), [f"uniform ({tp['uniform_keys']:,} keys)",
                                 f"Zipf s={ZIPF_S} ({ZIPF_KEYS:,} keys)"])
        ax.set_ylabel("records/s (net runtime)")
        ax.legend(fontsize=8)
    ax.set_title("1. Flight-delays job throughput (higher is better)")
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
    ax.set_title("2. Recovery time versus state size (lower is better)")
    snapshot_panel(results.get("snapshot"), axes[1][0])
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
    ax.set_title("4. Committed-state SQL reads on MariaDB (higher is better)")
    restore_rows_panels(results.get("restore_rows"), axes[2][0], axes[2][1])
    for ax in axes.flat:
        if not ax.has_data():  # a part left out with --only
            ax.text(0.5, 0.5, "not measured in this run (--only)", ha="center",
                    va="center", transform=ax.transAxes, color="grey")
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle("pyflink-ndb vs Flink state backends (one run, same machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


PAUSE_COLORS = {"rocksdb": COLORS["rocksdb"], "ndb-mariadb/async": COLORS["ndb-mariadb"],
                "ndb-mariadb/sync": "#8172b3", "ndb-sqlite/async": COLORS["ndb-sqlite"],
                "ndb-sqlite/sync": "#937860", "hashmap": COLORS["hashmap"],
                "ndb-mariadb/async/or100": "#da8bc3", "ndb-mariadb/async/render": "#55a868",
                "ndb-mariadb/async/process": "#c44e52"}


def snapshot_panel(snap: dict | None, ax: Any) -> None:
    """Panel 3 of bench.png: protocol-level sync pause and time to durable."""
    ax.set_title("3. Checkpoint pause versus dirty entries (no Flink; lower is better)")
    if not snap or "protocol" not in snap:
        return
    proto = snap["protocol"]
    for kind, write_async in PAUSE_VARIANTS:
        key = run_key(kind, write_async)
        ns = sorted(int(k.rsplit("/", 1)[1]) for k in proto if k.startswith(key + "/"))
        if not ns:
            continue
        color = PAUSE_COLORS[key]
        name = f"{LABELS[kind].removeprefix('pyflink-ndb ')} async={str(write_async).lower()}"
        sync = [proto[f"{key}/{n}"]["median_s"] * 1000 for n in ns]
        ax.plot(ns, sync, "o-", color=color,
                label=f"{name}: sync pause" + ("" if write_async else " (= durable)"))
        if write_async:
            dur = [proto[f"{key}/{n}"]["durable_median_s"] * 1000 for n in ns]
            ax.plot(ns, dur, "s:", color=color, alpha=0.7, label=f"{name}: until durable")
        if kind == "ndb-mariadb":
            for n, v in zip(ns, sync, strict=True):
                ax.annotate(f"{v:,.2f} ms" if v < 10 else f"{v:,.0f} ms", (n, v),
                            textcoords="offset points", fontsize=7, color=color,
                            xytext=(0, 7) if write_async else (-7, 7),
                            ha="center" if write_async else "right")
    values = [v for r in proto.values() for v in (r["median_s"], r["durable_median_s"])]
    ax.axhline(5, color="#999999", lw=0.8, ls="--")
    ax.text(0.01, 5, "target 5 ms", transform=ax.get_yaxis_transform(), fontsize=7,
            color="#777777", va="bottom")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.margins(x=0.2)
    ax.set_ylim(min(values) * 1000 / 3, max(values) * 1000 * 60)  # room for the legend
    ax.set_xlabel("dirty ValueState entries per checkpoint")
    ax.set_ylabel("ms (median; log scale)")
    ax.legend(fontsize=6.5, loc="upper left", ncol=2)


def pause_chart(snap: dict | None, path: Path) -> None:
    """checkpoint-pause.png: per job-level run its records per second with the
    checkpoints marked, and one panel of the sync duration per checkpoint."""
    if not snap or not snap.get("job"):
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = snap["job"]
    fig, axes = plt.subplots(len(runs) + 1, 1, figsize=(12, 2.6 * len(runs) + 3.6),
                             gridspec_kw={"height_ratios": [1] * len(runs) + [1.3]})
    top = max(c for r in runs.values() for _, c in r["per_second"]) * 1.15
    span = max(len(r["per_second"]) for r in runs.values())
    for ax, (key, r) in zip(axes, runs.items(), strict=False):
        color = PAUSE_COLORS.get(key, "#333333")
        xs = [s for s, _ in r["per_second"]]
        ys = [c for _, c in r["per_second"]]
        if xs:  # the last second's bar ends one second later
            xs, ys = [*xs, xs[-1] + 1], [*ys, ys[-1]]
        ax.step(xs, ys, where="post", color=color, lw=1.4)
        ax.fill_between(xs, ys, step="post", color=color, alpha=0.15)
        for c in r["checkpoints"]:
            t = c["trigger_ms"] / 1000 - r["start_s"]
            ax.axvspan(t, t + c["end_to_end_ms"] / 1000, color="#999999", alpha=0.18, lw=0)
            ax.axvline(t, color="#555555", lw=0.6, alpha=0.6)
        for c in r.get("unfinished", []):
            t = c["trigger_ms"] / 1000 - r["start_s"]
            if t >= 0:
                ax.axvspan(t, span, facecolor="none", edgecolor="#c44e52", hatch="//",
                           alpha=0.35, lw=0)
                ax.axvline(t, color="#c44e52", lw=0.8)
        if r.get("records_per_s"):
            ax.axhline(r["records_per_s"], color=color, lw=0.8, ls="--")
        ax.set_xlim(0, span)
        ax.set_ylim(0, top)
        ax.set_ylabel("records/s\n(higher is better)", fontsize=8)
        sync = (f"; Flink sync median {r['sync_median_ms']:,.1f} ms, max "
                f"{r['sync_max_ms']:,.0f} ms" if "sync_median_ms" in r else "")
        ax.set_title(f"{r['label']}: mean {r['records_per_s'] or 0:,.0f}/s (dashed), "
                     f"{len(r['checkpoints'])} checkpoints completed{sync}",
                     fontsize=9, loc="left")
    axes[-2].set_xlabel("seconds since the first record (records per whole second, both "
                        "subtasks summed)\ngrey: checkpoint trigger → completed; red "
                        "hatched: triggered and not completed by the end of the run",
                        fontsize=8)
    ax = axes[-1]
    for key, r in runs.items():
        points = [(c["trigger_ms"] / 1000 - r["start_s"], s["sync_ms"])
                  for c in r["checkpoints"] for s in c["subtasks"]]
        if points:
            ax.plot(*zip(*points, strict=True), "o", ms=3.5, alpha=0.75,
                    color=PAUSE_COLORS.get(key, "#333333"), label=r["label"])
    ax.axhline(5, color="#999999", lw=0.8, ls="--", label="target 5 ms")
    ax.set_yscale("symlog", linthresh=1)
    highest = max((s["sync_ms"] for r in runs.values() for c in r["checkpoints"]
                   for s in c["subtasks"]), default=10)
    ax.set_ylim(0, max(highest, 10) * 3)
    ax.set_xlim(0, span)
    ax.set_xlabel("checkpoint trigger, seconds since the first record")
    ax.set_ylabel("sync duration, ms (symlog)")
    ax.set_title("Flink's sync duration per checkpoint and subtask of the keyed operator "
                 "(lower is better)", fontsize=9, loc="left")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3)
    fig.suptitle(f"Checkpoints every {CHECKPOINT_MS} ms while a ValueState counter of "
                 f"{snap['job_keys']:,} keys is updated as fast as possible")
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def restore_rows_panels(rr: dict | None, ax: Any, ax2: Any) -> None:
    """Panels 5 (restore time versus state-table rows) and 6 (rows deleted)."""
    ax.set_title("5. Restore time versus state-table rows (lower is better)")
    ax2.set_title("6. Abandoned-epoch rows: restore path versus later cleanup\n(lower is better)")
    if not rr:
        return
    sizes = sorted(int(n) for n in rr["runs"])
    runs = [rr["runs"][str(n)] for n in sizes]
    color = COLORS["ndb-mariadb"]
    secs = [r["first_record_s"] for r in runs]
    ax.plot(sizes, secs, "o-", color=color, label="submit → first record (median)")
    for n, r in zip(sizes, runs, strict=True):
        ax.plot([n] * len(r["all"]), r["all"], ".", color=color, alpha=0.4)
        ax.annotate(f"{r['first_record_s']:.2f} s ({r['ratio_to_smallest']:.2f}×)",
                    (n, r["first_record_s"]), textcoords="offset points", xytext=(-20, 10),
                    fontsize=8, color=color)
    for key, label, style, c in (
            ("claimed_s", "submit → key groups claimed (pyflink-ndb restore done)", "s--",
             "#8172b3"),
            ("received_s", "submit → job graph at the dispatcher (client, MiniCluster)", "^:",
             "#937860"),
            ("in_cluster_s", "job graph at the dispatcher → first record (on the cluster)",
             "v-.", "#4c72b0")):
        points = [(n, r[key]) for n, r in zip(sizes, runs, strict=True)
                  if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points, strict=True), style, color=c, label=label)
    ax.set_xscale("log")
    ax.set_xticks(sizes, [f"{n:,}" for n in sizes])
    ax.minorticks_off()
    ax.margins(x=0.15)
    ax.set_ylim(0, max(v for r in runs for v in r["all"]) * 1.7)
    ax.set_xlabel("rows in the state table (half of them an abandoned epoch)")
    ax.set_ylabel("seconds (lower is better)")
    ax.legend(fontsize=7, loc="upper left")
    width = 0.27
    series = [("abandoned-epoch rows (a format-1 restore deleted them first)",
               [r["table"]["abandoned"] for r in runs], "#bbbbbb"),
              ("rows this restore deleted before the first record",
               [r["deleted_before_first"] for r in runs], color),
              ("abandoned rows left after a later full run (background cleanup)",
               [r.get("cleanup", {}).get("census", {}).get("abandoned", 0) for r in runs],
               "#55a868")]
    for i, (label, values, c) in enumerate(series):
        bars = ax2.bar(np.arange(len(sizes)) + (i - 1) * width, values, width, label=label,
                       color=c)
        ax2.bar_label(bars, fmt="{:,.0f}", fontsize=7)
    ax2.set_yscale("symlog", linthresh=1)
    ax2.set_ylim(0, max(r["table"]["total"] for r in runs) * 8)
    ax2.set_xticks(range(len(sizes)), [f"{n:,} rows" for n in sizes])
    ax2.set_xlabel("rows in the state table")
    ax2.set_ylabel("state rows (symlog; lower is better)")
    ax2.legend(fontsize=7, loc="upper left")


def git_commit() -> str:
    """HEAD's short hash, `+changes` when the package or the bridge differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--", "pyflink_ndb",
                                  "java-bridge"], cwd=ROOT, text=True, capture_output=True,
                                 check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" +changes in pyflink_ndb/java-bridge" if changed else "")


@click.command()
@click.option("--quick", is_flag=True, help="Smaller sizes: a smoke run of a few minutes.")
@click.option("--mysql-url", default=DEFAULT_MYSQL_URL, show_default=True,
              help="MariaDB/MySQL server for pyflink-ndb's MariaDB runs.")
@click.option("--parallelism", default=2, show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=ROOT / "bench" / "results", show_default=True)
@click.option("--only", multiple=True,
              type=click.Choice(["throughput", "recovery", "snapshot", "checkpoint-pause",
                                 "sql", "restore-rows", "reads", "profile",
                                 "recovery-rescale", "state-work", "key-filter"]),
              help="Run only these parts (repeatable; default: all). `sql` reads the state "
                   "of the throughput run; `checkpoint-pause` is `snapshot` (part 3).")
@click.option("--repeat", type=int, default=None,
              help="Rounds of the throughput, recovery and restore-rows jobs, median "
                   "reported (default: 3, --quick: 1).")
@click.option("--namespace-prefix", default="bench", show_default=True,
              help="Prefix of the benchmark's namespaces ([a-z][a-z0-9_]{0,19}): give two "
                   "runs on one database different prefixes.")
@click.option("--replot", is_flag=True,
              help="Only redraw summary.md and bench.png from OUT/results.json.")
@click.option("--cpu-latency-us", type=click.IntRange(min=0, max=2**31 - 1), default=None,
              help="Hold a Linux CPU latency QoS request of this many µs for the whole run "
                   "(/dev/cpu_dma_latency, root; bench/cpu_latency.py): 0 keeps idle CPUs "
                   "polling instead of halting. Default: none, the machine as it is. "
                   "Ignored with --replot.")
def main(quick: bool, mysql_url: str, parallelism: int, out_dir: Path,
         only: tuple[str, ...], repeat: int | None, namespace_prefix: str, replot: bool,
         cpu_latency_us: int | None) -> None:
    """Benchmark pyflink-ndb against PyFlink's hashmap and RocksDB backends."""
    if cpu_latency_us is not None and not replot:
        with cpu_latency.held(cpu_latency_us) as held:
            if not held:
                raise click.BadParameter(f"{cpu_latency.DEVICE} is missing, not writable or "
                                         "refused the request (run as root, or leave the "
                                         "option out)", param_hint="--cpu-latency-us")
            run_parts(quick, mysql_url, parallelism, out_dir, only, repeat,
                      namespace_prefix, cpu_latency_us)
        return
    run_parts(quick, mysql_url, parallelism, out_dir, only, repeat, namespace_prefix, None,
              replot)


def run_parts(quick: bool, mysql_url: str, parallelism: int, out_dir: Path,
              only: tuple[str, ...], repeat: int | None, namespace_prefix: str,
              cpu_latency_us: int | None, replot: bool = False) -> None:
    """:func:`main`'s work (`cpu_latency_us`: the request the caller holds, for the
    summary; None: none)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,19}", namespace_prefix):
        raise click.BadParameter("use 1-20 characters of [a-z0-9_], starting with a letter",
                                 param_hint="--namespace-prefix")
    NAMESPACE_PREFIX[0] = namespace_prefix
    if replot:
        saved = json.loads((out_dir / "results.json").read_text())
        (out_dir / "summary.md").write_text(
            summary_markdown(saved["meta"], saved["results"]) + "\n")
        chart(saved["results"], out_dir / "bench.png")
        pause_chart(saved["results"].get("snapshot"), out_dir / "checkpoint-pause.png")
        click.echo((out_dir / "summary.md").read_text())
        return
    parts = {"snapshot" if p == "checkpoint-pause" else p
             for p in only or ("throughput", "recovery", "snapshot", "sql", "restore-rows",
                               "reads", "profile", "recovery-rescale", "state-work",
                               "key-filter")}
    rounds = repeat or (1 if quick else 3)
    WORK.mkdir(parents=True, exist_ok=True)
    # This process's Flink log (read for the restore timeline), apart from the shared default
    # one that every PyFlink process of the virtualenv truncates when it starts.
    os.environ.setdefault("FLINK_LOG_DIR", str(WORK / "flink-log"))
    Path(os.environ["FLINK_LOG_DIR"]).mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    mysql_connection(mysql_url).close()
    meta = {"quick": quick, "rounds": rounds, "when": time.strftime("%Y-%m-%d %H:%M"),
            "commit": git_commit(),
            "cpus": os.cpu_count(), "parallelism": parallelism,
            "python": platform.python_version(), "cpu_latency_us": cpu_latency_us}
    results: dict[str, Any] = {}
    started = time.monotonic()
    from tqdm import tqdm

    order = ("throughput", "recovery", "snapshot", "sql", "restore-rows", "reads", "profile",
             "recovery-rescale", "state-work", "key-filter")
    progress = tqdm(total=len(parts), desc="bench parts", unit=" part", file=sys.stderr,
                    disable=None)

    def part_done(name: str) -> None:
        if name in parts:
            progress.update(1)
            progress.set_postfix_str(f"{name} done")
            # Saved after each part: a run cut short keeps the parts it finished
            # (`--replot` renders them).
            meta["elapsed_s"] = time.monotonic() - started
            (out_dir / "results.json").write_text(
                json.dumps({"meta": meta, "results": results}, indent=2))
    if "throughput" in parts:
        results["throughput"] = bench_throughput(40_000 if quick else None, mysql_url,
                                                 parallelism, rounds)
    part_done(order[0])
    if "recovery" in parts:
        results["recovery"] = bench_recovery([2_000, 10_000] if quick else [10_000, 100_000],
                                             200 if quick else 1000, mysql_url, parallelism,
                                             rounds)
    part_done(order[1])
    if "snapshot" in parts:
        job_kinds: list[tuple[str, bool | None, int | None, str, bool]] = [
            ("rocksdb", None, None, "thread", False), ("ndb-mariadb", True, None, "thread", False),
            ("ndb-mariadb", True, None, "render-process", False),
            ("ndb-mariadb", True, None, "process", False),
            ("ndb-mariadb", False, None, "thread", False)]
        if not quick:
            job_kinds += [("ndb-sqlite", True, None, "thread", False)]
        # Last: the JVM's interpreter stays pinned once a job pinned it (pause_job).
        job_kinds += [("rocksdb", None, None, "thread", True),
                      ("ndb-mariadb", True, None, "thread", True),
                      ("ndb-mariadb", True, None, "render-process", True)]
        results["snapshot"] = bench_snapshot(
            [1_000, 10_000] if quick else [1_000, 10_000, 100_000], 2 if quick else 3,
            mysql_url, parallelism, 10 if quick else 40, job_kinds, warmup=not quick,
            sweep=((1_000, 1_000, 8),) if quick else PAUSE_SWEEP)
    part_done(order[2])
    if "sql" in parts:
        results["sql"] = bench_sql_reads(mysql_url, 1_000 if quick else 5_000,
                                         20 if quick else 100)
    part_done(order[3])
    if "restore-rows" in parts:
        results["restore_rows"] = bench_restore_rows(
            [10_000, 100_000] if quick else [10_000, 100_000, 1_000_000], mysql_url,
            parallelism, rounds)
    part_done(order[4])
    if "reads" in parts:
        from bench.reads import bench_reads

        results["reads"] = bench_reads(
            mysql_url, f"{NAMESPACE_PREFIX[0]}_reads", keys=20_000 if quick else 100_000,
            reads=2_000 if quick else 20_000, warmup=200 if quick else 2_000,
            write_cost_entries=5_000 if quick else 20_000, log=log, held_us=cpu_latency_us)
    part_done(order[5])
    if "profile" in parts:
        from bench.profile import BACKENDS as PROFILE_BACKENDS
        from bench.profile import bench_profile

        results["profile"] = bench_profile(
            mysql_url, NAMESPACE_PREFIX[0], WORK, 10 if quick else 60, 3 if quick else 5,
            [b[0] for b in PROFILE_BACKENDS
             if not (quick and b[0] == "ndb-mariadb-background")], parallelism, log=log)
    part_done(order[6])
    if "recovery-rescale" in parts:
        from bench.recovery import BACKENDS as RECOVERY_BACKENDS
        from bench.recovery import QUICK_BACKENDS
        from bench.recovery import bench_recovery as bench_recovery_rescale

        results["recovery_rescale"] = bench_recovery_rescale(
            mysql_url, NAMESPACE_PREFIX[0], WORK,
            [10_000, 20_000] if quick else [10_000, 100_000, 1_000_000],
            list(QUICK_BACKENDS) if quick else [b[0] for b in RECOVERY_BACKENDS], log=log)
    part_done(order[7])
    if "state-work" in parts:
        from bench.statework import bench_statework

        results["state_work"] = bench_statework(
            mysql_url, NAMESPACE_PREFIX[0], 20_000 if quick else 60_000, 1 if quick else 3,
            log=log)
    part_done(order[8])
    if "key-filter" in parts:
        from bench.keyfilter import bench_keyfilter

        results["key_filter"] = bench_keyfilter(
            mysql_url, NAMESPACE_PREFIX[0], 20_000 if quick else 100_000, log=log)
    part_done(order[9])
    progress.close()
    meta["elapsed_s"] = time.monotonic() - started
    (out_dir / "results.json").write_text(json.dumps({"meta": meta, "results": results},
                                                     indent=2))
    summary = summary_markdown(meta, results)
    (out_dir / "summary.md").write_text(summary + "\n")
    chart(results, out_dir / "bench.png")
    pause_chart(results.get("snapshot"), out_dir / "checkpoint-pause.png")
    click.echo(summary)
    log(f"done in {meta['elapsed_s'] / 60:.1f} min: {out_dir}/summary.md, bench.png")


if __name__ == "__main__":
    main()
