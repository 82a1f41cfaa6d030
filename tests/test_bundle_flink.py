"""Records processed in bundles (`state.backend.ndb.bundle.records`) on Flink's MiniCluster:
the bridge holds records back and hands each bundle to Python in one call. What a job sees
must not change: every record's state, key (`ctx.get_current_key()`), timestamp
(`ctx.timestamp()`, also in a function chained after it), its outputs in order with the
record's timestamp, its timers registered and deleted for its own key, and event-time
timers that fire only after the records their watermark covers. The reference is the same
job on PyFlink's own keyed state (no pyflink-ndb), record for record. A processing-time
timer that comes due while a record is held back is still deleted by that record."""

from __future__ import annotations

import ast
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from conftest import thread_mode_env
from pyflink.common import Types, WatermarkStrategy
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import KeyedProcessFunction, MapFunction, ProcessFunction
from pyflink.datastream.state import ValueStateDescriptor

import pyflink_ndb
from pyflink_ndb.runtime.backend import OUTPUTS_PER_CALL

pytestmark = pytest.mark.flink

cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = 7
RECORDS = 600
ROW = Types.TUPLE([Types.STRING(), Types.INT(), Types.LONG()])
#: The record whose function yields more outputs than one call returns.
MANY_AT = 250


def records() -> list[tuple[str, int, int]]:
    """(key, seq, event time): keys interleaved unevenly, event time ascending."""
    return [(f"k{(i * i) % KEYS}", i, 1_000 + 3 * i) for i in range(RECORDS)]


class EventTime(TimestampAssigner):
    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        return value[2]


class Timed(KeyedProcessFunction):
    """Counts each key's records; reports per record the count, the key and timestamp the
    context gives; even records register an event-time timer 20 ms on, and those that are
    a third record of their key first delete the timer the key registered last. Record
    MANY_AT yields more than OUTPUTS_PER_CALL outputs. With `report`, writes at close how
    the bridge called it: `process_bundle` calls and the records they processed."""

    def __init__(self, report: str | None) -> None:
        self.report = report

    def open(self, runtime_context: Any) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.last = runtime_context.get_state(ValueStateDescriptor("last", Types.LONG()))
        self.calls = self.processed = 0
        backend = getattr(runtime_context, "backend", None)
        if backend is not None:
            original = backend.process_bundle

            def spy(records: Any, key_groups: Any, timestamps: Any, start: int,
                    read_ahead: bool) -> Any:
                self.calls += 1
                result = original(records, key_groups, timestamps, start, read_ahead)
                self.processed += len(records) - start if result[2] is None else len(result[1])
                return result

            backend.process_bundle = spy

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        timers = ctx.timer_service()
        if value[1] % 2 == 0:  # odd records touch no timer: Java never selects them
            if n % 3 == 0 and self.last.value() is not None:
                timers.delete_event_time_timer(self.last.value() + 20)
            timers.register_event_time_timer(value[2] + 20)
            self.last.update(ctx.timestamp())
        yield repr(("record", value[0], value[1], n, ctx.get_current_key(), ctx.timestamp(),
                    timers.current_watermark() < value[2]))
        if value[1] == MANY_AT:
            for i in range(OUTPUTS_PER_CALL + 5):
                yield repr(("many", value[0], i))
            timers.register_event_time_timer(value[2] + 21)  # after the first outputs

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield repr(("timer", ctx.get_current_key(), timestamp, self.count.value()))

    def close(self) -> None:
        if self.report:
            with open(self.report, "a") as out:
                out.write(f"{self.calls} {self.processed}\n")


class WithTimestamp(ProcessFunction):
    """Each output with the timestamp it carries."""

    def process_element(self, value: Any, ctx: Any) -> Any:
        yield repr((ast.literal_eval(value), ctx.timestamp()))


def run(tmp_path: Path, options: dict[str, str] | None) -> list[Any]:
    """The job at parallelism 1 (outputs arrive in the order they were emitted); `options`
    None runs it on PyFlink's own keyed state. No periodic watermarks: the timers fire at
    the end of input, in the order of their (distinct) timestamps, in both runs."""
    env = thread_mode_env(1, {"pipeline.auto-watermark-interval": "0"})
    env.enable_checkpointing(200)
    stream = env.from_collection(records(), type_info=ROW).assign_timestamps_and_watermarks(
        WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(EventTime()))
    keyed = stream.key_by(lambda r: r[0], key_type=Types.STRING())
    if options is None:
        out = keyed.process(Timed(None), output_type=Types.STRING())
    else:
        out = pyflink_ndb.process(keyed, Timed(str(tmp_path / "report.txt")),
                                  output_type=Types.STRING(), uid="timed", options=options)
    tagged = out.process(WithTimestamp(), output_type=Types.STRING())
    with tagged.execute_and_collect() as results:
        return [ast.literal_eval(line) for line in results]


