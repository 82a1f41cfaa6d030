"""Restores across jobs while garbage collection runs (retained checkpoints).

Real MiniCluster jobs (thread mode) on MariaDB. The job reads a deterministic sequence
0..N-1 (one source subtask, so records of a key arrive in order), keys record i by
k{i % KEYS}, and keeps per key a ValueState (count), a ListState (every seq), a MapState
(count per i % 3) and a TTL ValueState (the previous seq, 1 h TTL). Each record's output
is the state after it; whatever checkpoint a job restored, every output must equal what a
fresh run over 0..i computes for that key (`check`): a restore of the wrong checkpoint, a
lost or a doubled update shows in the first record of each key after the restore.
"""

from __future__ import annotations

import ast
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from conftest import append_to, drop_namespace, thread_mode_env, unique_namespace
from pyflink.common import Time, Types, WatermarkStrategy
from pyflink.datastream import CheckpointingMode, KeyedProcessFunction, MapFunction
from pyflink.datastream.connectors.number_seq import NumberSequenceSource
from pyflink.datastream.functions import SinkFunction
from pyflink.datastream.state import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)

import pyflink_ndb

pytestmark = pytest.mark.flink
cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = 13
ROW = Types.TUPLE([Types.STRING(), Types.LONG()])


class Throttle(MapFunction):
    def __init__(self, ms: float) -> None:
        self.ms = ms

    def map(self, i: Any) -> Any:
        if self.ms:
            time.sleep(self.ms / 1000)
        return (f"k{i % KEYS}", i)




class Count(KeyedProcessFunction):
    def __init__(self, fail_marker: str | None = None) -> None:
        self.fail_marker = fail_marker

    def open(self, runtime_context: Any) -> None:
        self.n = runtime_context.get_state(ValueStateDescriptor("n", Types.LONG()))
        self.seqs = runtime_context.get_list_state(ListStateDescriptor("seqs", Types.LONG()))
        self.buckets = runtime_context.get_map_state(
            MapStateDescriptor("buckets", Types.INT(), Types.LONG()))
        ttl = StateTtlConfig.new_builder(Time.hours(1)).build()
        prev = ValueStateDescriptor("prev", Types.LONG())
        prev.enable_time_to_live(ttl)
        self.prev = runtime_context.get_state(prev)

    def process_element(self, value: Any, ctx: Any) -> Any:
        k, i = value
        if self.fail_marker is not None:
            import os
            try:
                os.remove(self.fail_marker)
            except FileNotFoundError:
                pass
            else:
                raise RuntimeError(f"breaker: injected failure at record {i}")
        n = (self.n.value() or 0) + 1
        self.n.update(n)
        self.seqs.add(i)
        b = i % 3
        self.buckets.put(b, (self.buckets.get(b) or 0) + 1)
        before = self.prev.value()
        self.prev.update(i)
        seqs = list(self.seqs.get())
        yield repr((k, i, n, len(seqs), sum(seqs),
                    tuple(sorted(self.buckets.items())), before))


def build(env: Any, mode: str, p: int, options: dict[str, str], path: Path,
          records: int, throttle_ms: float, fail_marker: str | None = None,
          sink: Callable[[Any], Any] | None = None) -> None:
    """The job (module docstring); `sink` attaches the sink to the appended outputs
    (default: Flink's DiscardingSink at parallelism `p`)."""
    stream = env.from_source(NumberSequenceSource(0, records - 1),
                             WatermarkStrategy.no_watermarks(), "seq").uid("seq") \
        .set_parallelism(1) \
        .map(Throttle(throttle_ms), output_type=ROW).uid("throttle").set_parallelism(1)
    keyed = stream.key_by(lambda r: r[0], key_type=Types.STRING())
    if mode == "process":
        out = pyflink_ndb.process(keyed, Count(fail_marker), output_type=Types.STRING(),
                                  uid="count", options=options)
    else:  # "switch" (state.backend.ndb.enabled in the job's configuration) or "flink"
        out = keyed.process(Count(fail_marker), output_type=Types.STRING()).uid("count")
    appended = out.set_parallelism(p).map(append_to(str(path)), output_type=Types.STRING()) \
        .set_parallelism(p).uid("append")
    if sink is None:
        appended.add_sink(
            SinkFunction("org.apache.flink.streaming.api.functions.sink.DiscardingSink"))
    else:
        sink(appended)


