"""Records processed in bundles (`state.backend.ndb.bundle.records`) on Flink's MiniCluster:
the bridge holds records back and hands each bundle to Python in one call. What a job sees
must not change: every record's state, key (`ctx.get_current_key()`), timestamp
(`ctx.timestamp()`), its outputs in order with the record's timestamp, its timers
registered and deleted for its own key, and event-time timers that fire only after the
records their watermark covers. The reference is the same job on PyFlink's own keyed
state (no pyflink-ndb), record for record."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from conftest import thread_mode_env
from pyflink.common import Types, WatermarkStrategy
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import KeyedProcessFunction, ProcessFunction
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
    context gives; registers an event-time timer 20 ms on, and every third record of a
    key deletes the timer the key's previous record registered. Record MANY_AT yields more than
    OUTPUTS_PER_CALL outputs. With `report`, writes at close how the bridge called it:
    `process_bundle` calls and the records they processed."""

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
        timers.register_event_time_timer(value[2] + 20)
        if n % 3 == 0:
            timers.delete_event_time_timer(self.last.value() + 20)
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
    deleted = sum(1 for (line, _ts) in got if line[0] == "record" and line[3] % 3 == 0)
    assert len(timers) == RECORDS + 1 - deleted, "each timer fired once, deleted ones not"
    for (line, ts) in got:
        if line[0] == "record":
            assert line[4] == line[1] and line[5] == ts == 1_000 + 3 * line[2], line

    calls, processed = map(int, (tmp_path / "report.txt").read_text().split())
    assert processed == RECORDS
    assert calls <= RECORDS / 8, f"{calls} calls for {RECORDS} records: not bundled"
