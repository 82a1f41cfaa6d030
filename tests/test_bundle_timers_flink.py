"""Bundles: event-time timers with out-of-order records and periodic watermarks while
records come in bundles, on Row keys (positional and named). Checked at parallelism 1,
outputs in emission order:

* records are processed in arrival order, and the watermark a record sees never exceeds
  what the source could have emitted before it (max event time before it, minus the
  bound, minus 1);
* a timer fires only once the watermark passed it, after every record whose watermark is
  older, before every record whose watermark is newer; it fires for a key that registered
  it, and sees exactly the count of that key's records emitted before it;
* the timers that fire at the end of input (far in the future) report the final state,
  equal to the same job on PyFlink's own keyed state.
"""

from __future__ import annotations

import ast
import random
import sys
import time
from collections import defaultdict
from typing import Any

import cloudpickle
import pytest
from conftest import drop_namespace, thread_mode_env, unique_namespace
from pyflink.common import Duration, Row, Types, WatermarkStrategy
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import KeyedProcessFunction, MapFunction
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

import pyflink_ndb

pytestmark = pytest.mark.flink
cloudpickle.register_pickle_by_value(sys.modules[__name__])

RECORDS = 3000
BOUND_MS = 30
FAR = 10 ** 12
ROW = Types.TUPLE([Types.STRING(), Types.INT(), Types.LONG()])
KEY_TYPES = {
    "row": Types.ROW([Types.STRING(), Types.INT()]),
    "row-named": Types.ROW_NAMED(["name", "part"], [Types.STRING(), Types.INT()]),
}


def records() -> list[tuple[str, int, int]]:
    rnd = random.Random(7)
    return [(f"u{rnd.randrange(9)}", i, 10_000 + 2 * i - rnd.randrange(25))
            for i in range(RECORDS)]


class EventTime(TimestampAssigner):
    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        return value[2]


class Slow(MapFunction):
    def map(self, value: Any) -> Any:
        if value[1] % 10 == 0:
            time.sleep(0.002)
        return value


def key_text(key: Any) -> str:
    return repr(tuple(key))