def start(mode: str, p: int, ns: str, url: str, path: Path, *, records: int,
          throttle_ms: float, ckpt_dir: Path | None = None, retained: int = 2,
          restore: str | None = None, interval_ms: int = 300,
          extra: dict[str, str] | None = None, fail_marker: str | None = None,
          jars: Sequence[str] = (), sink: Callable[[Any], Any] | None = None,
          name: str = "breaker-restores") -> Any:
    """Submit the job (:func:`build`) in `mode` at parallelism `p`; `jars` go on the
    job's classpath before the job is built (a `sink` may use their classes)."""
    settings = job_settings(mode == "switch", ns, url, ckpt_dir=ckpt_dir, retained=retained,
                            restore=restore, extra=extra)
    env = thread_mode_env(1, settings)
    if jars:
        env.add_jars(*jars)
    env.enable_checkpointing(interval_ms, CheckpointingMode.EXACTLY_ONCE)
    build(env, mode, p, ndb_options(url, ns), path, records, throttle_ms, fail_marker, sink)
    return env.execute_async(f"{name}-{mode}-p{p}")


def ndb_options(url: str, ns: str) -> dict[str, str]:
    """The store, namespace and a cache of 4 entries (misses reach the store)."""
    return {"state.backend.ndb.url": url, "state.backend.ndb.namespace": ns,
            "state.backend.ndb.cache.max-entries": "4"}


def job_settings(switched: bool, ns: str, url: str, *, ckpt_dir: Path | None = None,
                 retained: int = 2, restore: str | None = None,
                 extra: dict[str, str] | None = None) -> dict[str, str]:
    """The Flink settings of these tests' jobs: `retained` checkpoints kept under
    `ckpt_dir` (and on cancellation), `restore` the snapshot to start from, the job-wide
    switch with :func:`ndb_options` when `switched`, then `extra` over all of it."""
    settings: dict[str, str] = {"execution.checkpointing.num-retained": str(retained)}
    if ckpt_dir is not None:
        settings["state.checkpoints.dir"] = ckpt_dir.as_uri()
        settings["execution.checkpointing.externalized-checkpoint-retention"] = \
            "RETAIN_ON_CANCELLATION"
    if restore is not None:
        settings["execution.savepoint.path"] = restore
    if switched:
        settings.update({"state.backend.ndb.enabled": "true", **ndb_options(url, ns)})
    settings.update(extra or {})
    return settings


def lines(path: Path) -> list[tuple[Any, ...]]:
    return [ast.literal_eval(x) for x in path.read_text().splitlines()] if path.exists() else []


def expected_at(i: int) -> tuple[Any, ...]:
    """The output of record i on an exact state."""
    k = i % KEYS
    mine = list(range(k, i + 1, KEYS))
    buckets = tuple(sorted((b, sum(1 for j in mine if j % 3 == b))
                           for b in {j % 3 for j in mine}))
    return (f"k{k}", i, len(mine), len(mine), sum(mine), buckets,
            mine[-2] if len(mine) > 1 else None)


def check(out: list[tuple[Any, ...]], records: int, *, to_end: bool = True) -> int:
    """Every output exact; each seq once, contiguous from the first one (to the end of
    input when `to_end`). Returns the first seq (the restored source offset)."""
    wrong = [(o, expected_at(o[1])) for o in out if o != expected_at(o[1])]
    assert not wrong, f"{len(wrong)} wrong outputs of {len(out)}, e.g. {wrong[:3]}"
    seqs = sorted(o[1] for o in out)
    assert seqs, "no output"
    last = records - 1 if to_end else seqs[-1]
    assert seqs == list(range(seqs[0], last + 1)), (
        f"not each seq once from {seqs[0]} to {last}: {len(seqs)} outputs")
    return seqs[0]


