"""A breaker's attack on the refusal of Flink-backend keyed state by switched operators.

A switched operator (the job-wide switch, or `pyflink_ndb.process`) refuses a restore whose
snapshot holds keyed state of Flink's own backend for it (`StateCompatibilityError`, unless
`state.backend.ndb.restore.backend-change: ignore`). Attacked here, on real MiniCluster
jobs (thread mode) and MariaDB:

* false positives — a switched job's own snapshot must restore: timers (event-time, in
  RocksDB or on the heap) and windows (tumbling, session) on RocksDB with incremental
  checkpoints, after a failover and from a retained incremental checkpoint at another
  parallelism; the same on the changelog state backend; switched windows from their own
  savepoint on HashMap and RocksDB; in a job with two keyed operators, the one that was
  already on pyflink-ndb;
* false negatives — Flink-backend keyed state must never be dropped without a word: a
  changelog backend's checkpoint (its state only in the changelog, nothing materialized)
  and savepoint; `pyflink_ndb.process` over the same uid; a rescale, where every subtask
  must see the states, a subtask whose key-group range holds no key too; a restart
  strategy must not let a later attempt through; of two keyed operators, the one that
  was on Flink's backend; every other kind of operator the switch takes (keyed
  co-process, keyed broadcast, `reduce`, keyed `map` with open()).

Observed on the way: PyFlink 1.20's own session window operator (the switch off, without
pyflink-ndb too) fails every checkpoint (`ClassCastException: VoidNamespace cannot be cast
to TimeWindow`), so the switch-off jobs here leave sessions out.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from conftest import (
    append_to,
    drop_namespace,
    fixed_delay_restarts,
    thread_mode_env,
    unique_namespace,
)
from pyflink.common import Time, Types, WatermarkStrategy
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import (
    AggregateFunction,
    CheckpointingMode,
    KeyedProcessFunction,
    MapFunction,
    ProcessWindowFunction,
)
from pyflink.datastream.connectors.number_seq import NumberSequenceSource
from pyflink.datastream.functions import SinkFunction
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor
from pyflink.datastream.window import EventTimeSessionWindows, TumblingEventTimeWindows
from test_restores_across_jobs_flink import (
    RECORDS,
    Count,
    cancel,
    check,
    finish,
    job_checkpoints,
    job_settings,
    lines,
    ndb_options,
    run_until_checkpoint,
    snapshot_then_cancel,
    start,
)
from test_switch_from_flink_state_flink import FLINK_STATES, failure_text, savepoint_off

import pyflink_ndb

pytestmark = pytest.mark.flink
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MINUTE = 60_000
HOUR = 60 * MINUTE
REC = Types.TUPLE([Types.STRING(), Types.LONG(), Types.LONG()])
DISCARD = "org.apache.flink.streaming.api.functions.sink.DiscardingSink"
#: Flink's names and kinds of the timed job's keyed state (switch off).
TIMED_STATES = ("'n' (value)", "'hours' (map)")


def ts_of(i: int) -> int:
    """Event time of record i: a minute apart, and 3 hours more every 200 records (the
    sessions, gap 1 h, break there)."""
    return i * MINUTE + (i // 200) * 3 * HOUR


class Rec(MapFunction):
    def __init__(self, keys: int, ms: float) -> None:
        self.keys = keys
        self.ms = ms

    def map(self, i: Any) -> Any:
        if self.ms:
            time.sleep(self.ms / 1000)
        return (f"k{i % self.keys}", i, ts_of(i))


class TsOf(TimestampAssigner):
    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        return value[2]


class Timed(KeyedProcessFunction):
    """Per key a count (ValueState) and a MapState of records per hour; an event-time timer
    at the end of each record's hour (they fire at the end of input, the only watermark)
    reports the key's final count. `marker`: the first record after the file appears fails
    (once). `record`: open() appends (subtask, key groups, the Flink states the bridge
    found) of a switched subtask to that file."""

    def __init__(self, marker: str | None = None, record: str | None = None) -> None:
        self.marker = marker
        self.record = record

    def open(self, runtime_context: Any) -> None:
        self.n = runtime_context.get_state(ValueStateDescriptor("n", Types.LONG()))
        self.hours = runtime_context.get_map_state(
            MapStateDescriptor("hours", Types.LONG(), Types.LONG()))
        self.subtask = runtime_context.get_index_of_this_subtask()
        self.keys_seen: set[str] = set()
        backend = getattr(runtime_context, "backend", None)
        if self.record is not None and backend is not None:
            info = backend.info
            with open(self.record, "a") as f:
                f.write(repr(("bind", info.subtask_index, info.restored_checkpoint_id,
                              info.restored_flink_keyed_states)) + "\n")

    def process_element(self, value: Any, ctx: Any) -> Any:
        k, i, ts = value
        if self.marker is not None:
            try:
                os.remove(self.marker)
            except FileNotFoundError:
                pass
            else:
                raise RuntimeError(f"breaker: injected failure at record {i}")
        if self.record is not None and k not in self.keys_seen:
            self.keys_seen.add(k)
            with open(self.record, "a") as f:
                f.write(repr(("key", self.subtask, k)) + "\n")
        n = (self.n.value() or 0) + 1
        self.n.update(n)
        hour = ts // HOUR
        self.hours.put(hour, (self.hours.get(hour) or 0) + 1)
        ctx.timer_service().register_event_time_timer((hour + 1) * HOUR)
        yield repr(("rec", k, i, n, self.hours.get(hour)))

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield repr(("timer", ctx.get_current_key(), timestamp, self.n.value(),
                    self.hours.get(timestamp // HOUR - 1)))


class Contents(ProcessWindowFunction):
    def process(self, key: Any, context: Any, elements: Any) -> Any:
        yield repr(("tumble", key, context.window().start, tuple(sorted(e[1] for e in elements))))


class SumCount(AggregateFunction):
    def create_accumulator(self) -> Any:
        return (0, 0)

    def add(self, value: Any, acc: Any) -> Any:
        return (acc[0] + 1, acc[1] + value[1])

    def get_result(self, acc: Any) -> Any:
        return acc

    def merge(self, a: Any, b: Any) -> Any:
        return (a[0] + b[0], a[1] + b[1])


class SessionOut(ProcessWindowFunction):
    def process(self, key: Any, context: Any, elements: Any) -> Any:
        for acc in elements:
            yield repr(("session", key, context.window().start, context.window().end,
                        acc[0], acc[1]))


def start_timed(switched: bool, p: int, ns: str, url: str, path: Path, *, records: int,
                keys: int = 13, throttle_ms: float = 0.0, ckpt_dir: Path | None = None,
                restore: str | None = None, extra: dict[str, str] | None = None,
                marker: str | None = None, record: str | None = None,
                sessions: bool = True, name: str = "breaker-flinkstate") -> Any:
    """The timed job: `Timed` (uid timed), 2 h tumbling windows (uid tumble) and, with
    `sessions`, 1 h sessions (uid session) at keyed parallelism `p`; outputs appended to
    `path`. (PyFlink 1.20's own session window operator fails every checkpoint:
    `ClassCastException: VoidNamespace cannot be cast to TimeWindow`, its merging window
    set; a job with the switch off leaves it out.)"""
    settings = {"pipeline.auto-watermark-interval": "0",
                **job_settings(switched, ns, url, ckpt_dir=ckpt_dir, restore=restore,
                               extra=extra)}
    env = thread_mode_env(1, settings)
    env.enable_checkpointing(300, CheckpointingMode.EXACTLY_ONCE)
    src = env.from_source(NumberSequenceSource(0, records - 1),
                          WatermarkStrategy.no_watermarks(), "seq").uid("seq") \
        .set_parallelism(1) \
        .map(Rec(keys, throttle_ms), output_type=REC).uid("rec").set_parallelism(1) \
        .assign_timestamps_and_watermarks(
            WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(TsOf())) \
        .uid("wm").set_parallelism(1)
    keyed = src.key_by(lambda r: r[0], key_type=Types.STRING())
    timed = keyed.process(Timed(marker, record), output_type=Types.STRING()) \
        .uid("timed").set_parallelism(p)
    tumble = keyed.window(TumblingEventTimeWindows.of(Time.hours(2))) \
        .process(Contents(), Types.STRING()).uid("tumble").set_parallelism(p)
    session = keyed.window(EventTimeSessionWindows.with_gap(Time.hours(1))) \
        .aggregate(SumCount(), window_function=SessionOut(), output_type=Types.STRING()) \
        .uid("session").set_parallelism(p) if sessions else None
    outs = [tumble, session] if sessions else [tumble]
    timed.union(*outs).map(append_to(str(path)), Types.STRING()) \
        .set_parallelism(p).uid("append").add_sink(SinkFunction(DISCARD)).set_parallelism(p)
    return env.execute_async(f"{name}-{'switch' if switched else 'flink'}-p{p}")


def outputs(*paths: Path) -> list[tuple[Any, ...]]:
    return [o for path in paths for o in lines(path)]


def expected_end(records: int, keys: int = 13) -> Counter:
    """The outputs that only the end of input fires: timers, tumbling windows, sessions."""
    per_key: dict[str, list[int]] = defaultdict(list)
    for i in range(records):
        per_key[f"k{i % keys}"].append(i)
    want: Counter = Counter()
    for k, ids in per_key.items():
        hours = Counter(ts_of(i) // HOUR for i in ids)
        for hour, count in hours.items():
            want[("timer", k, (hour + 1) * HOUR, len(ids), count)] += 1
        tumble: dict[int, list[int]] = defaultdict(list)
        for i in ids:
            tumble[ts_of(i) // (2 * HOUR) * 2 * HOUR].append(i)
        for start_ms, members in tumble.items():
            want[("tumble", k, start_ms, tuple(sorted(members)))] += 1
        sessions: list[list[int]] = []
        for i in ids:
            if sessions and ts_of(i) <= ts_of(sessions[-1][-1]) + HOUR:
                sessions[-1].append(i)
            else:
                sessions.append([i])
        for s in sessions:
            want[("session", k, ts_of(s[0]), ts_of(s[-1]) + HOUR, len(s), sum(s))] += 1
    return want


def check_timed(out: list[tuple[Any, ...]], records: int, keys: int = 13) -> None:
    """Every per-record output exact and every record's there (duplicates of a replay
    are equal); the end-of-input outputs exactly once each."""
    hours_upto: dict[tuple[str, int], int] = Counter()
    want_rec = {}
    for i in range(records):
        k = f"k{i % keys}"
        hours_upto[(k, ts_of(i) // HOUR)] += 1
        want_rec[i] = ("rec", k, i, i // keys + 1, hours_upto[(k, ts_of(i) // HOUR)])
    recs = [o for o in out if o[0] == "rec"]
    wrong = [(o, want_rec[o[2]]) for o in recs if o != want_rec[o[2]]]
    assert not wrong, f"{len(wrong)} wrong of {len(recs)}, e.g. {wrong[:3]}"
    missing = sorted(set(want_rec) - {o[2] for o in recs})
    assert not missing, f"{len(missing)} records without output, e.g. {missing[:5]}"
    want = expected_end(records, keys)
    got = Counter(o for o in out if o[0] != "rec")
    for tag in ("timer", "tumble", "session"):
        w = Counter({o: c for o, c in want.items() if o[0] == tag})
        g = Counter({o: c for o, c in got.items() if o[0] == tag})
        assert w == g, (tag, sum(w.values()), sum(g.values()), list((w - g).items())[:3],
                        list((g - w).items())[:3])


def wait_for(what: str, cond: Any, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def changelog(tmp_path: Path, backend: str = "hashmap") -> dict[str, str]:
    """The changelog state backend over `backend`; restores in CLAIM mode (Flink refuses
    the first checkpoint after a NO_CLAIM restore: "does not support enforcing a full
    snapshot")."""
    return {"execution.state-recovery.claim-mode": "CLAIM", "state.backend.type": backend,
            "state.changelog.enabled": "true",
            "state.changelog.storage": "filesystem",
            "state.changelog.dstl.dfs.base-path": (tmp_path / "dstl").as_uri()}


INCREMENTAL = {"state.backend.type": "rocksdb", "execution.checkpointing.incremental": "true"}

OWN_RESTORE_BACKENDS = {
    "rocksdb-incremental": {**INCREMENTAL,
                            "state.backend.rocksdb.timer-service.factory": "ROCKSDB"},
    "rocksdb-incremental-heap-timers": {
        **INCREMENTAL, "state.backend.rocksdb.timer-service.factory": "HEAP"},
    "changelog-hashmap": "changelog-hashmap",
    "changelog-rocksdb": "changelog-rocksdb",
}


def backend_settings(name: str, tmp_path: Path) -> dict[str, str]:
    value = OWN_RESTORE_BACKENDS[name]
    if isinstance(value, str):
        return changelog(tmp_path, value.split("-")[1])
    return dict(value)


# ---------------------------------------------------------------- false positives


@pytest.mark.parametrize("backend", list(OWN_RESTORE_BACKENDS))
def test_switched_timers_and_windows_failover_then_retained_checkpoint_rescaled(
        backend, tmp_path, mysql_url):
    """The switched timed job (event-time timers, tumbling and session windows) at p 2 on
    `backend` fails once after its second checkpoint and Flink restores its own latest
    (incremental / changelog) checkpoint; it runs two more checkpoints and is cancelled.
    A new job restores that retained checkpoint at p 3 and runs to the end. Neither
    restore may be refused (they hold no keyed state of Flink's backend: timers only),
    and the union of outputs must be exact."""
    ns = unique_namespace("bfpt")
    ckpt = tmp_path / "ckpt"
    marker = tmp_path / "fail-now"
    records = 2600
    settings = {**backend_settings(backend, tmp_path), **fixed_delay_restarts(1, "500 ms")}
    try:
        a = start_timed(True, 2, ns, mysql_url, tmp_path / "a.txt", records=records,
                        throttle_ms=4.0, ckpt_dir=ckpt, extra=settings, marker=str(marker))
        try:
            run_until_checkpoint(a, ckpt, 2, tmp_path / "a.txt")
            marker.write_text("fail\n")
            wait_for("the injected failure", lambda: not marker.exists())
            failed_at = max(job_checkpoints(ckpt, a))
            run_until_checkpoint(a, ckpt, failed_at + 3, tmp_path / "a.txt")
        except BaseException:
            cancel(a)
            raise
        cancel(a)
        newest = job_checkpoints(ckpt, a)[max(job_checkpoints(ckpt, a))]
        b = start_timed(True, 3, ns, mysql_url, tmp_path / "b.txt", records=records,
                        ckpt_dir=ckpt, restore=str(newest), extra=settings)
        finish(b)
        assert not any(o[0] != "rec" for o in lines(tmp_path / "a.txt")), \
            "an end-of-input output in the cancelled run"
        first_b = min(o[2] for o in lines(tmp_path / "b.txt") if o[0] == "rec")
        assert first_b > 0, "B restored nothing"
        check_timed(outputs(tmp_path / "a.txt", tmp_path / "b.txt"), records)
    finally:
        drop_namespace(mysql_url, ns)


@pytest.mark.parametrize("backend,backend_b", [("hashmap", "hashmap"), ("rocksdb", "rocksdb"),
                                               ("rocksdb", "hashmap")])
def test_switched_windows_restore_their_own_savepoint(backend, backend_b, tmp_path,
                                                      mysql_url):
    """The switched timed job at p 2 on `backend` takes a savepoint mid-stream and is
    cancelled; the same job on `backend_b` (a canonical savepoint may change Flink's
    backend: the timers move) restores it (p 2) and runs to the end: not refused, exact."""
    ns = unique_namespace("bfps")
    ckpt = tmp_path / "ckpt"
    records = 2000
    extra = {"state.backend.type": backend}
    try:
        a = start_timed(True, 2, ns, mysql_url, tmp_path / "a.txt", records=records,
                        throttle_ms=4.0, ckpt_dir=ckpt, extra=extra)
        savepoint = snapshot_then_cancel(a, ckpt, 2, tmp_path / "a.txt", tmp_path / "sp")
        b = start_timed(True, 2, ns, mysql_url, tmp_path / "b.txt", records=records,
                        restore=savepoint, extra={"state.backend.type": backend_b})
        finish(b)
        first_b = min(o[2] for o in lines(tmp_path / "b.txt") if o[0] == "rec")
        assert first_b > 0, "B restored nothing"
        check_timed(outputs(tmp_path / "a.txt", tmp_path / "b.txt"), records)
    finally:
        drop_namespace(mysql_url, ns)


# ---------------------------------------------------------------- false negatives


def expect_refusal(client: Any, states: tuple[str, ...]) -> str:
    with pytest.raises(Exception) as failed:
        finish(client)
    text = failure_text(failed.value)
    assert "StateCompatibilityError" in text, text[-3000:]
    for state in states:
        assert state in text, (state, text[-3000:])
    return text


@pytest.mark.parametrize("delegate,snapshot", [("hashmap", "checkpoint"),
                                               ("hashmap", "savepoint"),
                                               ("rocksdb", "checkpoint")])
def test_changelog_backend_snapshot_of_flink_state_is_refused(delegate, snapshot, tmp_path,
                                                              mysql_url):
    """The Count job with the switch off on the changelog state backend (`delegate` under
    it; materialization every 10 minutes by default, so a checkpoint's keyed state lives
    only in the changelog) leaves a retained checkpoint or a savepoint; the same job with
    the switch on (changelog too) restores it and must fail naming the four states."""
    ns = unique_namespace("bfnc")
    ckpt = tmp_path / "ckpt"
    extra = changelog(tmp_path, delegate)
    try:
        a = start("flink", 1, ns, mysql_url, tmp_path / "a.txt", records=RECORDS,
                  throttle_ms=4.0, ckpt_dir=ckpt, extra=extra, name="bfnc")
        path = snapshot_then_cancel(a, ckpt, 3, tmp_path / "a.txt",
                                    tmp_path / "sp" if snapshot == "savepoint" else None)
        check(lines(tmp_path / "a.txt"), RECORDS, to_end=False)
        b = start("switch", 1, ns, mysql_url, tmp_path / "b.txt", records=RECORDS,
                  throttle_ms=0.0, restore=path, extra=extra, name="bfnc")
        expect_refusal(b, FLINK_STATES)
        assert not lines(tmp_path / "b.txt"), "a record was processed on lost state"
    finally:
        drop_namespace(mysql_url, ns)


def test_explicit_process_refuses_flink_savepoint_of_the_same_uid_every_attempt(
        tmp_path, mysql_url):
    """A savepoint of the Count job on Flink's HashMap backend (uid `count`), restored by
    the same job applied with `pyflink_ndb.process(..., uid="count")` under a restart
    strategy (2 restarts): every attempt restores the savepoint again, so the job must
    end failed with StateCompatibilityError naming the states, no record processed."""
    ns = unique_namespace("bfnp")
    try:
        savepoint = savepoint_off("hashmap", ns, mysql_url, tmp_path)
        b = start("process", 1, ns, mysql_url, tmp_path / "b.txt", records=RECORDS,
                  throttle_ms=0.0, restore=savepoint, name="from-flink",
                  extra=fixed_delay_restarts(2, "300 ms"))
        expect_refusal(b, FLINK_STATES)
        assert not lines(tmp_path / "b.txt"), "a record was processed on lost state"
    finally:
        drop_namespace(mysql_url, ns)


@pytest.mark.parametrize("backend,snapshot,p_old,p_new", [
    ("hashmap", "savepoint", 1, 3),
    ("rocksdb-incremental", "checkpoint", 3, 2),
    ("rocksdb-incremental", "checkpoint", 2, 2),
    ("rocksdb-incremental-heap-timers", "checkpoint", 1, 2),
])
def test_rescaled_flink_snapshot_every_subtask_sees_the_states(
        backend, snapshot, p_old, p_new, tmp_path, mysql_url):
    """The timed job with the switch off, one key only, at p `p_old` leaves a `snapshot`;
    restored switched at p `p_new` (some new subtask's key groups hold no key; from 3 -> 2
    an old subtask held none; 2 -> 2 restores RocksDB's incremental handles as they are).
    Default: the job fails naming the states. With `ignore` every switched subtask of
    `timed` must have been told the states (each restores its own handles' meta
    information), the keyless ones too."""
    ns = unique_namespace("bfnr")
    ckpt = tmp_path / "ckpt"
    records = 1200
    extra = ({**OWN_RESTORE_BACKENDS[backend]} if backend.startswith("rocksdb")
             else {"state.backend.type": backend})
    try:
        a = start_timed(False, p_old, ns, mysql_url, tmp_path / "a.txt", records=records,
                        keys=1, sessions=False, throttle_ms=4.0, ckpt_dir=ckpt, extra=extra)
        path = snapshot_then_cancel(a, ckpt, 3, tmp_path / "a.txt",
                                    tmp_path / "sp" if snapshot == "savepoint" else None)

        b = start_timed(True, p_new, ns, mysql_url, tmp_path / "b.txt", records=records,
                        keys=1, sessions=False, restore=path, extra=extra)
        text = expect_refusal(b, ())
        assert any(state in text for state in TIMED_STATES) or "window" in text, text[-3000:]
        assert not [o for o in lines(tmp_path / "b.txt") if o[0] == "rec"]

        record = tmp_path / "bind.txt"
        c = start_timed(True, p_new, ns, mysql_url, tmp_path / "c.txt", records=records,
                        keys=1, sessions=False, restore=path, record=str(record),
                        extra={**extra, "state.backend.ndb.restore.backend-change":
                               "ignore"})
        finish(c)
        seen = [r for r in lines(record) if r[0] == "bind"]
        assert sorted(r[1] for r in seen) == list(range(p_new)), seen
        for _, subtask, restored, states in seen:
            assert restored is not None, seen
            assert states is not None and {("n", "VALUE"), ("hours", "MAP")} <= set(states), \
                (subtask, states)
        with_keys = {r[1] for r in lines(record) if r[0] == "key"}
        assert with_keys and with_keys != set(range(p_new)), \
            f"every subtask met a key ({with_keys}): the keyless case was not tested"
    finally:
        drop_namespace(mysql_url, ns)


class RecordingCount(Count):
    """Count that appends (uid, subtask, the Flink states its bridge found) at open()."""

    def __init__(self, uid: str, record: str) -> None:
        super().__init__(None)
        self.uid = uid
        self.record = record

    def open(self, runtime_context: Any) -> None:
        super().open(runtime_context)
        backend = getattr(runtime_context, "backend", None)
        with open(self.record, "a") as f:
            f.write(repr((self.uid, runtime_context.get_index_of_this_subtask(),
                          None if backend is None else
                          backend.info.restored_flink_keyed_states)) + "\n")


def start_two(switched: bool, ns: str, url: str, tmp_path: Path, run: str, *,
              throttle_ms: float, ckpt_dir: Path | None = None, restore: str | None = None,
              extra: dict[str, str] | None = None) -> Any:
    """Two keyed operators on one keyed stream: `count` applied with
    `pyflink_ndb.process` (always on pyflink-ndb) and `count2`, a plain
    `KeyedStream.process` (Flink's backend unless `switched`). Outputs to
    {run}-count.txt / {run}-count2.txt; open() records to {run}-bind.txt."""
    from test_restores_across_jobs_flink import ROW, Throttle

    options = ndb_options(url, ns)
    env = thread_mode_env(1, job_settings(switched, ns, url, ckpt_dir=ckpt_dir,
                                          restore=restore, extra=extra))
    env.enable_checkpointing(300, CheckpointingMode.EXACTLY_ONCE)
    record = str(tmp_path / f"{run}-bind.txt")
    keyed = env.from_source(NumberSequenceSource(0, RECORDS - 1),
                            WatermarkStrategy.no_watermarks(), "seq").uid("seq") \
        .set_parallelism(1) \
        .map(Throttle(throttle_ms), output_type=ROW).uid("throttle").set_parallelism(1) \
        .key_by(lambda r: r[0], key_type=Types.STRING())
    one = pyflink_ndb.process(keyed, RecordingCount("count", record),
                              output_type=Types.STRING(), uid="count", options=options) \
        .set_parallelism(2)
    two = keyed.process(RecordingCount("count2", record), output_type=Types.STRING()) \
        .uid("count2").set_parallelism(2)
    for out, uid in ((one, "count"), (two, "count2")):
        out.map(append_to(str(tmp_path / f"{run}-{uid}.txt")), Types.STRING()) \
            .set_parallelism(2).uid(f"append-{uid}").add_sink(SinkFunction(DISCARD)) \
            .set_parallelism(2)
    return env.execute_async(f"breaker-two-{run}")


def test_two_keyed_operators_only_the_flink_one_is_refused(tmp_path, mysql_url):
    """Job A: `count` on pyflink-ndb (`pyflink_ndb.process`), `count2` on Flink's HashMap
    backend (switch off); savepoint. Job B, the switch on (`count2` switched now): fails
    naming the states. Job C, the same with `ignore`: `count` was told no Flink states
    (it never had any) and continues exactly from the savepoint; every `count2` subtask
    was told its four states and starts empty."""
    ns = unique_namespace("bfn2")
    ckpt = tmp_path / "ckpt"
    try:
        a = start_two(False, ns, mysql_url, tmp_path, "a", throttle_ms=4.0, ckpt_dir=ckpt)
        savepoint = snapshot_then_cancel(a, ckpt, 3, tmp_path / "a-count.txt",
                                         tmp_path / "sp")
        check(lines(tmp_path / "a-count.txt"), RECORDS, to_end=False)

        b = start_two(True, ns, mysql_url, tmp_path, "b", throttle_ms=0.0, restore=savepoint)
        expect_refusal(b, FLINK_STATES)
        assert not lines(tmp_path / "b-count2.txt")

        c = start_two(True, ns, mysql_url, tmp_path, "c", throttle_ms=0.0, restore=savepoint,
                      extra={"state.backend.ndb.restore.backend-change": "ignore"})
        finish(c)
        seen = lines(tmp_path / "c-bind.txt")
        assert sorted((s[0], s[1]) for s in seen) == [
            ("count", 0), ("count", 1), ("count2", 0), ("count2", 1)], seen
        for uid, subtask, states in seen:
            names = {name for name, _ in states or ()}
            if uid == "count":
                assert states == (), (uid, subtask, states)
            else:
                assert names == {"n", "seqs", "buckets", "prev"}, (uid, subtask, states)
        first_c = check(lines(tmp_path / "c-count.txt"), RECORDS)
        assert first_c > 0
        first_of_key: dict[str, tuple] = {}
        for o in lines(tmp_path / "c-count2.txt"):
            first_of_key.setdefault(o[0], o)
        assert all(o[2] == 1 for o in first_of_key.values()), first_of_key
    finally:
        drop_namespace(mysql_url, ns)


class MapCount(MapFunction):
    """A keyed map that overrides open() (so the switch takes it) and counts per key."""

    def open(self, runtime_context: Any) -> None:
        self.n = runtime_context.get_state(ValueStateDescriptor("map-count", Types.LONG()))

    def map(self, value: Any) -> Any:
        n = (self.n.value() or 0) + 1
        self.n.update(n)
        return repr((value[0], value[1], n))


def start_kind(kind: str, switched: bool, ns: str, url: str, path: Path, *,
               throttle_ms: float, ckpt_dir: Path | None = None,
               restore: str | None = None) -> Any:
    """One keyed operator of `kind` (uid `op`, p 2) over the Count job's source: `co`
    (keyed `connect(...).process`, KeyedCoProcessFunction), `bcast` (keyed
    `connect(broadcast).process`), `reduce` (`KeyedStream.reduce`), `map` (keyed `map`
    with open())."""
    from pyflink.common import Types as T
    from test_restores_across_jobs_flink import ROW, Throttle
    from test_switch_odd_keys_flink import BCAST, BcastCount, CoCount

    env = thread_mode_env(1, job_settings(switched, ns, url, ckpt_dir=ckpt_dir,
                                          restore=restore))
    env.enable_checkpointing(300, CheckpointingMode.EXACTLY_ONCE)
    src = env.from_source(NumberSequenceSource(0, RECORDS - 1),
                          WatermarkStrategy.no_watermarks(), "seq").uid("seq") \
        .set_parallelism(1) \
        .map(Throttle(throttle_ms), output_type=ROW).uid("throttle").set_parallelism(1)
    keyed = src.key_by(lambda r: r[0], key_type=T.STRING())
    if kind == "co":
        other = env.from_source(NumberSequenceSource(0, 10), WatermarkStrategy.no_watermarks(),
                                "other").uid("other").set_parallelism(1) \
            .map(lambda i: (f"k{i % 13}", i), output_type=ROW).uid("other-map")
        out = src.connect(other).key_by(lambda r: r[0], lambda r: r[0]) \
            .process(CoCount(), output_type=T.PICKLED_BYTE_ARRAY())
    elif kind == "bcast":
        rules = env.from_source(NumberSequenceSource(0, 2), WatermarkStrategy.no_watermarks(),
                                "rules").uid("rules").broadcast(BCAST)
        out = keyed.connect(rules).process(BcastCount(), output_type=T.PICKLED_BYTE_ARRAY())
    elif kind == "reduce":
        out = keyed.reduce(lambda a, b: (a[0], a[1] + b[1]))
    else:
        out = keyed.map(MapCount(), output_type=T.STRING())
    out.uid("op").set_parallelism(2).map(repr, T.STRING()).set_parallelism(2) \
        .map(append_to(str(path)), T.STRING()).set_parallelism(2).uid("append") \
        .add_sink(SinkFunction(DISCARD)).set_parallelism(2)
    return env.execute_async(f"breaker-kind-{kind}-{'switch' if switched else 'flink'}")


@pytest.mark.parametrize("kind,state", [("co", "'co-count' (value)"),
                                        ("bcast", "'b-count' (value)"),
                                        ("reduce", "'_reduce_state"),
                                        ("map", "'map-count' (value)")])
def test_other_switched_operator_kinds_refuse_flink_keyed_state(kind, state, tmp_path,
                                                                mysql_url):
    """Each other kind of operator the switch takes (keyed co-process, keyed broadcast,
    keyed reduce, keyed map with open()) runs with the switch off on HashMap and takes a
    savepoint; restored with the switch on, the job must fail naming its state."""
    ns = unique_namespace("bfnk")
    ckpt = tmp_path / "ckpt"
    try:
        a = start_kind(kind, False, ns, mysql_url, tmp_path / "a.txt", throttle_ms=4.0,
                       ckpt_dir=ckpt)
        savepoint = snapshot_then_cancel(a, ckpt, 2, tmp_path / "a.txt", tmp_path / "sp")
        b = start_kind(kind, True, ns, mysql_url, tmp_path / "b.txt", throttle_ms=0.0,
                       restore=savepoint)
        expect_refusal(b, (state,))
        assert not (tmp_path / "b.txt").exists() or not (tmp_path / "b.txt").read_text()
    finally:
        drop_namespace(mysql_url, ns)
