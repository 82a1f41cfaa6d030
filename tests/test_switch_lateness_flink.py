"""The job-wide switch (a breaker's attack, kept): late records inside and beyond allowed
lateness, with deterministic
watermarks, on the job-wide switch (cache of 4 entries, MariaDB, checkpoints every
300 ms) against PyFlink's own state.

Watermarks are made deterministic: timestamps of the ordinary records only increase (so
they are never late, whatever watermark a periodic emission carries), and the source
pauses for 250 ms (20 ms watermark interval) before each "pause" record; the late records
come right after it, when the watermark is exactly the pause record's timestamp - 1 (late
records never raise it). Which windows have fired when a late record arrives, and
whether it is dropped, is then the same in every run.

Pipelines (keyed ones at parallelism 2): tumbling 1 h windows with `process` (contents)
and `reduce`, sliding 2 h / 1 h windows with `aggregate`, event-time sessions (gap 45
min) with `process` and `reduce` (late records bridge sessions that fired already and
merge them), `window_all` with `process`, and the late-data side outputs.
Sessions with `reduce` are not compared with PyFlink's own state (PyFlink 1.20's own
merging reducing state overwrites the target: docs/protocol.md), but with the contents
that the `process` sessions fire in the same run.
"""

from __future__ import annotations

import ast
import random
import sys
import time
from collections import Counter
from typing import Any

import cloudpickle
import pytest
from conftest import drop_namespace, thread_mode_env, unique_namespace
from pyflink.common import Time, Types, WatermarkStrategy
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import (
    AggregateFunction,
    CheckpointingMode,
    KeyedProcessFunction,
    MapFunction,
    OutputTag,
    ProcessWindowFunction,
    StreamExecutionEnvironment,
)
from pyflink.datastream.connectors.number_seq import NumberSequenceSource
from pyflink.datastream.functions import ProcessAllWindowFunction
from pyflink.datastream.window import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
)

import pyflink_ndb  # noqa: F401

pytestmark = pytest.mark.flink

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MIN = 60_000
HOUR = 60 * MIN
LATENESS = 6 * HOUR
KEYS = ["k0", ("k", 1), ("k", None), 7, "ü", b"x", "k6"]
LATE_T = OutputTag("late-t", Types.PICKLED_BYTE_ARRAY())
LATE_S = OutputTag("late-s", Types.PICKLED_BYTE_ARRAY())
LATE_A = OutputTag("late-a", Types.PICKLED_BYTE_ARRAY())


def make_records(n_normal: int = 1500, seed: int = 5) -> list[tuple[int, Any, int, int, bool]]:
    """(id, key, ts, value, pause_before)."""
    rng = random.Random(seed)
    out: list[tuple[int, Any, int, int, bool]] = []
    ts = 0
    for i in range(n_normal):
        ts += rng.choice([1, 2, 5, 10, 20]) * MIN
        pause = i > 0 and i % 120 == 0
        out.append((len(out), rng.choice(KEYS), ts, rng.randrange(100), pause))
        if pause:
            for _ in range(6):
                back = rng.choice([10 * MIN, 40 * MIN, 90 * MIN, 3 * HOUR, 5 * HOUR,
                                   7 * HOUR, 12 * HOUR])
                out.append((len(out), rng.choice(KEYS), ts - back, rng.randrange(100), False))
    return out


class RecordAt(MapFunction):
    def __init__(self, records: list[Any]) -> None:
        self.records = records

    def map(self, value: Any) -> Any:
        record = self.records[value]
        if record[4]:
            time.sleep(0.25)
        return record


class Ts(TimestampAssigner):
    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        return value[2]


class Contents(ProcessWindowFunction):
    def __init__(self, tag: str) -> None:
        self.tag = tag

    def process(self, key: Any, context: Any, elements: Any) -> Any:
        yield (self.tag, repr(key), context.window().start, context.window().end,
               tuple(sorted(e[0] for e in elements)), sum(e[3] for e in elements))