def completed_checkpoints(ckpt_dir: Path) -> dict[int, Path]:
    """chk-N folders with their metadata, by N (every job under ckpt_dir)."""
    found = {}
    for meta in ckpt_dir.glob("*/chk-*/_metadata"):
        found[int(meta.parent.name.split("-")[1])] = meta.parent
    return found


def job_checkpoints(ckpt_dir: Path, client: Any) -> dict[int, Path]:
    """The chk-N folders of the job `client` runs, by N. Callers take the 2 newest as the
    retained ones (num-retained 2): a subsumed one may be listed while Flink deletes it."""
    job = str(client.get_job_id())
    return {n: p for n, p in completed_checkpoints(ckpt_dir).items() if p.parent.name == job}


def savepoint_then_cancel(mode: str, ns: str, url: str, tmp_path: Path, ckpt: Path,
                          extra: dict[str, str] | None = None) -> tuple[str, int]:
    """Job A (parallelism 1, retained 50, output a.txt; `extra` settings) runs to
    checkpoint 3, takes a savepoint and is cancelled; returns the savepoint's path and
    checkpoint id."""
    a = start(mode, 1, ns, url, tmp_path / "a.txt", records=RECORDS,
              throttle_ms=4.0, ckpt_dir=ckpt, retained=50, extra=extra)
    try:
        run_until_checkpoint(a, ckpt, 3, tmp_path / "a.txt")
        sp = a.trigger_savepoint(str(tmp_path / "sp")).result()
        sp_id = max(job_checkpoints(ckpt, a)) + 1
    except BaseException:
        cancel(a)
        raise
    cancel(a)
    return sp, sp_id


