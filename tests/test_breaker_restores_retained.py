"""Breaker: restores across jobs while garbage collection runs (retained checkpoints).

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
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from conftest import drop_namespace, thread_mode_env, unique_namespace
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


class AppendTo(MapFunction):
    def __init__(self, path: str) -> None:
        self.path = path

    def open(self, runtime_context: Any) -> None:
        self.handle = open(self.path, "a")

    def map(self, value: Any) -> Any:
        self.handle.write(value + "\n")
        self.handle.flush()
        return value

    def close(self) -> None:
        self.handle.close()


class Count(KeyedProcessFunction):
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
          records: int, throttle_ms: float) -> None:
    stream = env.from_source(NumberSequenceSource(0, records - 1),
                             WatermarkStrategy.no_watermarks(), "seq").uid("seq") \
        .set_parallelism(1) \
        .map(Throttle(throttle_ms), output_type=ROW).uid("throttle").set_parallelism(1)
    keyed = stream.key_by(lambda r: r[0], key_type=Types.STRING())
    if mode == "process":
        out = pyflink_ndb.process(keyed, Count(), output_type=Types.STRING(), uid="count",
                                  options=options)
    else:  # "switch" (state.backend.ndb.enabled in the job's configuration) or "flink"
        out = keyed.process(Count(), output_type=Types.STRING()).uid("count")
    out.set_parallelism(p).map(AppendTo(str(path)), output_type=Types.STRING()) \
        .set_parallelism(p).add_sink(
            SinkFunction("org.apache.flink.streaming.api.functions.sink.DiscardingSink"))


def start(mode: str, p: int, ns: str, url: str, path: Path, *, records: int,
          throttle_ms: float, ckpt_dir: Path | None = None, retained: int = 2,
          restore: str | None = None, interval_ms: int = 300,
          extra: dict[str, str] | None = None) -> Any:
    settings: dict[str, str] = {"execution.checkpointing.num-retained": str(retained)}
    if ckpt_dir is not None:
        settings["state.checkpoints.dir"] = ckpt_dir.as_uri()
        settings["execution.checkpointing.externalized-checkpoint-retention"] = \
            "RETAIN_ON_CANCELLATION"
    if restore is not None:
        settings["execution.savepoint.path"] = restore
    options = {"state.backend.ndb.url": url, "state.backend.ndb.namespace": ns,
               "state.backend.ndb.cache.max-entries": "4"}
    if mode == "switch":
        settings.update({"state.backend.ndb.enabled": "true", **options})
    settings.update(extra or {})
    env = thread_mode_env(1, settings)
    env.enable_checkpointing(interval_ms, CheckpointingMode.EXACTLY_ONCE)
    build(env, mode, p, options, path, records, throttle_ms)
    return env.execute_async(f"breaker-restores-{mode}-p{p}")


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
    job = str(client.get_job_id())
    return {n: p for n, p in completed_checkpoints(ckpt_dir).items() if p.parent.name == job}


def run_until_checkpoint(client: Any, ckpt_dir: Path, n: int, path: Path,
                         timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while max(job_checkpoints(ckpt_dir, client), default=0) < n:
        if time.monotonic() > deadline:
            client.cancel().result()
            pytest.fail(f"checkpoint {n} not reached")
        time.sleep(0.05)


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
