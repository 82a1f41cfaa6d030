"""The job-wide switch under rescale (issue 11, item 5): stop with a savepoint at keyed
parallelism 2, restore at 3.

The switched job of tests/test_switch_flink.py (keyed reduce; stateful map / flat_map /
filter; keyed connect; tumbling / sliding / session windows with reduce / aggregate /
process / apply, `window_state()` and `global_state()`; a keyed broadcast function with
a rule stream) runs on SQLite with its keyed
operators at parallelism 2, slowed by a stateless map right after the source so that it
can be stopped mid-stream: once a checkpoint is committed in the store and part of the
input is processed, it stops with a savepoint (no drain: no MAX_WATERMARK, so no window
fires). The job is then restored from that savepoint with its keyed operators at
parallelism 3 (key groups move between subtasks) and runs to the end of the input, where
every window fires. The union of both runs' outputs must equal, per output kind and as
multisets, the outputs of the same job on PyFlink's own state (one run, no checkpoints):
flight-level outputs of the first run plus those of the second, and window outputs (all
from the second run) that need the window contents, trigger state, merging window sets
and per-window / global state written before the savepoint, and the broadcast function's
end-of-input alerts, which need its keyed Value and List state and its timers (in Flink)
from before the savepoint and its broadcast state (in Flink, copied to every subtask).

Outputs: a stateless map at parallelism 1 appends every output to a file of its run
(`execute_async` gives the JobClient to stop the job with). This is exact here because a
stop without drain stops the source before its savepoint barrier: the first run emits
nothing after the barrier, so its outputs are exactly those of the records the savepoint
covers (a duplicate or a loss would show in the comparison). `execute_and_collect` is not
usable: its collect sink keeps its offset in operator state, and a new client reading the
restored sink fails (`IllegalStateException: userVisibleTail should not be larger than
offset`).
"""

from __future__ import annotations

import ast
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from conftest import append_to
from pyflink.common import Configuration, Time, Types
from pyflink.datastream import CheckpointingMode, MapFunction, StreamExecutionEnvironment
from pyflink.datastream.functions import SinkFunction
from pyflink.datastream.window import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
)
from test_switch_flink import (
    FIVE_HOURS_LATE,
    RULES,
    AirportTraffic,
    AverageDelay,
    CountPerOrigin,
    DailyWithWindowState,
    DelayAlerts,
    DestinationsPerOrigin,
    FirstFlightOfAircraft,
    FlightsPerDay,
    SessionSummary,
    SlidingResult,
    flight_source,
    load_flights,
    rule_source,
)

import pyflink_ndb  # noqa: F401  (installs the switch)
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.stores.factory import open_store

pytestmark = pytest.mark.flink

cloudpickle.register_pickle_by_value(sys.modules[__name__])

FLIGHTS = 6000
#: Sleep per record in the first run (ms): the whole input would take ~24 s.
THROTTLE_MS = 4.0
KINDS = {"reduce", "map", "flat_map", "filter", "connect", "tumbling", "sliding", "session",
         "daily-apply", "daily-process", "broadcast", "broadcast-alert", "broadcast-side"}
#: Outputs of the end of input only (windows, the broadcast function's timers).
WINDOW_KINDS = {"tumbling", "sliding", "session", "daily-apply", "daily-process",
                "broadcast-alert"}


class Throttle(MapFunction):
    """Stateless (runs at parallelism 1, chained to the source): slows the source down so
    that the job can be stopped mid-stream without a backlog in front of the barriers."""

    def __init__(self, per_record_ms: float) -> None:
        self.per_record_ms = per_record_ms

    def map(self, value: Any) -> Any:
        if self.per_record_ms:
            time.sleep(self.per_record_ms / 1000)
        return value


def build_rescale_job(env: StreamExecutionEnvironment, flights: list[Any], p: int,
                      per_record_ms: float, output: str) -> Any:
    """The job of `test_switch_flink.build_job` (without its failure injection), keyed
    operators at parallelism `p`, stateless ones at 1, every stateful operator with a
    uid (stable across the restore)."""
    source = flight_source(env, flights, Throttle(per_record_ms))
    by_origin = source.key_by(lambda f: f[2], key_type=Types.STRING())
    by_carrier = source.key_by(lambda f: f[0], key_type=Types.STRING())
    by_tail = source.key_by(lambda f: f[1], key_type=Types.STRING())
    by_dest = source.key_by(lambda f: f[3], key_type=Types.STRING())
    outputs = [
        by_carrier.map(lambda f: (f[0], 1, f[5])).set_parallelism(p).key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1], a[2] + b[2])).set_parallelism(p)
        .uid("reduce").map(lambda t: ("reduce", *t)),
        by_origin.map(CountPerOrigin()).set_parallelism(p).uid("map"),
        by_origin.flat_map(DestinationsPerOrigin()).set_parallelism(p).uid("flat-map"),
        by_tail.filter(FirstFlightOfAircraft()).set_parallelism(p).uid("filter")
        .map(lambda f: ("filter", f[1], f[4])),
        by_origin.connect(by_dest).map(AirportTraffic()).set_parallelism(p).uid("connect"),
        by_origin.map(lambda f: (f[2], f[5], 1)).set_parallelism(p).key_by(lambda t: t[0])
        .window(TumblingEventTimeWindows.of(Time.hours(1)))
        .reduce(lambda a, b: (a[0], a[1] + b[1], a[2] + b[2])).set_parallelism(p)
        .uid("tumbling").map(lambda t: ("tumbling", *t)),
        by_origin.window(SlidingEventTimeWindows.of(Time.days(1), Time.hours(6)))
        .aggregate(AverageDelay(), window_function=SlidingResult()).set_parallelism(p)
        .uid("sliding"),
        by_tail.window(EventTimeSessionWindows.with_gap(Time.hours(3)))
        .process(SessionSummary()).set_parallelism(p).uid("session"),
        by_carrier.window(TumblingEventTimeWindows.of(Time.days(1))).apply(FlightsPerDay())
        .set_parallelism(p).uid("daily-apply"),
        by_carrier.window(TumblingEventTimeWindows.of(Time.days(1)))
        .process(DailyWithWindowState()).set_parallelism(p).uid("daily-process"),
    ]
    alerts = by_origin.connect(rule_source(env).broadcast(RULES)).process(DelayAlerts()) \
        .set_parallelism(p).uid("broadcast")
    outputs += [alerts, alerts.get_side_output(FIVE_HOURS_LATE)]
    return outputs[0].union(*outputs[1:]).map(append_to(output, as_repr=True)) \
        .add_sink(SinkFunction("org.apache.flink.streaming.api.functions.sink.DiscardingSink"))