def run_until_checkpoint(client: Any, ckpt_dir: Path, n: int, path: Path,
                         timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while max(job_checkpoints(ckpt_dir, client), default=0) < n:
        if time.monotonic() > deadline:
            client.cancel().result()
            pytest.fail(f"checkpoint {n} not reached")
        time.sleep(0.05)


def snapshot_then_cancel(client: Any, ckpt_dir: Path, n: int, path: Path,
                         savepoint_dir: Path | None) -> str:
    """Run `client` to its checkpoint `n` (`path`: its output, for the failure message),
    take a savepoint into `savepoint_dir` (None: none), and cancel it; returns the
    savepoint's path, or without one the newest retained checkpoint's."""
    try:
        run_until_checkpoint(client, ckpt_dir, n, path)
        if savepoint_dir is not None:
            savepoint = client.trigger_savepoint(str(savepoint_dir)).result()
    except BaseException:
        cancel(client)
        raise
    cancel(client)
    if savepoint_dir is not None:
        return str(savepoint)
    retained = job_checkpoints(ckpt_dir, client)
    return str(retained[max(retained)])


def cancel(client: Any) -> None:
    client.cancel().result()
    try:
        client.get_job_execution_result().result()
    except Exception:
        pass
    time.sleep(0.5)


def finish(client: Any) -> None:
    client.get_job_execution_result().result()


RECORDS = 2600


@pytest.mark.parametrize("mode", ["process", "flink"])
def test_older_retained_checkpoint_of_a_cancelled_job_after_its_newest_was_restored(
        mode, tmp_path, mysql_url):
    """Job A (num-retained 2) is cancelled with chk-(m-1) and chk-m retained on disk.
    Job B starts from the newest, chk-m, and runs to the end (many checkpoints). Job C
    then starts from A's OLDER retained checkpoint chk-(m-1): Flink still has it (A was
    cancelled with RETAIN_ON_CANCELLATION; B restored in NO_CLAIM mode and never owned
    it), so C must restore its exact state. `flink` runs the same jobs on PyFlink's own
    state backend (the switch off) as the reference."""
    ns = unique_namespace("brkr")
    ckpt = tmp_path / "ckpt"
    try:
        a = start(mode, 2, ns, mysql_url, tmp_path / "a.txt", records=RECORDS,
                  throttle_ms=4.0, ckpt_dir=ckpt)
        run_until_checkpoint(a, ckpt, 5, tmp_path / "a.txt")
        cancel(a)
        retained = job_checkpoints(ckpt, a)
        assert len(retained) == 2, retained
        older, newest = sorted(retained)
        check(lines(tmp_path / "a.txt"), RECORDS, to_end=False)

        b = start(mode, 2, ns, mysql_url, tmp_path / "b.txt", records=RECORDS,
                  throttle_ms=2.0, ckpt_dir=ckpt, restore=str(retained[newest]))
        run_until_checkpoint(b, ckpt, newest + 4, tmp_path / "b.txt")  # > retained + 1
        finish(b)
        check(lines(tmp_path / "b.txt"), RECORDS)

        c = start(mode, 3, ns, mysql_url, tmp_path / "c.txt", records=RECORDS,
                  throttle_ms=0.0, ckpt_dir=ckpt, restore=str(retained[older]))
        finish(c)
        first_c = check(lines(tmp_path / "c.txt"), RECORDS)
        first_b = min(o[1] for o in lines(tmp_path / "b.txt"))
        assert first_c < first_b  # C restored the older checkpoint
    finally:
        drop_namespace(mysql_url, ns)


def cli(*args: str) -> Any:
    from click.testing import CliRunner

    from pyflink_ndb.cli import main

    return CliRunner().invoke(main, list(args))


def committed_counts(url: str, ns: str) -> dict[str, Any]:
    """`pyflink-ndb get` of every key's count, list and map (None: absent)."""
    import json

    got: dict[str, Any] = {}
    for k in range(KEYS):
        row = []
        for state in ("n", "seqs", "buckets"):
            out = cli("get", "--url", url, "--namespace", ns, "--operator", "count",
                      "--state", state, f"k{k}")
            assert out.exit_code == 0, out.output
            row.append(json.loads(out.output.strip().splitlines()[-1]))
        got[f"k{k}"] = row
    return got


def one_offset(got: dict[str, Any], records: int) -> int:
    """The source offsets every key's committed state agrees with (a state of one
    checkpoint: nothing mixed); returns the smallest."""
    possible = set(range(records + 1))
    for name, row in got.items():
        k = int(name[1:])
        mine = list(range(k, records, KEYS))
        want_ok = set()
        for off in possible:
            prefix = [j for j in mine if j < off]
            n = len(prefix)
            exp = [n or None, prefix or None,
                   {str(b): sum(1 for j in prefix if j % 3 == b)
                    for b in {j % 3 for j in prefix}} or None]
            if [_norm(x) for x in row] == [_norm(x) for x in exp]:
                want_ok.add(off)
        possible &= want_ok
    assert possible, f"committed state of no single offset: {got}"
    return min(possible)


def _norm(x: Any) -> Any:
    if isinstance(x, dict) and "state" in x:  # `get`'s JSON
        x = x.get("value")
    if isinstance(x, list) and x and isinstance(x[0], dict):
        x = {str(e["key"]): e["value"] for e in x}
    if isinstance(x, dict):
        return {str(k): v for k, v in x.items()}
    return x


def test_retained_checkpoint_chain_across_five_jobs_and_rescales(tmp_path, mysql_url):
    """The job-wide switch. A (p 2) cancelled with retained chk a1 < a2. B (p 3) from the
    OLDER a1, past its retention, cancelled with retained b1 < b2. C (p 1) from a1
    again, to the end. D (p 2) from a2 (the branch B left). E (p 3) from b1 (B's older
    retained). Every run exact; readers (`pyflink-ndb get`) see one checkpoint."""
    ns = unique_namespace("brkc")
    ckpt = tmp_path / "ckpt"
    records = 2000
    try:
        a = start("switch", 2, ns, mysql_url, tmp_path / "a.txt", records=records,
                  throttle_ms=4.0, ckpt_dir=ckpt)
        run_until_checkpoint(a, ckpt, 5, tmp_path / "a.txt")
        cancel(a)
        a1, a2 = sorted(job_checkpoints(ckpt, a).items())[-2:]
        check(lines(tmp_path / "a.txt"), records, to_end=False)

        b = start("switch", 3, ns, mysql_url, tmp_path / "b.txt", records=records,
                  throttle_ms=4.0, ckpt_dir=ckpt, restore=str(a1[1]))
        run_until_checkpoint(b, ckpt, a1[0] + 6, tmp_path / "b.txt")
        cancel(b)
        b1, b2 = sorted(job_checkpoints(ckpt, b).items())[-2:]
        first_b = check(lines(tmp_path / "b.txt"), records, to_end=False)
        off = one_offset(committed_counts(mysql_url, ns), records)
        assert off > first_b, (off, first_b)  # readers on one of B's checkpoints

        for name, p, path in (("c", 1, a1[1]), ("d", 2, a2[1]), ("e", 3, b1[1])):
            job = start("switch", p, ns, mysql_url, tmp_path / f"{name}.txt",
                        records=records, throttle_ms=0.0, ckpt_dir=ckpt, restore=str(path))
            finish(job)
            first = check(lines(tmp_path / f"{name}.txt"), records)
            if name == "c":
                assert first == first_b, (first, first_b)
            assert one_offset(committed_counts(mysql_url, ns), records) == records
    finally:
        drop_namespace(mysql_url, ns)


@pytest.mark.parametrize("mode", ["process", "flink"])
def test_retained_checkpoint_taken_before_a_savepoint_another_job_restored(
        mode, tmp_path, mysql_url):
    """A (num-retained 2) completes chk-3, takes a savepoint (id 4), completes chk-5 and
    is cancelled: Flink retains chk-3 and chk-5. B starts from the savepoint and runs to
    the end. C then starts from A's retained chk-3, which Flink still has: C must restore
    its exact state (`flink`: the same on PyFlink's own state backend)."""
    ns = unique_namespace("brkv")
    ckpt = tmp_path / "ckpt"
    try:
        a = start(mode, 2, ns, mysql_url, tmp_path / "a.txt", records=RECORDS,
                  throttle_ms=4.0, ckpt_dir=ckpt)
        try:
            run_until_checkpoint(a, ckpt, 3, tmp_path / "a.txt")
            sp = a.trigger_savepoint(str(tmp_path / "sp")).result()
            run_until_checkpoint(a, ckpt, max(job_checkpoints(ckpt, a)) + 1, tmp_path / "a.txt")
        except BaseException:
            cancel(a)
            raise
        cancel(a)
        older, _newest = sorted(job_checkpoints(ckpt, a).items())[-2:]
        b = start(mode, 2, ns, mysql_url, tmp_path / "b.txt", records=RECORDS,
                  throttle_ms=1.5, ckpt_dir=ckpt, restore=sp)
        finish(b)
        first_b = check(lines(tmp_path / "b.txt"), RECORDS)
        c = start(mode, 2, ns, mysql_url, tmp_path / "c.txt", records=RECORDS,
                  throttle_ms=0.0, ckpt_dir=ckpt, restore=str(older[1]))
        finish(c)
        assert check(lines(tmp_path / "c.txt"), RECORDS) < first_b
    finally:
        drop_namespace(mysql_url, ns)


def test_retained_checkpoint_of_a_cancelled_job_after_a_resumed_fresh_start(
        tmp_path, mysql_url):
    """A (num-retained 2) is cancelled with chk-(m-1) and chk-m retained. B starts
    WITHOUT a restore and `on-fresh-start: resume` (it continues from A's latest completed
    checkpoint) and runs to the end. C then starts from A's retained chk-m, which Flink
    still has (B never restored it): C must restore its exact state."""
    ns = unique_namespace("brkm")
    ckpt = tmp_path / "ckpt"
    try:
        a = start("process", 2, ns, mysql_url, tmp_path / "a.txt", records=RECORDS,
                  throttle_ms=4.0, ckpt_dir=ckpt)
        run_until_checkpoint(a, ckpt, 4, tmp_path / "a.txt")
        cancel(a)
        _older, newest = sorted(job_checkpoints(ckpt, a).items())[-2:]
        b = start("process", 2, ns, mysql_url, tmp_path / "b.txt", records=800,
                  throttle_ms=4.0, ckpt_dir=ckpt,
                  extra={"state.backend.ndb.on-fresh-start": "resume"})
        finish(b)
        c = start("process", 2, ns, mysql_url, tmp_path / "c.txt", records=RECORDS,
                  throttle_ms=0.0, ckpt_dir=ckpt, restore=str(newest[1]))
        finish(c)
        check(lines(tmp_path / "c.txt"), RECORDS)
    finally:
        drop_namespace(mysql_url, ns)


@pytest.mark.parametrize("mode", ["process", "flink"])
def test_old_savepoint_after_the_namespace_was_dropped_and_used_again(
        mode, tmp_path, mysql_url):
    """A (p 1) takes savepoint S (checkpoint id s) and is cancelled. The namespace is
    dropped (`pyflink-ndb drop`) and the same job runs again from scratch on it (faster
    input, many retained checkpoints) past checkpoint s, then is cancelled. C then
    restores the OLD savepoint S: its state is gone from the store, so the restore must
    fail with CheckpointError, or (Flink's own backend) restore S's exact state; it must
    never run on another run's state."""
    ns = unique_namespace("brkd")
    ckpt = tmp_path / "ckpt"
    try:
        sp, sp_id = savepoint_then_cancel(mode, ns, mysql_url, tmp_path, ckpt)
        if mode != "flink":
            out = cli("drop", "--url", mysql_url, "--namespace", ns, "--yes")
            assert out.exit_code == 0, out.output
        a2 = start(mode, 1, ns, mysql_url, tmp_path / "a2.txt", records=RECORDS,
                   throttle_ms=1.0, ckpt_dir=ckpt, retained=50)
        run_until_checkpoint(a2, ckpt, sp_id + 2, tmp_path / "a2.txt")
        cancel(a2)
        c = start(mode, 1, ns, mysql_url, tmp_path / "c.txt", records=RECORDS,
                  throttle_ms=0.0, ckpt_dir=ckpt, restore=sp)
        try:
            finish(c)
        except Exception as err:
            assert "CheckpointError" in str(err), str(err)[-2000:]
            return
        check(lines(tmp_path / "c.txt"), RECORDS)
    finally:
        drop_namespace(mysql_url, ns)


def test_savepoint_restored_into_another_namespace_of_the_same_database(tmp_path, mysql_url):
    """The same job runs on namespace X (savepoint S at checkpoint s) and, separately, on
    namespace Y past checkpoint s. A job on Y restores S (a savepoint of X: the job was
    pointed at another namespace): S's state is not in Y, so the restore must fail with
    CheckpointError; it must never run on Y's state."""
    nx, ny = unique_namespace("brkx"), unique_namespace("brky")
    ckpt = tmp_path / "ckpt"
    try:
        sp, sp_id = savepoint_then_cancel("process", nx, mysql_url, tmp_path, ckpt)
        y = start("process", 1, ny, mysql_url, tmp_path / "y.txt", records=RECORDS,
                  throttle_ms=1.0, ckpt_dir=ckpt, retained=50)
        run_until_checkpoint(y, ckpt, sp_id + 2, tmp_path / "y.txt")
        cancel(y)
        c = start("process", 1, ny, mysql_url, tmp_path / "c.txt", records=RECORDS,
                  throttle_ms=0.0, ckpt_dir=ckpt, restore=sp)
        try:
            finish(c)
        except Exception as err:
            assert "CheckpointError" in str(err), str(err)[-2000:]
            return
        check(lines(tmp_path / "c.txt"), RECORDS)
    finally:
        drop_namespace(mysql_url, nx)
        drop_namespace(mysql_url, ny)


def test_stop_with_savepoint_of_a_retaining_job_is_told_in_the_listing(tmp_path, mysql_url):
    """Job A runs with RETAIN_ON_CANCELLATION (num-retained 2) and is stopped with a
    savepoint (`stop_with_savepoint`): it ends FINISHED, and Flink deletes its retained
    checkpoints (`CheckpointProperties` discards on a finished job; checked on disk here).
    The bridge tells the subtasks the savepoint is synchronous, and their normal close
    records the stop: `savepoints --all` says Flink deleted them unless the job failed
    while stopping. Job B, started from the savepoint, keeps them all the same (a job may
    fail while stopping: tests/test_stop_then_failure_flink.py); the savepoint stays
    pinned."""
    import json

    from pyflink_ndb.cli import STOPPED_NOTE

    ns = unique_namespace("brks")
    ckpt = tmp_path / "ckpt"
    try:
        a = start("process", 2, ns, mysql_url, tmp_path / "a.txt", records=RECORDS,
                  throttle_ms=4.0, ckpt_dir=ckpt)
        try:
            run_until_checkpoint(a, ckpt, 4, tmp_path / "a.txt")
            sp = a.stop_with_savepoint(False, str(tmp_path / "sp")).result()
        except BaseException:
            cancel(a)
            raise
        finish(a)
        a_id = str(a.get_job_id())
        deadline = time.monotonic() + 20
        while job_checkpoints(ckpt, a) and time.monotonic() < deadline:
            time.sleep(0.2)  # Flink's CheckpointsCleaner deletes them asynchronously
        assert job_checkpoints(ckpt, a) == {}, "Flink kept a finished job's checkpoints"

        def notes_of_a() -> list[tuple[str, int, str]]:
            out = cli("savepoints", "--url", mysql_url, "--namespace", ns, "--all",
                      "--format", "json")
            assert out.exit_code == 0, out.output
            return [(r["kind"], r["checkpoint"], r["note"])
                    for r in map(json.loads, out.stdout.splitlines()) if r["job"] == a_id]

        before = notes_of_a()
        sp_id = max(n for kind, n, _ in before if kind == "savepoint")
        notes = {note for kind, _, note in before if kind == "checkpoint"}
        # (a periodic checkpoint in flight at the stop stays pending: never completed)
        assert STOPPED_NOTE in notes, before
        assert notes <= {"readers see it", "pending (not completed)", STOPPED_NOTE}, before

        b = start("process", 2, ns, mysql_url, tmp_path / "b.txt", records=RECORDS,
                  throttle_ms=2.0, ckpt_dir=ckpt, restore=sp)
        run_until_checkpoint(b, ckpt, sp_id + 4, tmp_path / "b.txt")  # > retained + 1
        finish(b)
        assert check(lines(tmp_path / "b.txt"), RECORDS) > 0  # B restored the savepoint
        after = notes_of_a()
        assert ("savepoint", sp_id, "pinned until released") in after, after
        # A's newest num-retained (2) completed checkpoints stay (the one more its own
        # retention kept for readers goes), as of any job that kept its checkpoints
        completed = sorted(n for kind, n, note in before if kind == "checkpoint"
                           and note in (STOPPED_NOTE, "readers see it"))
        assert {n for kind, n, note in after if note == STOPPED_NOTE} == \
            set(completed[-2:]), (before, after)
    finally:
        drop_namespace(mysql_url, ns)