class Timers(KeyedProcessFunction):
    def open(self, runtime_context: Any) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("n", Types.LONG()))
        self.pending = runtime_context.get_map_state(
            MapStateDescriptor("pending", Types.LONG(), Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        timers = ctx.timer_service()
        wm = timers.current_watermark()
        t = value[2] + 7
        if n % 4 == 0:
            # delete the last one registered, if it is still pending
            for old in list(self.pending.keys()):
                if old > wm:
                    timers.delete_event_time_timer(old)
                    self.pending.remove(old)
                    break
        timers.register_event_time_timer(t)
        self.pending.put(t, value[1])
        if n == 1:
            timers.register_event_time_timer(FAR + value[1])
        yield repr(("r", key_text(ctx.get_current_key()), value[1], n, wm, ctx.timestamp()))

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        wm = ctx.timer_service().current_watermark()
        key = key_text(ctx.get_current_key())
        if timestamp >= FAR:
            yield repr(("final", key, self.count.value(), sorted(self.pending.keys())[:3]))
            return
        registered = self.pending.contains(timestamp)
        if registered:
            self.pending.remove(timestamp)
        yield repr(("t", key, timestamp, self.count.value(), wm, registered))


def run(key_type: Any, options: dict[str, str] | None) -> list[Any]:
    env = thread_mode_env(1, {"pipeline.auto-watermark-interval": "3"})
    stream = env.from_collection(records(), type_info=ROW).map(Slow(), output_type=ROW) \
        .assign_timestamps_and_watermarks(
            WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(BOUND_MS))
            .with_timestamp_assigner(EventTime()))
    keyed = stream.key_by(lambda r: Row(r[0], r[1] % 2), key_type=key_type)
    if options is None:
        out = keyed.process(Timers(), output_type=Types.STRING())
    else:
        out = pyflink_ndb.process(keyed, Timers(), output_type=Types.STRING(), uid="timers",
                                  options=options)
    with out.execute_and_collect() as results:
        return [ast.literal_eval(line) for line in results]


def check_invariants(got: list[Any]) -> None:
    recs = records()
    ts_of = {seq: ts for _k, seq, ts in recs}
    key_of = {seq: repr((k, seq % 2)) for k, seq, _ts in recs}
    max_before = {}
    m = -(2 ** 63)
    for _k, seq, ts in recs:
        max_before[seq] = m
        m = max(m, ts)
    seqs = [line[2] for line in got if line[0] == "r"]
    assert seqs == list(range(RECORDS)), "records in arrival order, each once"
    counts: dict[str, int] = defaultdict(int)
    last_wm = -(2 ** 63)
    problems = []
    for line in got:
        if line[0] == "r":
            _, key, seq, n, wm, ts = line
            counts[key] += 1
            if key != key_of[seq] or ts != ts_of[seq] or n != counts[key]:
                problems.append(("record context", line))
            if wm > max(max_before[seq] - BOUND_MS - 1, -(2 ** 63)):
                problems.append(("record saw a later watermark", line, max_before[seq]))
            if wm < last_wm:
                problems.append(("record saw an older watermark than a timer before it",
                                 line, last_wm))
        elif line[0] == "t":
            _, key, t, n, wm, registered = line
            if wm < t:
                problems.append(("timer fired before its watermark", line))
            if n != counts[key]:
                problems.append(("timer saw another count", line, counts[key]))
            if not registered:
                problems.append(("timer fired that its key did not register / deleted",
                                 line))
            last_wm = max(last_wm, wm)
    assert not problems, (len(problems), problems[:5])


@pytest.mark.parametrize("key_kind", list(KEY_TYPES))
def test_event_time_timers_in_bundles(key_kind, mysql_url):
    namespace = unique_namespace("brkt")
    options = {"state.backend.ndb.url": mysql_url, "state.backend.ndb.namespace": namespace,
               "state.backend.ndb.bundle.records": "50",
               "state.backend.ndb.bundle.max-wait-ms": "20",
               "state.backend.ndb.cache.max-entries": "8"}
    try:
        got = run(KEY_TYPES[key_kind], options)
    finally:
        drop_namespace(mysql_url, namespace)
    check_invariants(got)
    last_record = max(i for i, line in enumerate(got) if line[0] == "r")
    early = sum(1 for line in got[:last_record] if line[0] == "t")
    assert early > 100, f"only {early} timers fired while records flowed"
    expected = run(KEY_TYPES[key_kind], None)
    check_invariants(expected)
    finals = sorted(line for line in got if line[0] == "final")
    assert finals == sorted(line for line in expected if line[0] == "final")
    assert len(finals) == 18


class SlowAt(MapFunction):
    """Passes records on; waits `pause_s` before the record `at`."""

    def __init__(self, at: int, pause_s: float) -> None:
        self.at, self.pause_s = at, pause_s

    def map(self, value: Any) -> Any:
        if value[1] == self.at:
            time.sleep(self.pause_s)
        return value


TIMEOUT_MS = 300
MANY = 1100  # more outputs than one bundle call returns (OUTPUTS_PER_CALL, 1,024)


class ChattySession(KeyedProcessFunction):
    """The session-timeout pattern, where record 1 first yields MANY outputs and only then
    deletes its key's pending timeout and registers the next one."""

    def open(self, runtime_context: Any) -> None:
        self.timeout = runtime_context.get_state(ValueStateDescriptor("t", Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        if value[1] == 1:
            for i in range(MANY):
                yield repr(("many", i))
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


@pytest.mark.parametrize("bundle", ["0", "100"])
def test_record_with_many_outputs_still_deletes_the_timeout_that_comes_due(bundle, mysql_url):
    """Record 0 runs alone and registers a timeout; record 1 is held back (the second
    bundle waits for two records, up to 10 s) until that timeout comes due and runs it
    first. Record 1 arrived before the timeout fired: like one call per record (and like
    the same record without its many outputs, tests/test_bundle_flink.py), its delete must
    cancel that firing, so every timeout that fires is its key's last one."""
    namespace = unique_namespace("brkp")
    env = thread_mode_env(1)
    rows = [("k", i, 0) for i in range(3)]
    stream = env.from_collection(rows, type_info=ROW).map(SlowAt(2, 2.0), output_type=ROW)
    options = {"state.backend.ndb.url": mysql_url, "state.backend.ndb.namespace": namespace,
               "state.backend.ndb.bundle.records": bundle,
               "state.backend.ndb.read-ahead.records": "0",
               "state.backend.ndb.bundle.max-wait-ms": "10000"}
    try:
        out = pyflink_ndb.process(stream.key_by(lambda r: r[0], key_type=Types.STRING()),
                                  ChattySession(), output_type=Types.STRING(),
                                  uid="chatty", options=options)
        with out.execute_and_collect() as results:
            got = [ast.literal_eval(line) for line in results]
    finally:
        drop_namespace(mysql_url, namespace)
    assert [line for line in got if line[0] == "record"] == [("record", i) for i in range(3)]
    assert sum(1 for line in got if line[0] == "many") == MANY
    timeouts = [line for line in got if line[0] == "timeout"]
    assert timeouts and all(t == ("timeout", True) for t in timeouts), timeouts
