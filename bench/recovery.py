"""Bench part `recovery-rescale` (`python -m bench.run --only recovery-rescale`, part 8;
alone: `python -m bench.recovery`): issue 9's workload (c), recovery and rescale. (Part 2
of bench/run.py is `--only recovery`: submit → first record after a stop-with-savepoint.)

One continuous job per backend and size N (each in a fresh Python process, hence a fresh
JVM, as bench/profile.py runs its backends):

1. **Build.** An endless NumberSequenceSource at parallelism 1, chained with a Python
   flat_map (:class:`Phases`) that turns the first N numbers into one record per key
   `0 .. N-1` (a ValueState of about 1 KB: a count and a 1,000-character payload derived
   from the key, :func:`payload`), then :data:`END_MARKERS` end markers, then drops every
   further number after a short sleep (the job idles but stays running). The keyed
   function (:class:`RecoveryState`) runs at parallelism P (2). The upstream operators
   run at parallelism 1 so that every record reaches its keyed subtask in the order the
   flat_map emitted it (a PyFlink `key_by` adds a Python operator at the environment's
   parallelism; between two of them Flink would rebalance and reorder).
2. **Covering checkpoint.** Once every keyed subtask processed its end marker, the driver
   waits (Flink REST API, `rest.port` as bench/profile.py sets it) for a completed
   checkpoint triggered after that: it holds all N keys.
3. **Failure.** Right then (or `failure_delay_s` later) the driver creates a flag file;
   the flat_map then emits one record that makes the keyed function write `time.time()`
   and raise. Restart strategy fixed-delay, 1 attempt, 0 s delay: only Flink's own
   restart and the backend's restore remain.
4. **Probe.** The restarted attempt's flat_map emits :data:`PROBE` records of random
   existing keys (numpy, fixed seed) and end markers; each is a read-modify-write of the
   key's value, checked against the value the build and the earlier probe records made (a
   wrong or missing value is counted and fails the run). Measured: failure → first record
   processed by every subtask after the restore, and → the last probe record (its end
   marker) on every subtask. Then one more completed checkpoint (the savepoint finds
   about one interval's changes, as in a running job) and pyflink-ndb's metrics (REST).
5. **Rescale.** Stop-with-savepoint (canonical format) at parallelism P; for Flink RocksDB
   first a savepoint in the native format too (triggered, the job keeps running; the state
   is the same: no record touches state in between). Each savepoint is restored by a new
   job at parallelism :data:`RESCALE_PARALLELISM` (3) that runs a second probe of random
   keys (expected values include the first probe's updates): submit → first record of
   every subtask, → probe end.

Also: the build's records/s, Flink's checkpoint durations (end to end, sync) from REST,
the checkpointed and full state size, the JVM's peak RSS (VmRSS sampled every 0.25 s;
the MiniCluster's one JVM holds the JobManager, the TaskManager and the embedded CPython
of thread mode), Flink's log of the restarted keyed subtasks (INITIALIZING → RUNNING: the
state backend's restore) and pyflink-ndb's log lines (`claimed key groups`, `prefetched`,
`checkpoint N durable`).

Sizes run in increasing order. A size beyond the second is run only when its estimate
(per backend: the largest size's run with its size-dependent phases scaled linearly,
:func:`scaling_s`) fits the remaining time budget and :data:`MAX_BACKEND_S` per backend;
otherwise the largest of :data:`FALLBACK_SIZES` that fits is run instead, and the result
says why.

The part never fails: a backend that fails is recorded with its error.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pyflink.common import Types
from pyflink.datastream import FlatMapFunction, KeyedProcessFunction, RuntimeContext

from bench.functions import CPU_PIN_OPTION, pin_like_the_option, release_inherited

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OPERATOR = "bench-recovery"
SEED = 20130101
#: Records of each probe (after the failure, and after the rescale).
PROBE = 10_000
#: Characters of each key's payload (its pickled value is about 1 KB).
PAYLOAD_CHARS = 1000
#: End markers after the build and after each probe: keys -1 .. -END_MARKERS (every keyed
#: subtask gets at least one: 64 keys over 128 key groups).
END_MARKERS = 64
#: The record that makes the keyed function raise.
FAIL_KEY = -1000
#: Sleep of the flat_map per dropped number while the job idles (a cheap, steady trickle
#: that keeps the source running; a checkpoint barrier waits at most this long).
FILLER_SLEEP_S = 0.002
PARALLELISM = 2
RESCALE_PARALLELISM = 3
#: Remote-storage bandwidths of the model (bytes/s per TaskManager).
MODEL_BANDWIDTHS = (100e6, 1e9)
#: Network round trip of the model of pyflink-ndb's lazy reads from a remote database (s).
MODEL_RTT_S = 0.0005
#: Longest estimated time of one backend at one size (the brief: about 10 minutes).
MAX_BACKEND_S = 600.0
#: Sizes tried, largest first, when a requested size does not fit the budget.
FALLBACK_SIZES = (750_000, 500_000, 400_000, 300_000, 250_000, 200_000, 150_000)
#: Safety factor on the linear extrapolation of a backend's time.
ESTIMATE_MARGIN = 1.15
#: A run starts only while the part has used less than this times its budget.
OVERRUN = 1.1

#: (key, label, Flink backend kind as bench.run knows it, restore.mode; `lazy-nofilter`:
#: lazy with `restore.key-filter: false`; `lazy-noreadahead`: lazy with
#: `read-ahead.records: 0`; `lazy-nolocal`: lazy with `local.recovery: false`).
BACKENDS: tuple[tuple[str, str, str, str | None], ...] = (
    ("hashmap", "Flink hashmap", "hashmap", None),
    ("rocksdb-full", "Flink RocksDB, full checkpoints", "rocksdb", None),
    ("rocksdb-incremental", "Flink RocksDB, incremental checkpoints", "rocksdb", None),
    ("rocksdb-incremental-local", "Flink RocksDB, incremental, state.backend.local-recovery",
     "rocksdb", None),
    ("ndb-sqlite", "pyflink-ndb SQLite (lazy)", "ndb-sqlite", "lazy"),
    ("ndb-sqlite-background", "pyflink-ndb SQLite, restore.mode background", "ndb-sqlite",
     "background"),
    ("ndb-mariadb", "pyflink-ndb MariaDB (lazy)", "ndb-mariadb", "lazy"),
    ("ndb-mariadb-nofilter", "pyflink-ndb MariaDB (lazy, restore.key-filter false)",
     "ndb-mariadb", "lazy-nofilter"),
    ("ndb-mariadb-noreadahead", "pyflink-ndb MariaDB (lazy, read-ahead.records 0)",
     "ndb-mariadb", "lazy-noreadahead"),
    ("ndb-mariadb-nolocal", "pyflink-ndb MariaDB (lazy, local.recovery false)",
     "ndb-mariadb", "lazy-nolocal"),
    ("ndb-mariadb-background", "pyflink-ndb MariaDB, restore.mode background",
     "ndb-mariadb", "background"),
)
#: `--quick`: one backend of each kind.
QUICK_BACKENDS = ("hashmap", "rocksdb-incremental", "ndb-sqlite", "ndb-mariadb-background")
_BY_KEY = {b[0]: b for b in BACKENDS}
_SHORT = {"ndb-sqlite": "sq", "ndb-sqlite-background": "sq_bg", "ndb-mariadb": "my",
          "ndb-mariadb-nofilter": "my_nf", "ndb-mariadb-noreadahead": "my_nra",
          "ndb-mariadb-nolocal": "my_nl", "ndb-mariadb-background": "my_bg"}


# -- the job (runs in the TaskManager's interpreter) --------------------------------------
def payload(key: int) -> str:
    """The key's payload: :data:`PAYLOAD_CHARS` characters of base64 of pseudo-random bytes
    (SHAKE-128 of the key), text that compresses about as little as real data; a wrong
    key's value never matches."""
    digest = hashlib.shake_128(b"%d" % key).digest(PAYLOAD_CHARS * 3 // 4)
    return base64.b64encode(digest).decode("ascii")


def probe_plan(keys: int, probe: int, which: int) -> tuple[list[int], list[int]]:
    """Probe `which` (1: after the failure, 2: after the rescale) over keys 0..keys-1:
    the keys (numpy, fixed seed) and, per record, the count its value must hold (the
    build wrote 1, every probe record adds 1)."""
    first = [int(k) for k in np.random.default_rng([SEED, keys, 1]).integers(0, keys, probe)]
    counts: dict[int, int] = {}
    expected = []
    for k in first:
        c = counts.get(k, 0)
        expected.append(1 + c)
        counts[k] = c + 1
    if which == 1:
        return first, expected
    second = [int(k) for k in np.random.default_rng([SEED, keys, 2]).integers(0, keys, probe)]
    seen: dict[int, int] = {}
    expected = []
    for k in second:
        c = seen.get(k, 0)
        expected.append(1 + counts.get(k, 0) + c)
        seen[k] = c + 1
    return second, expected


def _mark(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Phases(FlatMapFunction):
    """Sequence numbers → `(key, expected count)` records (module docstring, steps 1-5).

    `mode` "job": attempt 0 builds keys 0..keys-1 (expected 0: no value yet), a later
    attempt (after the injected failure) runs probe 1; "rescale": probe 2. Each plan is
    followed by end markers `(-1 - j, -1)`, then numbers are dropped; in attempt 0 the
    flag file `<run_dir>/fail-now` makes it emit `(FAIL_KEY, -2)` once. `cpu_pin` (Flink's
    own backends; pyflink-ndb reads `state.backend.ndb.python.cpu-pin` itself): the
    TaskManager's Python threads on one CPU (:mod:`pyflink_ndb.cpu_pin`).
    """

    def __init__(self, run_dir: str, keys: int, probe: int, mode: str,
                 cpu_pin: str = "off") -> None:
        self.run_dir = run_dir
        self.keys = keys
        self.probe = probe
        self.mode = mode
        self.cpu_pin = cpu_pin

    def open(self, runtime_context: RuntimeContext) -> None:
        if self.cpu_pin != "off":  # Flink's backends: what `python.cpu-pin` does
            pin_like_the_option(self.cpu_pin)
        folder = Path(self.run_dir)
        self.attempt = runtime_context.get_attempt_number()
        self.building = self.mode == "job" and self.attempt == 0
        self.plan_keys: list[int] = []
        self.plan_expected: list[int] = []
        if self.mode == "rescale":
            self.plan_keys, self.plan_expected = probe_plan(self.keys, self.probe, 2)
        elif not self.building:
            if not (folder / "failed").exists():  # a restart the bench did not inject
                _mark(folder / f"unexpected-restart-{self.attempt}", repr(time.time()))
            self.plan_keys, self.plan_expected = probe_plan(self.keys, self.probe, 1)
        self.planned = self.keys if self.building else len(self.plan_keys)
        self.flag = str(folder / "fail-now")
        self.fail_sent = False
        self.i = 0

    def flat_map(self, value: int) -> Any:
        i = self.i
        self.i = i + 1
        if self.cpu_pin != "off" and i % 10_000 == 0:
            release_inherited()  # Flink's asynchronous checkpoint threads keep every CPU
        if i < self.planned:
            yield (i, 0) if self.building else (self.plan_keys[i], self.plan_expected[i])
            return
        j = i - self.planned
        if j < END_MARKERS:
            yield (-1 - j, -1)
            return
        if self.building and not self.fail_sent and os.path.exists(self.flag):
            self.fail_sent = True
            yield (FAIL_KEY, -2)
            return
        time.sleep(FILLER_SLEEP_S)


class RecoveryState(KeyedProcessFunction):
    """A ValueState `(count, payload(key))` per key; emits nothing.

    Per subtask attempt, in `<run_dir>/<phase>-a<attempt>/`: `first-<i>` (time.time()
    after the first record's state update), `end-<i>` (`time records wrong` at its first
    end marker), `wrong-<i>` (the first few wrong values). `(FAIL_KEY, -2)` writes
    `<run_dir>/failed` (time.time()) and raises.
    """

    def __init__(self, run_dir: str, phase: str) -> None:
        self.run_dir = run_dir
        self.phase = phase

    def open(self, runtime_context: RuntimeContext) -> None:
        from pyflink.datastream.state import ValueStateDescriptor

        self.state = runtime_context.get_state(
            ValueStateDescriptor("value", Types.PICKLED_BYTE_ARRAY()))
        self.subtask = runtime_context.get_index_of_this_subtask()
        self.markers = Path(self.run_dir) / \
            f"{self.phase}-a{runtime_context.get_attempt_number()}"
        self.markers.mkdir(parents=True, exist_ok=True)
        self.first_done = False
        self.end_done = False
        self.records = 0
        self.wrong = 0

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        key, expected = value
        if expected < 0:
            if expected == -2:
                _mark(Path(self.run_dir) / "failed", repr(time.time()))
                raise RuntimeError("bench.recovery: injected failure")
            if not self.end_done:
                self.end_done = True
                _mark(self.markers / f"end-{self.subtask}",
                      f"{time.time()!r} {self.records} {self.wrong}")
            return
        text = payload(key)
        current = self.state.value()
        if current != (None if expected == 0 else (expected, text)):
            self.wrong += 1
            if self.wrong <= 5:
                with (self.markers / f"wrong-{self.subtask}").open("a") as f:
                    shown = None if current is None else (current[0], str(current[1])[:24])
                    f.write(f"key {key}: expected count {expected}, found {shown!r}\n")
        self.state.update((expected + 1, text))
        self.records += 1
        if not self.first_done:
            self.first_done = True
            _mark(self.markers / f"first-{self.subtask}", repr(time.time()))
        yield from ()


# -- one backend and size (the child process) ----------------------------------------------
class RunError(Exception):
    """The run cannot go on (its message goes into the result)."""


def _times(folder: Path, name: str) -> dict[int, float]:
    out = {}
    for p in folder.glob(f"{name}-*"):
        if p.name.endswith(".tmp"):
            continue
        out[int(p.name.rsplit("-", 1)[1])] = float(p.read_text().split()[0])
    return out


def _ends(folder: Path) -> dict[int, tuple[float, int, int]]:
    out = {}
    for p in folder.glob("end-*"):
        if not p.name.endswith(".tmp"):
            t, records, wrong = p.read_text().split()
            out[int(p.name.rsplit("-", 1)[1])] = (float(t), int(records), int(wrong))
    return out


def _wrong(run_dir: Path) -> list[str]:
    return [line for p in sorted(run_dir.glob("*/wrong-*"))
            for line in p.read_text().splitlines()][:10]


def _wait(condition: Callable[[], bool], timeout_s: float, what: str, client: Any) -> None:
    """Poll `condition` every 50 ms; fail when the job ended or after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last_status = 0.0
    while not condition():
        now = time.monotonic()
        if now > deadline:
            raise RunError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        if now - last_status > 1.0:
            last_status = now
            if client.get_job_status().result().is_globally_terminal_state():
                try:
                    client.get_job_execution_result().result()
                except Exception as err:
                    raise RunError(f"the job failed while waiting for {what}: "
                                   + _root_cause(err)) from err
                raise RunError(f"the job ended while waiting for {what}")
        time.sleep(0.05)


def _root_cause(err: BaseException) -> str:
    text = str(err)
    causes = [line.strip() for line in text.splitlines() if "Caused by" in line]
    return (causes[-1] if causes else text.splitlines()[0] if text else repr(err))[:400]


_SWITCH = re.compile(r"\.taskmanager\.Task .* - (?:NDB )?KEYED PROCESS[^(]* \((\d+)/\d+\)#(\d+) "
                     r".*switched from (\w+) to (\w+)\.")
_CLAIMED = re.compile(r"pyflink-ndb (\S+)/(\d+) \(attempt (\d+)\) claimed key groups "
                      r"(\d+)-(\d+) as branch (\d+) \((\w+)\)(?: in ([\d.]+) ms)?")
_PREFETCHED = re.compile(r"pyflink-ndb (\S+)/(\d+): prefetched (\d+) entries of (\d+) key "
                         r"groups in ([\d.]+) s")


def keyed_timeline(since: float, until: float, attempt: int) -> dict[str, Any]:
    """From this process's Flink log: per keyed subtask of `attempt`, the seconds after
    `since` at which it switched to INITIALIZING (deployed; the state backend restores)
    and RUNNING (restored); pyflink-ndb's claim and prefetch lines."""
    from bench.run import flink_log_events

    subtasks: dict[int, dict[str, float]] = {}
    claimed, prefetched = [], []
    for t, line in flink_log_events(since):
        if t > until:
            break
        if (m := _SWITCH.search(line)) and int(m.group(2)) == attempt and \
                m.group(4) in ("DEPLOYING", "INITIALIZING", "RUNNING"):
            subtasks.setdefault(int(m.group(1)) - 1, {}).setdefault(
                m.group(4).lower() + "_s", t - since)
        elif (m := _CLAIMED.search(line)) and m.group(1) == OPERATOR:
            claimed.append({"subtask": int(m.group(2)), "attempt": int(m.group(3)),
                            "kind": m.group(7), "t_s": t - since,
                            "ms": None if m.group(8) is None else float(m.group(8))})
        elif (m := _PREFETCHED.search(line)) and m.group(1) == OPERATOR:
            prefetched.append({"subtask": int(m.group(2)), "entries": int(m.group(3)),
                               "key_groups": int(m.group(4)), "s": float(m.group(5)),
                               "t_s": t - since})
    restore = [s["running_s"] - s["initializing_s"] for s in subtasks.values()
               if "running_s" in s and "initializing_s" in s]
    out: dict[str, Any] = {"subtasks": {str(k): v for k, v in sorted(subtasks.items())},
                           "claimed": claimed, "prefetched": prefetched,
                           "restore_max_s": max(restore) if restore else None}
    for phase in ("deploying_s", "initializing_s", "running_s"):
        if subtasks and all(phase in s for s in subtasks.values()):
            out[phase] = max(s[phase] for s in subtasks.values())
    return out


def _checkpoint_summary(checkpoints: list[dict[str, Any]]) -> dict[str, Any]:
    from bench.run import checkpoint_durations

    return {"count": len(checkpoints), **checkpoint_durations(checkpoints)}


def store_size(kind: str, url: str, namespace: str) -> int | None:
    """Bytes the store holds for the namespace (SQLite: the file; MariaDB: data + index of
    the state table, from information_schema)."""
    if kind == "ndb-sqlite":
        path = Path(url[len("sqlite:///"):])
        return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    from bench.run import mysql_connection

    conn = mysql_connection(url)
    try:
        with conn.cursor() as cur:
            cur.execute("ANALYZE TABLE " + f"{namespace}_state")
            cur.fetchall()
            cur.execute("SELECT data_length + index_length FROM information_schema.tables "
                        "WHERE table_schema = DATABASE() AND table_name = %s",
                        (f"{namespace}_state",))
            row = cur.fetchone()
    finally:
        conn.close()
    return None if row is None else int(row[0])


def _build_job(env: Any, kind: str, run_dir: Path, keys: int, probe: int, mode: str,
               phase: str, keyed_parallelism: int, options: Mapping[str, str],
               conf: Mapping[str, str]) -> None:
    from pyflink.common import WatermarkStrategy
    from pyflink.datastream.connectors import Sink
    from pyflink.datastream.connectors.number_seq import NumberSequenceSource
    from pyflink.java_gateway import get_gateway

    from bench.run import keyed_process

    records = (env.from_source(NumberSequenceSource(0, 2 ** 62),
                               WatermarkStrategy.no_watermarks(), "sequence")
               .uid("sequence").set_parallelism(1)
               .flat_map(Phases(str(run_dir), keys, probe, mode,
                                "off" if options else conf.get(CPU_PIN_OPTION, "off")),
                         Types.TUPLE([Types.LONG(), Types.LONG()]))
               .uid("phases").set_parallelism(1))
    keyed = records.key_by(lambda r: r[0], key_type=Types.LONG())
    out = keyed_process(kind, keyed, RecoveryState(str(run_dir), phase), Types.LONG(),
                        OPERATOR, options).set_parallelism(keyed_parallelism)
    jvm = get_gateway().jvm
    out.sink_to(Sink(jvm.org.apache.flink.streaming.api.functions.sink.v2
                     .DiscardingSink())).uid("discard").set_parallelism(keyed_parallelism)


def _savepoint_format(name: str) -> Any:
    from pyflink.java_gateway import get_gateway

    return getattr(get_gateway().jvm.org.apache.flink.core.execution.SavepointFormatType, name)


def _cancel(client: Any) -> None:
    try:
        client.cancel().result()
    except Exception as err:  # it ended already
        print(f"cancel: {str(err).splitlines()[0][:160]}", file=sys.stderr)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if client.get_job_status().result().is_globally_terminal_state():
                return
        except Exception:  # the per-job MiniCluster is gone
            return
        time.sleep(0.1)


def rescale_run(kind: str, fmt: str, savepoint: str, work: Path, keys: int, probe: int,
                extra: Mapping[str, str], options: Mapping[str, str],
                sampler: Any) -> dict[str, Any]:
    """Restore `savepoint` at :data:`RESCALE_PARALLELISM` and run probe 2: submit → first
    record of every subtask, → probe end; then cancel."""
    from pyflink.common import RestartStrategies

    from bench.profile import proc_status_kb
    from bench.run import flink_extra, free_port, make_environment

    run_dir = work / f"rescale-{fmt}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    conf = dict(extra)
    conf.update(flink_extra(kind, work / f"checkpoints-rescale-{fmt}"))
    port = free_port()
    conf.update({"rest.port": str(port), "rest.bind-port": str(port),
                 "execution.savepoint.path": savepoint,
                 "execution.savepoint.ignore-unclaimed-state": "true"})
    env = make_environment(1, 1000, extra=conf)
    env.set_restart_strategy(RestartStrategies.no_restart())
    _build_job(env, kind, run_dir, keys, probe, "rescale", "rescale", RESCALE_PARALLELISM,
               options, conf)
    submitted = time.time()
    client = env.execute_async(f"bench-recovery-rescale-{kind}-{fmt}-{keys}")
    markers = run_dir / "rescale-a0"
    out: dict[str, Any] = {"format": fmt, "savepoint": savepoint}
    try:
        _wait(lambda: len(_ends(markers)) >= RESCALE_PARALLELISM, 300 + keys / 2000,
              "the rescaled job's probe", client)
        seen = time.time()
    finally:
        _cancel(client)
    firsts, ends = _times(markers, "first"), _ends(markers)
    out.update(submit_to_first_s=max(firsts.values()) - submitted,
               submit_to_probe_end_s=max(t for t, _, _ in ends.values()) - submitted,
               records=sum(r for _, r, _ in ends.values()),
               wrong=sum(w for _, _, w in ends.values()),
               java_peak_sampled_kb=sampler.peak_kb(submitted, seen),
               java_hwm_kb=proc_status_kb(sampler.pid, "VmHWM"),
               timeline=keyed_timeline(submitted, seen, 0))
    received = [t for t, line in _log_since(submitted, seen)
                if "Received JobGraph submission" in line]
    if received:
        out["received_s"] = received[0] - submitted
    if out["wrong"] or out["records"] != probe:
        out["error"] = (f"rescaled probe: {out['wrong']} wrong values, {out['records']} of "
                        f"{probe} records: " + "; ".join(_wrong(run_dir)))
    return out


def _log_since(since: float, until: float) -> list[tuple[float, str]]:
    from bench.run import flink_log_events

    return [(t, line) for t, line in flink_log_events(since) if t <= until]


#: The database server counts as quiet below this many CPUs over :data:`QUIET_WINDOW_S`.
QUIET_CPUS = 0.1
QUIET_WINDOW_S = 1.0
#: Longest wait for a quiet database server before the failure is injected anyway.
QUIET_MAX_WAIT_S = 60.0


def wait_for_quiet_database() -> dict[str, Any]:
    """Wait until the MySQL-protocol server of this machine used less than
    :data:`QUIET_CPUS` over :data:`QUIET_WINDOW_S` (at most :data:`QUIET_MAX_WAIT_S`).

    A variant (`--quiet-failure`), not the part's default: the default fails right after
    the covering checkpoint, pyflink-ndb's worst moment (its garbage collection and the
    server's flushing are running).

    Why: after a build of a million keys MariaDB still writes the gigabyte it was given
    (InnoDB's purge and page flushing) for some seconds, on the same two CPUs as the
    TaskManager. A failure injected then times every restart step of Flink at about twice
    its length, for every backend (stop 35: load 3.35, the failed attempt's close 21 ms
    against 7 ms at 10,000 keys). A database of its own machines (RonDB's data nodes) does
    not take the TaskManager's CPUs. Applied to every backend alike; the wait and the
    server's CPUs at the failure are in the result.

    :returns: `quiet_wait_s` (seconds waited, at least one window),
        `database_cpus_at_failure` (CPUs the servers used in the last window),
        `quiet_timed_out` (gave up after :data:`QUIET_MAX_WAIT_S`) and `database_servers`
        (how many were found; none: no wait beyond one window).
    """
    from bench.profile import database_cpu_seconds

    started = time.monotonic()
    before, servers = database_cpu_seconds()
    mark = started
    while True:
        time.sleep(QUIET_WINDOW_S)
        now, servers = database_cpu_seconds()
        at = time.monotonic()
        cpus = (now - before) / (at - mark)
        before, mark = now, at
        timed_out = at - started > QUIET_MAX_WAIT_S
        if (servers and 0 <= cpus < QUIET_CPUS) or timed_out or not servers:
            return {"quiet_wait_s": at - started, "database_cpus_at_failure": cpus,
                    "quiet_timed_out": timed_out, "database_servers": servers}


def run_backend(key: str, keys: int, mysql_url: str, prefix: str, work: str,
                probe: int = PROBE, keep_state: bool = False,
                flink_conf: dict[str, str] | None = None,
                failure_delay_s: float = 0.0, quiet_failure: bool = False) -> dict[str, Any]:
    """The whole recovery run of one backend at one size (module docstring);
    `failure_delay_s`: wait this long after the covering checkpoint before the failure;
    `quiet_failure`: then also until the database server is quiet
    (:func:`wait_for_quiet_database`)."""
    from pyflink.common import RestartStrategies

    from bench.profile import RssSampler, java_pid, ndb_metrics, proc_status_kb
    from bench.run import (
        _DURABLE,
        CHECKPOINT_MS,
        checkpoint_stats,
        drop_namespace,
        flink_extra,
        flink_log_events,
        free_port,
        make_environment,
        ndb_options,
        rest_get,
        store_url,
    )

    started = time.monotonic()
    _, label, kind, restore_mode = _BY_KEY[key]
    folder = Path(work)
    run_dir = folder / "job"
    run_dir.mkdir(parents=True)
    options: dict[str, str] = {}
    url = namespace = ""
    if restore_mode is not None:
        namespace = f"{prefix}_rcv_{_SHORT[key]}_{keys}"
        url = store_url(kind, mysql_url, namespace)
        options = ndb_options(url, namespace)
        options["state.backend.ndb.restore.mode"] = restore_mode.split("-")[0]
        if restore_mode == "lazy-nofilter":
            options["state.backend.ndb.restore.key-filter"] = "false"
        if restore_mode == "lazy-noreadahead":
            options["state.backend.ndb.read-ahead.records"] = "0"
        if restore_mode == "lazy-nolocal":
            options["state.backend.ndb.local.recovery"] = "false"
        drop_namespace(url, namespace)
    extra = flink_extra(kind, folder / "checkpoints")
    if kind == "rocksdb":
        extra["state.backend.incremental"] = "false" if key == "rocksdb-full" else "true"
        if key == "rocksdb-incremental-local":
            # Flink's task-local recovery: a local copy of each checkpoint, read at a
            # failover instead of the checkpoint storage (which is on this disk too)
            extra["state.backend.local-recovery"] = "true"
    extra["execution.checkpointing.tolerable-failed-checkpoints"] = "1000"
    extra.update(flink_conf or {})
    port = free_port()
    conf = dict(extra)
    conf.update({"rest.port": str(port), "rest.bind-port": str(port),
                 "web.checkpoints.history": "1000", "metrics.fetcher.update-interval": "1000",
                 # REST answers checkpoint statistics at most this old (default 3 s)
                 "rest.cache.checkpoint-statistics.timeout": "100 ms"})
    env = make_environment(1, CHECKPOINT_MS, extra=conf)
    env.set_restart_strategy(RestartStrategies.fixed_delay_restart(1, 0))
    _build_job(env, kind, run_dir, keys, probe, "job", "job", PARALLELISM, options, conf)
    jvm = java_pid()
    sampler = RssSampler(jvm)
    sampler.start()
    out: dict[str, Any] = {"key": key, "label": label, "keys": keys, "probe": probe,
                           "parallelism": PARALLELISM,
                           "rescale_parallelism": RESCALE_PARALLELISM,
                           "value_bytes": len(__import__("pickle").dumps(
                               (1, payload(keys - 1)), protocol=5)),
                           "java_pid": jvm, "rss_before_submit_kb": proc_status_kb(jvm, "VmRSS"),
                           "restore_mode": restore_mode,
                           "options": {k: v for k, v in {**options, **extra}.items()
                                       if "password" not in k}}
    submitted = time.time()
    client = env.execute_async(f"bench-recovery-{key}-{keys}")
    job_id = str(client.get_job_id())
    build, recovered = run_dir / "job-a0", run_dir / "job-a1"
    try:
        # 1. build
        _wait(lambda: len(_ends(build)) >= PARALLELISM, 120 + keys / 500, "the build", client)
        firsts, ends = _times(build, "first"), _ends(build)
        build_first, build_end = min(firsts.values()), max(t for t, _, _ in ends.values())
        built = sum(r for _, r, _ in ends.values())
        out.update(submit_to_first_s=min(firsts.values()) - submitted,
                   build_s=build_end - build_first, build_records=built,
                   build_records_per_s=built / (build_end - build_first))
        if built != keys or any(w for _, _, w in ends.values()):
            raise RunError(f"build: {built} of {keys} records, wrong values: "
                           + "; ".join(_wrong(run_dir)))

        # 2. a completed checkpoint that covers every key
        covering: dict[str, Any] = {}

        def covered() -> bool:
            history = rest_get(port, f"/jobs/{job_id}/checkpoints")["history"]
            for h in sorted(history, key=lambda h: h["id"]):
                if h["status"] == "COMPLETED" and not h.get("is_savepoint") and \
                        h["trigger_timestamp"] / 1000 > build_end:
                    covering.update(h)
                    return True
            return False
        _wait(covered, 120 + keys / 1000, "a checkpoint that covers every key", client)
        out.update(covering_id=covering["id"],
                   build_end_to_covering_s=covering["latest_ack_timestamp"] / 1000 - build_end,
                   covering_e2e_ms=covering["end_to_end_duration"],
                   covering_state_size=covering["state_size"],
                   covering_checkpointed_size=covering["checkpointed_size"])

        # 3. failure, 4. probe
        time.sleep(failure_delay_s)
        if quiet_failure:
            out.update(wait_for_quiet_database())
        (run_dir / "fail-now").touch()
        _wait(lambda: (run_dir / "failed").exists(), 60, "the injected failure", client)
        _wait(lambda: len(_ends(recovered)) >= PARALLELISM, 300 + keys / 1000,
              "the probe after the failure", client)
        probe_seen = time.time()
        failed = float((run_dir / "failed").read_text())
        firsts, ends = _times(recovered, "first"), _ends(recovered)
        out.update(failure_to_first_s=max(firsts.values()) - failed,
                   failure_to_first_each_s=[firsts[i] - failed for i in sorted(firsts)],
                   failure_to_probe_end_s=max(t for t, _, _ in ends.values()) - failed,
                   probe_records=sum(r for _, r, _ in ends.values()),
                   probe_wrong=sum(w for _, _, w in ends.values()),
                   failure_timeline=keyed_timeline(failed, probe_seen, 1))
        unexpected = sorted(p.name for p in run_dir.glob("unexpected-restart-*"))
        if unexpected:
            raise RunError(f"restarts the bench did not inject: {unexpected}")
        if out["probe_wrong"] or out["probe_records"] != probe:
            raise RunError(f"probe after the failure: {out['probe_wrong']} wrong values, "
                           f"{out['probe_records']} of {probe} records: "
                           + "; ".join(_wrong(run_dir)))

        # a checkpoint after the probe (the savepoint then finds about one interval's
        # changes, as in a running job), then pyflink-ndb's metrics (pushed to Flink at
        # each checkpoint notification, fetched by REST every second)
        def checkpointed() -> bool:
            return any(h["status"] == "COMPLETED" and not h.get("is_savepoint")
                       and h["trigger_timestamp"] / 1000 > probe_seen
                       for h in rest_get(port, f"/jobs/{job_id}/checkpoints")["history"])
        _wait(checkpointed, 120 + keys / 2000, "a checkpoint after the probe", client)
        if restore_mode is not None:
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                time.sleep(1.0)
                try:
                    out["metrics"] = ndb_metrics(port, job_id)
                except Exception as err:  # a nice-to-have
                    out["metrics"] = {"error": str(err)[:200]}
                if out["metrics"].get("storeReads"):
                    break

        # checkpoint statistics (the job's history spans both attempts)
        stats = checkpoint_stats(port, job_id)
        overview = rest_get(port, f"/jobs/{job_id}/checkpoints")
        restored = (overview.get("latest") or {}).get("restored") or {}
        out["restored_checkpoint"] = restored.get("id")
        sizes = {c["id"]: c for c in stats["checkpoints"]}
        if restored.get("id") in sizes:
            out["restored_state_size"] = sizes[restored["id"]]["state_size"]
            out["restored_checkpointed_size"] = sizes[restored["id"]]["checkpointed_size"]
        build_cps = [c for c in stats["checkpoints"]
                     if build_first <= c["trigger_ms"] / 1000 and c["id"] <= covering["id"]]
        out["build_checkpoints"] = _checkpoint_summary(build_cps)
        cov = sizes.get(covering["id"])
        if cov:
            out["covering_sync_max_ms"] = max((s["sync_ms"] for s in cov["subtasks"]),
                                              default=None)
        out["checkpoints"] = stats["checkpoints"]
        out["checkpoint_counts"] = stats["counts"]
        out["failed_checkpoints"] = [
            {"id": h["id"], "message": (h.get("failure_message") or "")[:200]}
            for h in overview["history"] if h["status"] == "FAILED"]

        # 5. savepoints
        savepoints: list[tuple[str, str]] = []
        if kind == "rocksdb":
            t = time.monotonic()
            path = str(client._j_job_client.triggerSavepoint(
                (folder / "savepoint-native").as_uri(), _savepoint_format("NATIVE")).get())
            out["savepoint_native_s"] = time.monotonic() - t
            savepoints.append(("native", path))
        t = time.monotonic()
        path = str(client._j_job_client.stopWithSavepoint(
            False, (folder / "savepoint-canonical").as_uri(),
            _savepoint_format("CANONICAL")).get())
        out["savepoint_canonical_s"] = time.monotonic() - t
        savepoints.insert(0, ("canonical", path))
        job_until = time.time()
        out["java_peak_sampled_kb"] = sampler.peak_kb(submitted, job_until)
        out["java_hwm_job_kb"] = proc_status_kb(jvm, "VmHWM")
        out["savepoint_bytes"] = {
            fmt: sum(f.stat().st_size for f in Path(p.removeprefix("file:")).rglob("*")
                     if f.is_file()) for fmt, p in savepoints}
    except BaseException:
        _cancel(client)
        raise
    # pyflink-ndb's own lines of the job
    if restore_mode is not None:
        durable = []
        for t, line in flink_log_events(submitted):
            m = _DURABLE.search(line)
            if m and m.group(1) == OPERATOR and t <= job_until:
                durable.append({"t_s": t - submitted, "subtask": int(m.group(2)),
                                "checkpoint": int(m.group(3)), "entries": int(m.group(4)),
                                "bytes": int(m.group(6)), "write_ms": int(m.group(7))})
        out["durable"] = durable
        out["bytes_written_build"] = sum(d["bytes"] for d in durable
                                         if d["checkpoint"] <= covering["id"])
        out["store_bytes"] = store_size(kind, url, namespace)
    out["rescale"] = {}
    for fmt, path in savepoints:
        out["rescale"][fmt] = rescale_run(kind, fmt, path, folder, keys, probe, extra,
                                          options, sampler)
    sampler.stopped.set()
    out["java_hwm_kb"] = proc_status_kb(jvm, "VmHWM")
    if restore_mode is not None and not keep_state:
        drop_namespace(url, namespace)
    if not keep_state:
        for sub in ("checkpoints", "savepoint-native", "savepoint-canonical"):
            shutil.rmtree(folder / sub, ignore_errors=True)
    errors = [r["error"] for r in out["rescale"].values() if "error" in r]
    if errors:
        out["error"] = "; ".join(errors)
    out["child_s"] = time.monotonic() - started
    return out


def child() -> None:
    """Entry point of a run's own process: `python -c "from bench.recovery import child;
    child()" '<json arguments>'`; writes the result to the arguments' `result` file (or
    `{"error": ...}` when the run failed)."""
    args = json.loads(sys.argv[1])
    result_path = Path(args.pop("result"))
    try:
        result = run_backend(**args)
    except RunError as err:
        result = {"error": str(err)}
    result_path.write_text(json.dumps(result))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the JVM's non-daemon threads would keep the process


# -- the part (the bench process) ------------------------------------------------------------
def scaling_s(run: Mapping[str, Any]) -> float | None:
    """Seconds of a run that grow with the keys: the build, build end → covering
    checkpoint, the restores (INITIALIZING → RUNNING) and the savepoints."""
    if not _ok(run):
        return None
    total = run["build_s"] + run["build_end_to_covering_s"]
    total += (run.get("failure_timeline") or {}).get("restore_max_s") or 0.0
    total += sum(run.get(f"savepoint_{fmt}_s") or 0.0 for fmt in ("canonical", "native"))
    total += sum((r.get("timeline") or {}).get("restore_max_s") or 0.0
                 for r in (run.get("rescale") or {}).values())
    return total


def _estimate(done: Mapping[int, tuple[float, float | None]], n: int) -> float:
    """A backend's seconds at `n` keys from its largest size run: that run's time plus its
    size-dependent part (:func:`scaling_s`) scaled linearly in the keys (or, when that
    run failed, its time scaled linearly)."""
    largest = max(done)
    total, scaling = done[largest]
    if scaling is None:
        return total * max(1.0, n / largest)
    return total + scaling * max(0.0, n / largest - 1)


def plan_size(requested: int, done: Mapping[str, Mapping[int, tuple[float, float | None]]],
              backends: Sequence[str], remaining_s: float,
              last_size: int) -> tuple[int | None, str, dict[str, float]]:
    """The size to run instead of `requested` (None: none fits), why, and the estimate per
    backend (seconds, :data:`ESTIMATE_MARGIN` included)."""
    def estimate(n: int) -> dict[str, float]:
        return {b: ESTIMATE_MARGIN * _estimate(done[b], n) for b in backends if done.get(b)}

    for n in (requested, *[s for s in FALLBACK_SIZES if last_size < s < requested]):
        est = estimate(n)
        total, worst = sum(est.values()), max(est.values(), default=0.0)
        if total <= remaining_s and worst <= MAX_BACKEND_S:
            if n == requested:
                return n, "", est
            full = estimate(requested)
            return n, (f"{requested:,} keys not run: estimated {sum(full.values()) / 60:.0f} "
                       f"min for the {len(full)} backends (slowest "
                       f"{max(full.values()) / 60:.1f} min; each backend's {last_size:,}-key "
                       "run with its build, covering checkpoint, restores and savepoints "
                       f"scaled linearly, ×{ESTIMATE_MARGIN}), over the "
                       f"{remaining_s / 60:.0f} min left of the time budget or "
                       f"{MAX_BACKEND_S / 60:.0f} min per backend; {n:,} keys instead "
                       f"(estimated {total / 60:.1f} min)"), est
    full = estimate(requested)
    return None, (f"{requested:,} keys not run: estimated {sum(full.values()) / 60:.0f} min "
                  f"for the {len(full)} backends, and no size between {last_size:,} and "
                  f"{requested:,} fits the {remaining_s / 60:.0f} min left"), full


def code_version() -> str:
    """HEAD's short hash and, when pyflink_ndb/ or java-bridge/ differ from it, a hash of
    that diff (another engineer may change the package while the part runs)."""
    import hashlib as _hashlib

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
        diff = subprocess.run(["git", "diff", "HEAD", "--", "pyflink_ndb", "java-bridge"],
                              cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (f" +diff {_hashlib.sha1(diff).hexdigest()[:8]}" if diff else "")


def bench_recovery(mysql_url: str, prefix: str, work: Path, sizes: Sequence[int],
                   keys: Sequence[str], budget_s: float = 33 * 60, probe: int = PROBE,
                   log: Callable[[str], None] = print, keep_state: bool = False,
                   flink_conf: dict[str, str] | None = None,
                   failure_delay_s: float = 0.0, quiet_failure: bool = False
                   ) -> dict[str, Any]:
    """Part 8: the recovery run of each backend of `keys` at each size of `sizes` (in
    increasing order; see :func:`plan_size`), each in a process of its own
    (:func:`bench.profile.run_child`). While one runs, the load average is sampled every
    2 s and other developers' jobs about every 10 s."""
    from bench.profile import other_jobs, run_child

    started = time.monotonic()
    out: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M"), "probe": probe, "parallelism": PARALLELISM,
        "rescale_parallelism": RESCALE_PARALLELISM, "payload_chars": PAYLOAD_CHARS,
        "requested_sizes": list(sizes), "sizes": [], "budget_s": budget_s,
        "model_bandwidths": list(MODEL_BANDWIDTHS), "model_rtt_s": MODEL_RTT_S,
        "flink_conf": flink_conf or {}, "failure_delay_s": failure_delay_s,
        "quiet_failure": quiet_failure, "notes": [],
        "runs": {}}
    times: dict[str, dict[int, tuple[float, float | None]]] = {}
    for index, requested in enumerate(sorted(sizes)):
        n: int | None = requested
        if index >= 2 or (index == 1 and requested > 20 * min(sizes)):
            remaining = budget_s - (time.monotonic() - started)
            n, why, est = plan_size(requested, times, keys, remaining,
                                    out["sizes"][-1] if out["sizes"] else 0)
            out.setdefault("estimates", {})[str(requested)] = est
            if why:
                out["notes"].append(why)
                log(f"recovery: {why}")
            if n is None:
                continue
        assert n is not None
        out["sizes"].append(n)
        for key in keys:
            if time.monotonic() - started > OVERRUN * budget_s:
                note = (f"{_BY_KEY[key][1]} at {n:,} keys not run: the part had used "
                        f"{(time.monotonic() - started) / 60:.0f} min of its "
                        f"{budget_s / 60:.0f}-min budget")
                out["notes"].append(note)
                log(f"recovery: {note}")
                continue
            folder = work / "recovery-rescale" / f"{key}-{n}"
            shutil.rmtree(folder, ignore_errors=True)
            result = folder / "result.json"
            args = {"key": key, "keys": n, "mysql_url": mysql_url, "prefix": prefix,
                    "work": str(folder / "work"), "result": str(result), "probe": probe,
                    "keep_state": keep_state, "flink_conf": flink_conf or {},
                    "failure_delay_s": failure_delay_s, "quiet_failure": quiet_failure}
            others = other_jobs()
            load_before = os.getloadavg()
            code_at_start = code_version()
            log(f"recovery: {_BY_KEY[key][1]}, {n:,} keys (load {load_before[0]:.2f}"
                + (f"; other jobs: {len(others)}" if others else "") + ")")
            t0 = time.monotonic()
            returncode, loads, seen = run_child("bench.recovery", args, folder, 600 + n / 400,
                                                poll_s=2, jobs_every_s=10)
            if not result.exists():
                tail = (folder / "child.log").read_text(errors="replace").strip().splitlines()
                run: dict[str, Any] = {"error": f"exit {returncode}: " + " | ".join(tail[-5:])}
            else:
                run = json.loads(result.read_text())
            run.update(key=key, label=_BY_KEY[key][1], keys=n, code=code_at_start,
                       loadavg_before=load_before,
                       loadavg_after=os.getloadavg(), loadavg_max=max([load_before[0], *loads]),
                       other_jobs=sorted(seen.union(others)), process_s=time.monotonic() - t0)
            out["runs"][f"{key}/{n}"] = run
            times.setdefault(key, {})[n] = (run["process_s"], scaling_s(run))
            if "failure_to_first_s" in run:
                rs = run.get("rescale", {})
                log(f"  build {run['build_records_per_s']:,.0f} records/s; failure → first "
                    f"record {run['failure_to_first_s']:.2f} s, → probe end "
                    f"{run['failure_to_probe_end_s']:.2f} s; rescale submit → probe end "
                    + ", ".join(f"{fmt} {r.get('submit_to_probe_end_s', float('nan')):.2f} s"
                                for fmt, r in rs.items())
                    + f"; JVM peak {(run.get('java_hwm_kb') or 0) / 1024:,.0f} MiB; "
                    f"{run['process_s']:.0f} s")
            if "error" in run:
                log(f"  failed: {run['error'][:300]}")
    derive(out)
    out["code"] = sorted({r.get("code", "unknown") for r in out["runs"].values()})
    out["elapsed_s"] = time.monotonic() - started
    return out


# -- derived figures -------------------------------------------------------------------------
def rescale_total(run: Mapping[str, Any], fmt: str) -> float | None:
    """Stop-with-savepoint (or, native, the triggered savepoint) + submit → probe end of
    the rescaled job."""
    r = run.get("rescale", {}).get(fmt)
    s = run.get(f"savepoint_{fmt}_s")
    if not r or s is None or "submit_to_probe_end_s" not in r:
        return None
    return s + r["submit_to_probe_end_s"]


def _ok(run: Mapping[str, Any]) -> bool:
    return "failure_to_first_s" in run


def derive(out: dict[str, Any]) -> None:
    """Ratios to the best RocksDB configuration per size, the remote-storage model and the
    issue's targets (reported, never enforced)."""
    runs = out["runs"]
    for n in out["sizes"]:
        rocks = [r for k, r in runs.items() if k.endswith(f"/{n}") and
                 r["key"].startswith("rocksdb") and _ok(r)]
        best: dict[str, float] = {}
        for metric in ("failure_to_first_s", "failure_to_probe_end_s"):
            if rocks:
                best[metric] = min(r[metric] for r in rocks)
        totals = [(rescale_total(r, fmt), f"{r['label']}, {fmt}") for r in rocks
                  for fmt in ("canonical", "native")]
        totals = [t for t in totals if t[0] is not None]
        if totals:
            best["rescale_s"], out.setdefault("best_rescale", {})[str(n)] = min(totals)
        if rocks:
            best["build_records_per_s"] = max(r["build_records_per_s"] for r in rocks)
        out.setdefault("best_rocksdb", {})[str(n)] = best
        for r in runs.values():
            if r.get("keys") != n or not _ok(r):
                continue
            ratios = {}
            for metric in ("failure_to_first_s", "failure_to_probe_end_s",
                           "build_records_per_s"):
                if best.get(metric):
                    ratios[metric] = r[metric] / best[metric]
            mine = [t for t in (rescale_total(r, f) for f in ("canonical", "native"))
                    if t is not None]
            if mine and best.get("rescale_s"):
                r["rescale_best_s"] = min(mine)
                ratios["rescale_s"] = min(mine) / best["rescale_s"]
            r["ratios"] = ratios
            # The model: what a remote checkpoint store would add to the restore.
            model: dict[str, Any] = {}
            if r["key"].startswith(("hashmap", "rocksdb")):
                size = r.get("restored_state_size") or r.get("covering_state_size") or 0
                model["restore_bytes"] = size
                for bw in out["model_bandwidths"]:
                    model[f"failure_to_first_s@{bw:.0e}"] = r["failure_to_first_s"] + size / bw
                    model[f"failure_to_probe_end_s@{bw:.0e}"] = (
                        r["failure_to_probe_end_s"] + size / bw)
                    for fmt, sp in (r.get("savepoint_bytes") or {}).items():
                        total = rescale_total(r, fmt)
                        if total is not None:
                            # the savepoint is written and read across the network
                            model[f"rescale_s@{bw:.0e}/{fmt}"] = total + 2 * sp / bw
            else:
                model["restore_bytes"] = r.get("restored_state_size") or 0
                distinct = len(set(probe_plan(n, out["probe"], 1)[0]))
                model["probe_distinct_keys"] = distinct
                # each point read of the store pays one round trip (at most one per
                # distinct probed key), the subtasks in parallel
                reads = (r.get("metrics") or {}).get("storeReads")
                model["probe_store_reads"] = reads
                model["probe_rtt_added_s"] = (distinct if reads is None else min(
                    reads, distinct)) * out["model_rtt_s"] / r["parallelism"]
            r["model"] = model
    # targets (issue 9), per pyflink-ndb backend
    sizes = out["sizes"]
    targets: dict[str, Any] = {}
    if sizes:
        small, large = sizes[0], sizes[-1]
        for key in {r["key"] for r in runs.values() if r["key"].startswith("ndb")}:
            a, b = runs.get(f"{key}/{small}"), runs.get(f"{key}/{large}")
            t: dict[str, Any] = {}
            best_large = out["best_rocksdb"].get(str(large), {})
            if a and b and _ok(a) and _ok(b):
                growth = b["failure_to_first_s"] / a["failure_to_first_s"]
                t["first_record"] = {
                    "growth": growth, "vs_rocksdb": b.get("ratios", {}).get("failure_to_first_s"),
                    "met": None if "failure_to_first_s" not in best_large else (
                        growth <= 1.2 and b["failure_to_first_s"]
                        <= best_large["failure_to_first_s"])}
            per_size = {str(n): runs.get(f"{key}/{n}", {}).get("ratios", {}) for n in sizes}
            pe = [v.get("failure_to_probe_end_s") for v in per_size.values()]
            t["probe_end"] = {"ratios": [p for p in pe if p is not None],
                              "met": None if None in pe else all(p <= 1.5 for p in pe)}
            rs = [v.get("rescale_s") for v in per_size.values()]
            t["rescale"] = {"ratios": [p for p in rs if p is not None],
                            "met": None if None in rs else all(p <= 1.0 for p in rs)}
            targets[key] = t
    out["targets"] = targets


# -- report -----------------------------------------------------------------------------------
def _s(v: float | None, fmt: str = "{:.2f}") -> str:
    return "–" if v is None else fmt.format(v)


def _x(v: float | None) -> str:
    return "" if v is None else f" ({v:.2f}×)"


def _mb(b: float | None) -> str:
    if b is None:
        return "–"
    return f"{b / 1e6:,.0f} MB" if b >= 10e6 else f"{b / 1e6:,.1f} MB" if b >= 1e5 else \
        f"{b / 1e3:,.0f} kB"


def _mib(kb: int | None) -> str:
    return "–" if kb is None else f"{kb / 1024:,.0f}"


def _load(run: Mapping[str, Any]) -> str:
    if "loadavg_before" not in run:
        return "–"
    quiet = ("" if "quiet_wait_s" not in run else
             f"; waited {run['quiet_wait_s']:.1f} s for a quiet database"
             + (" and gave up" if run.get("quiet_timed_out") else "")
             + f" ({run['database_cpus_at_failure']:.2f} CPU at the failure)")
    return (f"{run['loadavg_before'][0]:.1f} / {run['loadavg_after'][0]:.1f} "
            f"(max {run['loadavg_max']:.1f}){quiet}")


def markdown(r: dict[str, Any]) -> list[str]:
    """The part's section of summary.md (README-ready tables)."""
    runs = r["runs"]
    order = [b[0] for b in BACKENDS]
    rows = sorted(runs.values(), key=lambda x: (x["keys"], order.index(x["key"])))
    lines = ["## 8. Recovery and rescale (issue 9, workload c)", "",
             f"{r['when']}. One continuous job per backend and size in a fresh process and "
             f"JVM: a sequence source (parallelism 1) builds N keys × a ValueState of "
             f"{PAYLOAD_CHARS:,}-character payload (base64 of pseudo-random bytes: RocksDB's "
             "compression gains little, as on real data) and a count (about 1 KB pickled) on "
             f"the keyed function at parallelism {r['parallelism']}, checkpoints every "
             "second to a local folder, 1 GB managed memory; "
             + ("right after" if not r.get("failure_delay_s")
                else f"{r['failure_delay_s']:.0f} s after")
             + " a checkpoint covering every key completed"
             + (" and the database server is quiet (under "
                f"{QUIET_CPUS} CPU over {QUIET_WINDOW_S:.0f} s, at most "
                f"{QUIET_MAX_WAIT_S:.0f} s; it shares this machine's CPUs with the "
                "TaskManager, which RonDB's data nodes do not; applied to every backend)"
                if r.get("quiet_failure") else "")
             + ", the keyed function raises "
             "(failure: the time it raised; restart strategy fixed-delay, 0 s) and the "
             f"restarted job reads and rewrites {r['probe']:,} random existing keys, each "
             "checked against the value it must hold. Then stop-with-savepoint "
             "(canonical; Flink RocksDB also a native savepoint, triggered while the job "
             f"runs) and a new job restores it at parallelism {r['rescale_parallelism']} "
             f"and probes {r['probe']:,} other random keys. Lower is better for every "
             "duration. × RocksDB: to the best Flink RocksDB configuration of the same "
             "size (fastest of full/incremental; for the rescale, of the four "
             "configuration × format pairs). Checkpoint figures: Flink's REST API, "
             "checkpoints of the build (up to the covering one), per subtask of the keyed "
             "vertex for sync. Peak RSS: the JVM's VmHWM over the whole run (JobManager, "
             "TaskManager, the embedded CPython of thread mode, RocksDB's native memory; "
             "not the MariaDB server)."
             + ("" if not r.get("flink_conf") else " Variant: Flink configuration "
                + ", ".join(f"`{k}: {v}`" for k, v in r["flink_conf"].items()) + "."), ""]
    for note in r.get("notes", []):
        lines += [f"**Sizes:** {note}.", ""]
    lines += ["| keys | backend | build records/s | build checkpoints: end-to-end ms median / "
              "max | sync ms median / max | covering checkpoint: state size, build end → "
              "completed s | failure → restarted tasks deployed s | restore (INITIALIZING → "
              "RUNNING) s | failure → first record s | failure → probe end s | JVM peak RSS "
              "MiB | load before / after |",
              "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in rows:
        if not _ok(run):
            lines.append(f"| {run['keys']:,} | {run['label']} | failed: "
                         f"{run.get('error', '?')[:160]} | | | | | | | | | {_load(run)} |")
            continue
        bc, ratios = run.get("build_checkpoints", {}), run.get("ratios", {})
        size = run.get("covering_state_size")
        restore = (run.get("failure_timeline") or {}).get("restore_max_s")
        deployed = (run.get("failure_timeline") or {}).get("initializing_s")
        lines.append(
            f"| {run['keys']:,} | {run['label']} | {run['build_records_per_s']:,.0f} "
            f"| {_s(bc.get('e2e_median_ms'), '{:,.0f}')} / {_s(bc.get('e2e_max_ms'), '{:,.0f}')} "
            f"| {_s(bc.get('sync_median_ms'), '{:,.1f}')} / {_s(bc.get('sync_max_ms'), '{:,.0f}')} "
            f"| {_mb(size)}"
            + (f" + {_mb(run['bytes_written_build'])} written to the store"
               if run.get("bytes_written_build") else "")
            + f", {run['build_end_to_covering_s']:.1f} "
            f"| {_s(deployed)} | {_s(restore)} "
            f"| {run['failure_to_first_s']:.2f}{_x(ratios.get('failure_to_first_s'))} "
            f"| {run['failure_to_probe_end_s']:.2f}{_x(ratios.get('failure_to_probe_end_s'))} "
            f"| {_mib(run.get('java_hwm_kb'))} | {_load(run)} |")
    lines += ["", f"Rescale: stop-with-savepoint at parallelism {r['parallelism']}, a new job "
              f"restores it at {r['rescale_parallelism']} (submit: the client builds the job "
              "graph and starts a MiniCluster, about the same for every backend).", "",
              "| keys | backend | savepoint format | savepoint size | savepoint s | submit → "
              "first record s | submit → probe end s | savepoint + probe end s |",
              "|---:|---|---|---:|---:|---:|---:|---:|"]
    for run in rows:
        if not _ok(run):
            continue
        for fmt, rs in run.get("rescale", {}).items():
            total = rescale_total(run, fmt)
            best = min((t for t in (rescale_total(run, f) for f in run["rescale"])
                        if t is not None), default=None)
            ratio = run.get("ratios", {}).get("rescale_s") if total == best else None
            err = f" (failed: {rs['error'][:80]})" if "error" in rs else ""
            lines.append(
                f"| {run['keys']:,} | {run['label']} | {fmt}"
                + (" (triggered)" if fmt == "native" else "")
                + f" | {_mb((run.get('savepoint_bytes') or {}).get(fmt))} "
                f"| {_s(run.get(f'savepoint_{fmt}_s'))} | {_s(rs.get('submit_to_first_s'))} "
                f"| {_s(rs.get('submit_to_probe_end_s'))}{err} | {_s(total)}{_x(ratio)} |")
    bws = r["model_bandwidths"]
    lines += ["", "**Model, not measured**: restore from a remote checkpoint store at "
              + " and ".join(f"{bw / 1e6:,.0f} MB/s" for bw in bws) + " per TaskManager: "
              "the measured time + the restored checkpoint's full state size (Flink's "
              "`state_size`, also for incremental checkpoints: a restore downloads every "
              "file it references) / bandwidth, all of it on one TaskManager as in this "
              "MiniCluster (with T TaskManagers each downloads about 1/T); rescale: + the "
              "savepoint written and read once each. pyflink-ndb's Flink checkpoint holds "
              "only its tokens: its restore transfers nothing up front; instead each "
              "probed key is a point read from the database, which here is on loopback: "
              f"the last column adds {r['model_rtt_s'] * 1000:.1f} ms of network round trip "
              "per distinct probed key (subtasks in parallel).", "",
              "| keys | backend | restored state | failure → first record s | failure → "
              "probe end s | savepoint + rescaled probe end s | lazy reads at "
              f"{r['model_rtt_s'] * 1000:.1f} ms RTT: failure → probe end s |",
              "|---:|---|---:|---:|---:|---:|---:|"]
    for run in rows:
        m = run.get("model")
        if not m:
            continue
        if "probe_rtt_added_s" in m:
            rtt = ("– (embedded)" if run["key"].startswith("ndb-sqlite") else
                   f"{run['failure_to_probe_end_s'] + m['probe_rtt_added_s']:.2f}")
            lines.append(f"| {run['keys']:,} | {run['label']} | {_mb(m['restore_bytes'])} "
                         f"(tokens) | {run['failure_to_first_s']:.2f} (+0) "
                         f"| {run['failure_to_probe_end_s']:.2f} (+0) | – | {rtt} |")
            continue
        cells = []
        for metric in ("failure_to_first_s", "failure_to_probe_end_s"):
            cells.append(" / ".join(_s(m.get(f"{metric}@{bw:.0e}")) for bw in bws))
        resc = []
        for bw in bws:
            vals = [m[k] for k in m if k.startswith(f"rescale_s@{bw:.0e}/")]
            resc.append(_s(min(vals) if vals else None))
        lines.append(f"| {run['keys']:,} | {run['label']} | {_mb(m['restore_bytes'])} "
                     f"| {cells[0]} | {cells[1]} | {' / '.join(resc)} | – |")
    if r.get("targets"):
        sizes = r["sizes"]
        lines += ["", f"Targets (issue 9; reported, not enforced), smallest size "
                  f"{sizes[0]:,}, largest {sizes[-1]:,}:", ""]
        def verdict(met: bool | None) -> str:
            return "no RocksDB run to compare" if met is None else "met" if met else "not met"
        for key in [b[0] for b in BACKENDS if b[0] in r["targets"]]:
            t = r["targets"][key]
            fr = t.get("first_record")
            parts = []
            if fr:
                parts.append(f"failure → first record at {sizes[-1]:,} = {fr['growth']:.2f}× "
                             f"the {sizes[0]:,} case, {_s(fr['vs_rocksdb'])}× RocksDB: "
                             + verdict(fr["met"]))
            parts.append("failure → probe end ≤ 1.5× RocksDB ("
                         + ", ".join(f"{x:.2f}×" for x in t["probe_end"]["ratios"]) + "): "
                         + verdict(t["probe_end"]["met"]))
            parts.append("rescale ≤ RocksDB at every size ("
                         + ", ".join(f"{x:.2f}×" for x in t["rescale"]["ratios"]) + "): "
                         + verdict(t["rescale"]["met"]))
            lines.append(f"* {_BY_KEY[key][1]}: " + "; ".join(parts))
    notes = []
    for run in rows:
        ft = run.get("failure_timeline") or {}
        pre = ft.get("prefetched") or []
        if run.get("restore_mode") == "background" and not pre and _ok(run):
            notes.append(f"{run['label']}, {run['keys']:,} keys: the background prefetch was "
                         "still running when the probe ended")
        if pre:
            notes.append(f"{run['label']}, {run['keys']:,} keys: background prefetch of "
                         f"{sum(p['entries'] for p in pre):,} entries done "
                         f"{max(p['t_s'] for p in pre):.1f} s after the failure "
                         f"({max(p['s'] for p in pre):.1f} s per subtask)")
        if run.get("bytes_written_build"):
            notes.append(f"{run['label']}, {run['keys']:,} keys: the build's checkpoints wrote "
                         f"{_mb(run['bytes_written_build'])} of values to the store; its state "
                         f"table (every version, the JSON column, indexes"
                         + ("; SQLite: file and write-ahead log"
                            if run["key"].startswith("ndb-sqlite") else "; InnoDB")
                         + f") held {_mb(run.get('store_bytes'))} after the probe")
        # the checkpoint in flight when the failure came is aborted ("suspending"): expected
        failed = [f for f in run.get("failed_checkpoints") or []
                  if "Checkpoint Coordinator is suspending" not in f["message"]]
        if failed:
            notes.append(f"{run['label']}, {run['keys']:,} keys: {len(failed)} failed "
                         "checkpoints (" + "; ".join(sorted({f['message'][:80]
                                                             for f in failed})) + ")")
    disturbed = [run for run in rows if run.get("other_jobs")]
    if disturbed:
        commands = sorted({line.split(None, 1)[1][:80] for run in disturbed
                           for line in run["other_jobs"]})
        notes.append(f"other jobs on the machine during {len(disturbed)} of {len(rows)} runs "
                     "(see the load column): " + "; ".join(f"`{c}`" for c in commands[:6])
                     + (f" and {len(commands) - 6} more" if len(commands) > 6 else ""))
    if notes:
        lines += [""] + [f"* {n}" for n in notes]
    lines += ["", f"Part took {r.get('elapsed_s', 0) / 60:.1f} min; code: "
              + ", ".join(r.get("code") or ["unknown"]) + ".", ""]
    return lines


if __name__ == "__main__":
    # `python -m bench.recovery [BACKEND ...] [--quick] [--sizes N,N,...]`: the part alone.
    import click

    @click.command()
    @click.argument("keys", nargs=-1, type=click.Choice([b[0] for b in BACKENDS]))
    @click.option("--quick", is_flag=True,
                  help=f"10k and 20k keys, backends {', '.join(QUICK_BACKENDS)}.")
    @click.option("--sizes", default=None, metavar="N,N,...",
                  help="Keys per run (default 10000,100000,1000000; --quick 10000,20000).")
    @click.option("--mysql-url", default=os.environ.get("PYFLINK_NDB_TEST_MYSQL_URL",
                                                        "mysql://root@127.0.0.1:3306/test"))
    @click.option("--budget", type=float, default=33.0, show_default=True,
                  help="Minutes for the whole part: a size beyond the second whose estimate "
                       "does not fit is replaced by a smaller one (or left out).")
    @click.option("--probe", type=int, default=PROBE, show_default=True)
    @click.option("--failure-delay", type=float, default=0.0, show_default=True,
                  help="Seconds between the covering checkpoint and the injected failure.")
    @click.option("--quiet-failure/--no-quiet-failure", default=False, show_default=True,
                  help="Inject the failure once the database server is quiet too "
                       "(wait_for_quiet_database).")
    @click.option("--keep-state", is_flag=True,
                  help="Keep the namespaces, checkpoints and savepoints (default: drop them "
                       "after each run).")
    @click.option("--flink-conf", multiple=True, metavar="KEY=VALUE",
                  help="More Flink configuration for every backend (a variant).")
    @click.option("--work", type=click.Path(file_okay=False, path_type=Path),
                  default=ROOT / "var" / "bench-recovery", show_default=True)
    @click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
                  default=ROOT / "bench" / "results", show_default=True)
    @click.option("--render", type=click.Path(dir_okay=False, exists=True, path_type=Path),
                  default=None, help="Only print the markdown of a saved recovery.json.")
    def _main(keys: tuple[str, ...], quick: bool, sizes: str | None, mysql_url: str,
              budget: float, probe: int, failure_delay: float, quiet_failure: bool,
              keep_state: bool,
              flink_conf: tuple[str, ...], work: Path, out_dir: Path,
              render: Path | None) -> None:
        """Part 8 of `make bench` alone (issue 9, workload c): recovery and rescale on each
        BACKEND (default: all; --quick: one of each kind)."""
        if render is not None:
            saved = json.loads(render.read_text())
            derive(saved)
            click.echo("\n".join(markdown(saved)))
            return
        conf = dict(item.split("=", 1) for item in flink_conf)
        chosen = [int(s.replace("_", "")) for s in sizes.split(",")] if sizes else (
            [10_000, 20_000] if quick else [10_000, 100_000, 1_000_000])

        def log(message: str) -> None:
            click.echo(f"[recovery {time.strftime('%H:%M:%S')}] {message}", err=True)
        r = bench_recovery(mysql_url, "bench", work, chosen,
                           list(keys) or list(QUICK_BACKENDS if quick else _BY_KEY),
                           budget_s=budget * 60, probe=probe, log=log,
                           keep_state=keep_state, flink_conf=conf,
                           failure_delay_s=failure_delay, quiet_failure=quiet_failure)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "recovery.json").write_text(json.dumps(r, indent=2))
        text = "\n".join(markdown(r))
        (out_dir / "recovery.md").write_text(text + "\n")
        click.echo(text)

    _main()