def test_bundles_give_each_record_its_own_key_timestamp_timers_and_outputs(tmp_path):
    options = {"state.backend.ndb.url": f"sqlite:///{tmp_path / 'state.sqlite'}",
               "state.backend.ndb.namespace": "bundles",
               "state.backend.ndb.bundle.records": "64",
               "state.backend.ndb.bundle.max-wait-ms": "50"}
    got = run(tmp_path, options)
    expected = run(tmp_path, None)

    assert got == expected
    assert sum(1 for (line, _ts) in got if line[0] == "many") == OUTPUTS_PER_CALL + 5
    timers = [line for (line, _ts) in got if line[0] == "timer"]
    registered = RECORDS // 2 + 1
    assert registered // 2 < len(timers) < registered, "some timers were deleted"
    for (line, ts) in got:
        if line[0] == "record":
            assert line[4] == line[1] and line[5] == ts == 1_000 + 3 * line[2], line

    calls, processed = map(int, (tmp_path / "report.txt").read_text().split())
    assert processed == RECORDS
    assert calls <= RECORDS / 8, f"{calls} calls for {RECORDS} records: not bundled"


class Slow(MapFunction):
    """Passes records on; waits `pause_s` before the record `at` (the source's thread)."""

    def __init__(self, at: int, pause_s: float) -> None:
        self.at, self.pause_s = at, pause_s

    def map(self, value: Any) -> Any:
        if value[1] == self.at:
            time.sleep(self.pause_s)
        return value


class Session(KeyedProcessFunction):
    """The session-timeout pattern: each record deletes its key's pending processing-time
    timeout and registers a new one TIMEOUT_MS on; a timeout reports whether it is the
    one the key registered last."""

    def open(self, runtime_context: Any) -> None:
        self.timeout = runtime_context.get_state(ValueStateDescriptor("t", Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        timers = ctx.timer_service()
        old = self.timeout.value()
        if old is not None:
            timers.delete_processing_time_timer(old)
        new = timers.current_processing_time() + TIMEOUT_MS
        timers.register_processing_time_timer(new)
        self.timeout.update(new)
        yield repr(("record", value[1]))

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        yield repr(("timeout", timestamp == self.timeout.value()))


TIMEOUT_MS = 300


@pytest.mark.parametrize("records", ["0", "100"])
def test_a_record_held_back_still_deletes_the_timeout_that_comes_due(records, tmp_path):
    """Record 0 runs alone (the first bundle holds one record) and registers a timeout;
    record 1 is then held back (the second bundle waits for two records, up to 10 s),
    until the timeout fires 300 ms later and runs it first: it deletes that timeout and
    registers the next. Record 2 comes 2 s later. Flink had taken the firing timer out of
    its queue, so the bridge skips it: only the later timeouts fire, each the key's last
    (as with one call per record, `records` 0)."""
    env = thread_mode_env(1)
    rows = [("k", i) for i in range(3)]
    stream = env.from_collection(rows, type_info=Types.TUPLE([Types.STRING(), Types.INT()]))
    slowed = stream.map(Slow(2, 2.0), output_type=Types.TUPLE([Types.STRING(), Types.INT()]))
    options = {"state.backend.ndb.url": f"sqlite:///{tmp_path / 'state.sqlite'}",
               "state.backend.ndb.namespace": "sessions",
               "state.backend.ndb.bundle.records": records,
               "state.backend.ndb.bundle.max-wait-ms": "10000"}
    out = pyflink_ndb.process(slowed.key_by(lambda r: r[0], key_type=Types.STRING()),
                              Session(), output_type=Types.STRING(), uid="sessions",
                              options=options)
    with out.execute_and_collect() as results:
        got = [ast.literal_eval(line) for line in results]
    assert [line for line in got if line[0] == "record"] == [("record", i) for i in range(3)]
    timeouts = [line for line in got if line[0] == "timeout"]
    assert timeouts and all(t == ("timeout", True) for t in timeouts), got
