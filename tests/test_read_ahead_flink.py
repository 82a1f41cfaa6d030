"""Read-ahead in the Java bridge on Flink's MiniCluster (thread mode): a second job
resumes the state a first job committed, so its reads miss and the bridge holds records
back in bundles. Every record must still see its key's state exactly, in order, and every
event-time timer must fire only after the records the watermark covers were processed
(the bundle is processed before each watermark); the bundles must really have been read
ahead in multi-row queries."""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from conftest import drop_namespace, unique_namespace
from pyflink.common import Configuration, Types, WatermarkStrategy
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import (
    CheckpointingMode,
    KeyedProcessFunction,
    StreamExecutionEnvironment,
)
from pyflink.datastream.state import ValueStateDescriptor

import pyflink_ndb

pytestmark = pytest.mark.flink

# The job's classes live in this test module, which the TaskManager cannot import:
# ship them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = 2000
PER_KEY = 3
UID = "read-ahead-counts"
ROW = Types.TUPLE([Types.STRING(), Types.INT(), Types.LONG()])


def records(first_ts: int) -> list[tuple[str, int, int]]:
    """(key, seq, event time): PER_KEY records of each key, keys interleaved, event time
    ascending by 1 ms."""
    return [(f"k{i % KEYS}", i // KEYS, first_ts + i) for i in range(KEYS * PER_KEY)]


class EventTime(TimestampAssigner):
    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        return value[2]


class Counting(KeyedProcessFunction):
    """Counts each key's records; each record sets an event-time timer 10 ms later that
    reports the count it sees. At close, writes the read-ahead counters to `report`."""

    def __init__(self, report: str) -> None:
        self.report = report

    def open(self, runtime_context: Any) -> None:
        self.backend = runtime_context.backend
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        ctx.timer_service().register_event_time_timer(value[2] + 10)
        yield repr(("record", value[0], value[1], n))

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield repr(("timer", ctx.get_current_key(), timestamp, self.count.value()))

    def close(self) -> None:
        table = self.backend.table
        with open(self.report, "a") as out:
            sizes = ",".join(map(str, self.backend.read_ahead_bundle_sizes))
            out.write(f"{table.read_ahead_queries} {table.read_ahead_entries} {sizes}\n")


def run(options: dict[str, str], first_ts: int, report: Path,
        object_reuse: bool = False) -> list[tuple[Any, ...]]:
    config = Configuration()
    config.set_string("pipeline.object-reuse", str(object_reuse).lower())
    config.set_string("python.execution-mode", "thread")
    config.set_string("python.executable", sys.executable)
    config.set_string("restart-strategy.type", "none")  # a failure fails the test
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(2)
    env.enable_checkpointing(500, CheckpointingMode.EXACTLY_ONCE)
    stream = env.from_collection(records(first_ts), type_info=ROW) \
        .assign_timestamps_and_watermarks(
            WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(EventTime()))
    keyed = stream.key_by(lambda r: r[0], key_type=Types.STRING())
    out = pyflink_ndb.process(keyed, Counting(str(report)), output_type=Types.STRING(),
                              uid=UID, options=options)
    with out.execute_and_collect() as results:
        return [ast.literal_eval(line) for line in results]


@pytest.mark.parametrize("kind", ["sqlite", "mysql", "sqlite-object-reuse", "mysql-bundle"])
def test_resumed_job_reads_ahead_and_keeps_record_and_timer_order(kind, tmp_path, mysql_url):
    """`sqlite-object-reuse`: with `pipeline.object-reuse` the bridge copies each value it
    holds back. `mysql-bundle`: each bundle is also processed in one call
    (`bundle.records`, its size then), and still read ahead first."""
    namespace = unique_namespace("ra")
    url = mysql_url if kind.startswith("mysql") else f"sqlite:///{tmp_path / 'state.sqlite'}"
    reuse = kind.endswith("object-reuse")
    options = {"state.backend.ndb.url": url, "state.backend.ndb.namespace": namespace,
               "state.backend.ndb.on-fresh-start": "truncate",
               "state.backend.ndb.read-ahead.records": "50"}
    # Read-ahead alone (one call per record), or with bundles of the same size.
    options["state.backend.ndb.bundle.records"] = "50" if kind.endswith("bundle") else "0"
    try:
        run(options, 0, tmp_path / "first.txt", reuse)
        options["state.backend.ndb.on-fresh-start"] = "resume"
        first_ts = 1_000_000
        output = run(options, first_ts, tmp_path / "second.txt", reuse)
    finally:
        if kind.startswith("mysql"):
            drop_namespace(mysql_url, namespace)

    counts: dict[str, list[tuple[int, int]]] = defaultdict(list)
    timers: list[tuple[str, int, int]] = []
    for line in output:
        if line[0] == "record":
            counts[line[1]].append((line[2], line[3]))
        else:
            timers.append(line[1:])
    assert len(counts) == KEYS
    for key, seen in counts.items():  # in order, each on top of the resumed count
        assert seen == [(seq, PER_KEY + seq + 1) for seq in range(PER_KEY)], key

    assert len(timers) == KEYS * PER_KEY, "every timer fired once (end of input)"
    times: dict[str, list[int]] = defaultdict(list)
    for key, _seq, ts in records(first_ts):
        times[key].append(ts)
    for key, timestamp, count in timers:
        covered = sum(ts <= timestamp for ts in times[key])
        assert count >= PER_KEY + covered, \
            f"timer {timestamp} of {key} fired before the records its watermark covers"

    reports = [line.split() for line in (tmp_path / "second.txt").read_text().splitlines()]
    queries = sum(int(r[0]) for r in reports)
    entries = sum(int(r[1]) for r in reports)
    assert queries >= 1 and entries >= KEYS // 2, (queries, entries)
    assert entries / queries > 5, "bundles were read in multi-row queries"
    for report in reports:  # each subtask's bundles start at 1 record and double up to 50
        sizes = [int(n) for n in report[2].split(",")]
        assert sizes[0] == 1, sizes
        assert all(n <= min(2 ** i, 50) for i, n in enumerate(sizes)), sizes
        assert max(sizes) > 8, sizes