def read_outputs(path: Path) -> list[Any]:
    if not path.exists():
        return []
    return [ast.literal_eval(line) for line in path.read_text().splitlines()]


class Run:
    """One job started with `execute_async`; its outputs go to the file `path`."""

    def __init__(self, flights: list[Any], p: int, extra: dict[str, str], path: Path,
                 checkpoint_ms: int, per_record_ms: float = 0.0) -> None:
        config = Configuration()
        config.set_string("python.execution-mode", "thread")
        config.set_string("python.executable", sys.executable)
        config.set_string("pipeline.auto-watermark-interval", "0")
        config.set_string("restart-strategy.type", "none")
        for key, value in extra.items():
            config.set_string(key, value)
        env = StreamExecutionEnvironment.get_execution_environment(config)
        env.set_parallelism(1)
        if checkpoint_ms:
            env.enable_checkpointing(checkpoint_ms, CheckpointingMode.EXACTLY_ONCE)
        self.path = path
        build_rescale_job(env, flights, p, per_record_ms, str(path))
        self.client = env.execute_async(f"switch-rescale-p{p}")

    def wait(self) -> Counter:
        self.client.get_job_execution_result().result()
        return Counter(read_outputs(self.path))


def wait_for_commit_and_progress(options: NdbStateOptions, run: Run, db: Path,
                                 min_maps: int, timeout_s: float = 90.0) -> None:
    """Poll until some switched operator (named in the store by its Flink operator ID) has
    committed a checkpoint and the run's outputs hold `min_maps` flights."""
    deadline = time.monotonic() + timeout_s
    while not db.exists():
        assert time.monotonic() < deadline, "the switched job never opened its store"
        time.sleep(0.2)
    store = open_store(options)
    try:
        while time.monotonic() < deadline:
            committed = [row.operator for row in store.operators()
                         if row.committed is not None]
            if committed and run.path.exists():
                maps = sum(1 for line in run.path.read_text().splitlines()
                           if line.startswith("('map'"))
                if maps >= min_maps:
                    return
            time.sleep(0.2)
    finally:
        store.close()
    pytest.fail("no checkpoint committed (or too little input processed) in time")


def by_kind(outputs: Counter, kind: str) -> Counter:
    return Counter({o: n for o, n in outputs.items() if o[0] == kind})


def test_switched_job_savepoint_at_2_restore_at_3_equals_pyflink_state(tmp_path):
    flights = load_flights(FLIGHTS)
    heap_all = Run(flights, 2, {}, tmp_path / "heap.txt", checkpoint_ms=0).wait()
    kinds = Counter(out[0] for out in heap_all.elements())
    assert set(kinds) == KINDS, kinds
    assert kinds["map"] == len(flights)

    db = tmp_path / "state.sqlite"
    options = NdbStateOptions(url=f"sqlite:///{db}", namespace="default")
    switched = {"state.backend.ndb.enabled": "true", "state.backend.ndb.url": options.url,
                "state.backend.ndb.namespace": options.namespace,
                "state.backend.ndb.cache.max-entries": "64"}

    first = Run(flights, 2, switched, tmp_path / "first.txt", checkpoint_ms=300,
                per_record_ms=THROTTLE_MS)
    try:
        wait_for_commit_and_progress(options, first, db, min_maps=FLIGHTS // 5)
    except BaseException:
        first.client.cancel().result()  # leave no job running behind a failure
        raise
    savepoint = first.client.stop_with_savepoint(False, str(tmp_path / "savepoints")).result()
    first_all = first.wait()
    first_kinds = Counter(out[0] for out in first_all.elements())
    # Stopped mid-stream, and without MAX_WATERMARK: no window fired.
    assert 0 < first_kinds["map"] < len(flights), first_kinds
    assert not WINDOW_KINDS & set(first_kinds), first_kinds

    second_all = Run(flights, 3, {**switched, "execution.savepoint.path": savepoint},
                     tmp_path / "second.txt", checkpoint_ms=300).wait()
    second_kinds = Counter(out[0] for out in second_all.elements())
    assert first_kinds["map"] + second_kinds["map"] == len(flights), (first_kinds,
                                                                     second_kinds)

    tiered_all = first_all + second_all
    for kind in sorted(kinds):
        heap = by_kind(heap_all, kind)
        tiered = by_kind(tiered_all, kind)
        assert tiered == heap, (kind, sum(heap.values()), sum(tiered.values()),
                                list((heap - tiered).items())[:5],
                                list((tiered - heap).items())[:5])

    store = open_store(options)
    try:
        names = {row["state_name"] for row in store.catalog()}
    finally:
        store.close()
    assert {"count", "dests", "seen", "deps", "arrs", "sessions", "fired", "total",
            "window-contents", "merging-window-set", "flights", "delays"} <= names, names
