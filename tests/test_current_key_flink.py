"""`ctx.get_current_key()` answered from the record (pyflink_ndb/_pyflink.py,
`answer_key_from_record`) on a MiniCluster, against Java's own answer
(`type(ctx).get_current_key(ctx)`); tests/test_read_ahead_keys_flink.py covers six key
types on a KeyedProcessFunction. Both tests here were written by a breaker helper:

* a function that changes the key `Row` it got (reusing it as an output row) still gets
  the record's key on its next call, as PyFlink's answer from Java is a new object per
  call. The context used to hand out the backend's own key object, so the next call
  returned the changed Row;
* a KeyedCoProcessFunction (both inputs) and a KeyedBroadcastProcessFunction (through the
  switch), with Row keys, object reuse and event-time timers registered per record: the
  record contexts answer from the record, and every answer equals Java's, also for a
  record context kept and asked later (in `on_timer`, in `process_broadcast_element`).
"""

from __future__ import annotations

import sys
from typing import Any

import cloudpickle
import pytest
from conftest import thread_mode_env, unique_namespace
from pyflink.common import Row, Types, WatermarkStrategy
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import (
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
)
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

import pyflink_ndb

pytestmark = pytest.mark.flink
cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEY_TYPE = Types.ROW([Types.STRING(), Types.INT()])
REC = Types.TUPLE([Types.STRING(), Types.INT()])


class KeyAsOutput(KeyedProcessFunction):
    """Changes the key Row it got, then asks again; emits both answers of the second ask
    (from the record, and Java's own) and whether the context answers from the record."""

    def open(self, runtime_context: Any) -> None:
        self.n = runtime_context.get_state(ValueStateDescriptor("n", Types.LONG()))
        self.backend = runtime_context.backend

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = (self.n.value() or 0) + 1
        self.n.update(n)
        out = ctx.get_current_key()
        out[1] = -n  # reuse the key Row as an output row
        yield repr(tuple(out))
        # In a bundle (`bundle.records`) Java's current record is this one only once the
        # bridge selected it (as it does before a timer call): then ask Java.
        self.backend.select_bundle_record()
        yield repr(("key", repr(ctx.get_current_key()), repr(type(ctx).get_current_key(ctx)),
                    "get_current_key" in vars(ctx)))


def test_a_function_that_changes_the_key_it_got_gets_the_record_key_again(tmp_path):
    """Every record: the context answers from the record, its second `get_current_key()`
    equals Java's answer, not the Row the function changed; and the changed Rows came out
    as the function made them."""
    env = thread_mode_env(1)
    stream = env.from_collection([(f"k{i % 3}", i % 2) for i in range(12)], type_info=REC)
    keyed = stream.key_by(lambda r: Row(r[0], r[1]), key_type=KEY_TYPE)
    options = {"state.backend.ndb.url": f"sqlite:///{tmp_path / 's.sqlite'}",
               "state.backend.ndb.namespace": unique_namespace("ckm"),
               "state.backend.ndb.on-fresh-start": "truncate"}
    out = pyflink_ndb.process(keyed, KeyAsOutput(), output_type=Types.STRING(),
                              uid="key-copy", options=options)
    with out.execute_and_collect() as results:
        lines = [eval(line) for line in results]  # noqa: S307
    keys = [o for o in lines if o[0] == "key"]
    assert len(keys) == 12
    wrong = [o for o in keys if o[1] != o[2]]
    assert not wrong, f"get_current_key() after modifying its result: {wrong[:3]}"
    changed = [o for o in lines if o[0] != "key"]
    assert len(changed) == 12 and all(o[1] < 0 for o in changed)
    assert all(o[3] for o in keys), "the context did not answer from the record"


N = 400
REC3 = Types.TUPLE([Types.STRING(), Types.INT(), Types.LONG()])


class Ts(TimestampAssigner):
    """Event time: field 2 of the record."""

    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        return int(value[2])


def key_of(ctx: Any) -> tuple[str, str, bool]:
    """(the context's answer, Java's answer, whether the context answers from the
    record)."""
    return (repr(ctx.get_current_key()), repr(type(ctx).get_current_key(ctx)),
            "get_current_key" in vars(ctx))