class Firing(ProcessWindowFunction):
    def __init__(self, tag: str) -> None:
        self.tag = tag

    def process(self, key: Any, context: Any, elements: Any) -> Any:
        for e in elements:
            yield (self.tag, repr(key), context.window().start, context.window().end, e)


class AllContents(ProcessAllWindowFunction):
    def process(self, context: Any, elements: Any) -> Any:
        yield ("all", None, context.window().start, context.window().end,
               tuple(sorted(e[0] for e in elements)), sum(e[3] for e in elements))


class WatermarkAtLate(KeyedProcessFunction):
    """Emits ("wm", id, watermark) for each late record: the watermark its keyed operators
    see when it arrives (every keyed operator reads the same channel, in the same order)."""

    def __init__(self, late_ids: frozenset[int]) -> None:
        self.late_ids = late_ids

    def process_element(self, value: Any, ctx: Any) -> Any:
        if value[0] in self.late_ids:
            yield ("wm", value[0], ctx.timer_service().current_watermark())


class SumAgg(AggregateFunction):
    def create_accumulator(self) -> Any:
        return (0, 0)

    def add(self, value: Any, acc: Any) -> Any:
        return (acc[0] + 1, acc[1] + value[3])

    def get_result(self, acc: Any) -> Any:
        return acc

    def merge(self, a: Any, b: Any) -> Any:
        return (a[0] + b[0], a[1] + b[1])


def build(env: StreamExecutionEnvironment, records: list[Any]) -> Any:
    p = 2
    src = env.from_source(NumberSequenceSource(0, len(records) - 1),
                          WatermarkStrategy.no_watermarks(), "ids").uid("ids") \
        .map(RecordAt(records), Types.PICKLED_BYTE_ARRAY()) \
        .assign_timestamps_and_watermarks(
            WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(Ts()))
    keyed = src.key_by(lambda r: r[1])
    tumble = keyed.window(TumblingEventTimeWindows.of(Time.hours(1))) \
        .allowed_lateness(LATENESS).side_output_late_data(LATE_T) \
        .process(Contents("tumble")).set_parallelism(p).uid("tumble")
    session = keyed.window(EventTimeSessionWindows.with_gap(Time.minutes(45))) \
        .allowed_lateness(LATENESS).side_output_late_data(LATE_S) \
        .process(Contents("session")).set_parallelism(p).uid("session")
    all_w = src.window_all(TumblingEventTimeWindows.of(Time.hours(2))) \
        .allowed_lateness(LATENESS).side_output_late_data(LATE_A) \
        .process(AllContents()).uid("all")
    outs = [
        tumble, session, all_w,
        keyed.process(WatermarkAtLate(frozenset(late_records(records)))).set_parallelism(p)
        .uid("wm"),
        tumble.get_side_output(LATE_T).map(lambda r: ("late-t", r[0])),
        session.get_side_output(LATE_S).map(lambda r: ("late-s", r[0])),
        all_w.get_side_output(LATE_A).map(lambda r: ("late-a", r[0])),
        keyed.window(TumblingEventTimeWindows.of(Time.hours(1))).allowed_lateness(LATENESS)
        .reduce(lambda a, b: (-1, a[1], 0, a[3] + b[3], False),
                window_function=Firing("tumble-reduce"))
        .set_parallelism(p).uid("tumble-reduce"),
        keyed.window(SlidingEventTimeWindows.of(Time.hours(2), Time.hours(1)))
        .allowed_lateness(LATENESS)
        .aggregate(SumAgg(), window_function=Firing("slide-agg")).set_parallelism(p)
        .uid("slide-agg"),
        keyed.window(EventTimeSessionWindows.with_gap(Time.minutes(45))).allowed_lateness(LATENESS)
        .reduce(lambda a, b: (-1, a[1], 0, a[3] + b[3], False),
                window_function=Firing("session-reduce"))
        .set_parallelism(p).uid("session-reduce"),
    ]
    return outs[0].union(*outs[1:]).map(repr, Types.STRING())