class Co(KeyedCoProcessFunction):
    """Per record of either input: a count, an event-time timer, the key asked twice;
    per timer: the timer context's key and the last record context's."""

    def open(self, runtime_context: Any) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("n", Types.LONG()))
        self.rctx = None

    def _one(self, tag: str, value: Any, ctx: Any) -> Any:
        self.rctx = ctx
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        ctx.timer_service().register_event_time_timer(ctx.timestamp() + 1)
        a, j, answered = key_of(ctx)
        yield repr((tag, a, j, answered))
        a2, j2, _ = key_of(ctx)  # asked again after the timer registration
        yield repr((tag + "-again", a2, j2, answered))

    def process_element1(self, value: Any, ctx: Any) -> Any:
        yield from self._one("in1", value, ctx)

    def process_element2(self, value: Any, ctx: Any) -> Any:
        yield from self._one("in2", value, ctx)

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        a, j, _ = key_of(ctx)
        yield repr(("timer", a, j, True))
        if self.rctx is not None:  # the record context, asked during a timer
            a, j, answered = key_of(self.rctx)
            yield repr(("timer-rctx", a, j, answered))


class Bc(KeyedBroadcastProcessFunction):
    """As :class:`Co`, and the last record context asked during a broadcast element."""

    def open(self, runtime_context: Any) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("n", Types.LONG()))
        self.rctx = None

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.rctx = ctx
        self.count.update((self.count.value() or 0) + 1)
        ctx.timer_service().register_event_time_timer(ctx.timestamp() + 1)
        a, j, answered = key_of(ctx)
        yield repr(("bc-rec", a, j, answered))

    def process_broadcast_element(self, value: Any, ctx: Any) -> Any:
        if self.rctx is not None:
            a, j, answered = key_of(self.rctx)
            yield repr(("bc-bcast-rctx", a, j, answered))

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        a, j, _ = key_of(ctx)
        yield repr(("bc-timer", a, j, True))
        if self.rctx is not None:
            a, j, answered = key_of(self.rctx)
            yield repr(("bc-timer-rctx", a, j, answered))


def test_record_contexts_of_two_input_functions_answer_as_java_does(tmp_path):
    """Every answer equals Java's, the record contexts answer from the record, and every
    kind of call (both inputs, timers, the broadcast side) happened."""
    env = thread_mode_env(2, {
        "pipeline.object-reuse": "true", "state.backend.ndb.enabled": "true",
        "state.backend.ndb.url": f"sqlite:///{tmp_path / 'state.sqlite'}",
        "state.backend.ndb.namespace": unique_namespace("ck2"),
        "state.backend.ndb.on-fresh-start": "truncate"})
    wm = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(Ts())
    s1 = env.from_collection([(f"a{i % 37}", i % 5, i) for i in range(N)], type_info=REC3) \
        .assign_timestamps_and_watermarks(wm)
    s2 = env.from_collection([(f"a{i % 41}", i % 5, i) for i in range(N)], type_info=REC3) \
        .assign_timestamps_and_watermarks(wm)
    k1 = s1.key_by(lambda r: Row(r[0], r[1]), key_type=KEY_TYPE)
    k2 = s2.key_by(lambda r: Row(r[0], r[1]), key_type=KEY_TYPE)
    co = k1.connect(k2).process(Co(), output_type=Types.STRING())
    rules = env.from_collection([f"r{i}" for i in range(20)], type_info=Types.STRING()) \
        .broadcast(MapStateDescriptor("rules", Types.STRING(), Types.STRING()))
    bc = s1.key_by(lambda r: Row(r[0], r[1]), key_type=KEY_TYPE).connect(rules) \
        .process(Bc(), output_type=Types.STRING())
    with co.union(bc).execute_and_collect() as results:
        out = [eval(line) for line in results]  # noqa: S307
    kinds = {o[0] for o in out}
    assert {"in1", "in2", "timer", "bc-rec", "bc-timer"} <= kinds, kinds
    wrong = [o for o in out if o[1] != o[2]]
    assert not wrong, wrong[:10]
    assert all(o[3] for o in out if o[0] in ("in1", "in2", "bc-rec")), \
        "the record contexts were not answered from the backend"