def run(records: list[Any], extra: dict[str, str], checkpoint_ms: int) -> Counter:
    """The job's output, from a run whose late records all arrived at the watermark the
    design gives them (:func:`watermark_misses`); at most three runs."""
    misses: list[tuple[int, int, int]] = []
    for _ in range(3):
        env = thread_mode_env(1, {"pipeline.auto-watermark-interval": "20", **extra})
        if checkpoint_ms:
            env.enable_checkpointing(checkpoint_ms, CheckpointingMode.EXACTLY_ONCE)
        with build(env, records).execute_and_collect() as results:
            outs = Counter(ast.literal_eval(line) for line in results)
        misses = watermark_misses(outs, records)
        if not misses:
            return outs
    raise AssertionError(f"late records at other watermarks than the design's in 3 runs "
                         f"(id, wanted, seen): {misses[:5]}")


def late_records(records: list[Any]) -> dict[int, int]:
    """{id of a late record: the watermark it must arrive at}: the pause record's timestamp - 1
    (the design in the module docstring)."""
    out: dict[int, int] = {}
    pause_ts = None
    for r in records:
        if r[4]:
            pause_ts = r[2]
        elif pause_ts is not None and r[2] < pause_ts:
            out[r[0]] = pause_ts - 1
        else:
            pause_ts = None
    return out


def watermark_misses(outs: Counter, records: list[Any]) -> list[tuple[int, int, int]]:
    """(id, watermark wanted, watermark seen) for each late record that did not arrive at the
    watermark the test's design gives it. A run whose records and watermarks interleaved
    otherwise fires its windows otherwise, whatever the state backend: CI (2026-12-07)
    once saw the tiered run fire a window only at its late record, one firing fewer than
    PyFlink's own state in four operators at once for the same key and window, as if the
    periodic watermark had not been emitted during the 250 ms pause (a JVM pause or a
    starved timer thread late in a 40-minute suite)."""
    want = late_records(records)
    seen = {o[1]: o[2] for o in by_tag(outs, "wm")}
    assert set(seen) == set(want), (len(seen), len(want))
    return [(i, want[i], seen[i]) for i in sorted(want) if seen[i] != want[i]]


def by_tag(c: Counter, tag: str) -> Counter:
    return Counter({o: n for o, n in c.items() if o[0] == tag})


def test_late_records_and_late_session_merges_equal_pyflink_state(tmp_path, mysql_url):
    records = make_records()
    heap = run(records, {}, checkpoint_ms=0)
    tags = Counter(o[0] for o in heap.elements())
    # the attack needs late firings, dropped records and late session merges
    assert tags["late-t"] > 0 and tags["late-s"] > 0, tags
    normal_tumble = sum(1 for r in records if not r[4]) // 1
    assert tags["tumble"] > 0 and normal_tumble

    ns = unique_namespace("brkl")
    try:
        tiered = run(records, {"state.backend.ndb.enabled": "true",
                               "state.backend.ndb.url": mysql_url,
                               "state.backend.ndb.namespace": ns,
                               "state.backend.ndb.cache.max-entries": "4",
                               # a second run (watermark_misses) starts over
                               "state.backend.ndb.on-fresh-start": "truncate"},
                     checkpoint_ms=300)
    finally:
        drop_namespace(mysql_url, ns)

    problems = []
    for tag in sorted(tags):
        if tag == "session-reduce":
            continue
        h, t = by_tag(heap, tag), by_tag(tiered, tag)
        if h != t:
            problems.append((tag, sum(h.values()), sum(t.values()),
                             list((h - t).items())[:3], list((t - h).items())[:3]))
    # session reduce firings = session process firings (key, window, sum), same run
    for name, outs in (("tiered", tiered),):
        want = Counter((o[1], o[2], o[3], o[5]) for o in by_tag(outs, "session").elements())
        got = Counter((o[1], o[2], o[3], o[4][3]) for o in by_tag(outs, "session-reduce")
                      .elements())
        if want != got:
            problems.append((name + " session-reduce", sum(want.values()), sum(got.values()),
                             list((want - got).items())[:3], list((got - want).items())[:3]))
    assert not problems, problems
