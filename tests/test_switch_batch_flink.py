"""The job-wide switch (a breaker's attack, kept): the job-wide switch in BATCH execution
mode (`RuntimeExecutionMode.BATCH`),
against PyFlink's own state and exact expected values.

In BATCH mode Flink processes a keyed broadcast function's broadcast side before its keyed
side (PyFlink's translator builds a batch operator that selects the broadcast input
first), so a function whose keyed output depends on the broadcast rules is
deterministic. Windows, keyed reduce and keyed co-process run too.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter, defaultdict
from typing import Any

import cloudpickle
import pytest
from conftest import drop_namespace, thread_mode_env, unique_namespace
from pyflink.common import Time, Types, WatermarkStrategy
from pyflink.datastream import (
    KeyedBroadcastProcessFunction,
    RuntimeContext,
    RuntimeExecutionMode,
    StreamExecutionEnvironment,
)
from pyflink.datastream.connectors.number_seq import NumberSequenceSource
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor
from pyflink.datastream.window import TumblingEventTimeWindows
from test_switch_odd_keys_flink import CoCount, Contents, RecordAt, Ts, make_records

import pyflink_ndb  # noqa: F401
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.stores.factory import open_store

pytestmark = pytest.mark.flink

cloudpickle.register_pickle_by_value(sys.modules[__name__])

RULES = MapStateDescriptor("batch-rules", Types.STRING(), Types.LONG())
THRESHOLDS = [("low", 20), ("mid", 50), ("high", 90)]


class OverThreshold(KeyedBroadcastProcessFunction):
    """Per key and rule: how many values so far were over the rule's threshold."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.counts = runtime_context.get_map_state(
            MapStateDescriptor("over", Types.STRING(), Types.LONG()))
        self.n = runtime_context.get_state(ValueStateDescriptor("n", Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = (self.n.value() or 0) + 1
        self.n.update(n)
        rules = dict(ctx.get_broadcast_state(RULES).items())
        for name, threshold in sorted(rules.items()):
            if value[3] > threshold:
                c = (self.counts.get(name) or 0) + 1
                self.counts.put(name, c)
        yield ("bcast", repr(ctx.get_current_key()), n, len(rules),
               tuple(sorted(self.counts.items())))

    def process_broadcast_element(self, value: Any, ctx: Any) -> Any:
        ctx.get_broadcast_state(RULES).put(value[0], value[1])
        return []




def build(env: StreamExecutionEnvironment, records: list[Any]) -> Any:
    p = 2
    src = env.from_source(NumberSequenceSource(0, len(records) - 1),
                          WatermarkStrategy.no_watermarks(), "ids").uid("ids") \
        .map(RecordAt(records, None), Types.PICKLED_BYTE_ARRAY()) \
        .assign_timestamps_and_watermarks(
            WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(Ts()))
    by_key = src.key_by(lambda r: r[1])
    rules = env.from_source(NumberSequenceSource(0, len(THRESHOLDS) - 1),
                            WatermarkStrategy.no_watermarks(), "rules").uid("rules") \
        .map(lambda i: THRESHOLDS[i], Types.TUPLE([Types.STRING(), Types.LONG()])) \
        .broadcast(RULES)
    outs = [
        by_key.connect(rules).process(OverThreshold()).set_parallelism(p).uid("bcast"),
        by_key.window(TumblingEventTimeWindows.of(Time.hours(2)))
        .process(Contents("tumble")).set_parallelism(p).uid("tumble"),
        src.connect(src).key_by(lambda r: r[1], lambda r: r[1]).process(CoCount())
        .set_parallelism(p).uid("co"),
        by_key.map(lambda r: (repr(r[1]), r[3])).set_parallelism(p)
        .key_by(lambda t: t[0]).reduce(lambda a, b: (a[0], a[1] + b[1])).set_parallelism(p)
        .uid("reduce").map(lambda t: ("reduce", t[0], t[1])),
    ]
    return outs[0].union(*outs[1:]).map(repr, Types.STRING())


def run(records: list[Any], extra: dict[str, str]) -> Counter:
    env = thread_mode_env(1, extra)
    env.set_runtime_mode(RuntimeExecutionMode.BATCH)
    with build(env, records).execute_and_collect() as results:
        return Counter(ast.literal_eval(line) for line in results)


def expected_bcast(records: list[Any]) -> Counter:
    want: Counter = Counter()
    per_key: dict = defaultdict(list)
    for r in records:
        per_key[repr(r[1])].append(r)
    for k, rs in per_key.items():
        counts: Counter = Counter()
        for n, r in enumerate(rs, 1):
            for name, t in THRESHOLDS:
                if r[3] > t:
                    counts[name] += 1
            want[("bcast", k, n, len(THRESHOLDS), tuple(sorted(counts.items())))] += 1
    return want


def test_batch_mode_switched_equals_pyflink_state(mysql_url):
    records = make_records(1200)
    heap = run(records, {})
    ns = unique_namespace("brkb")
    try:
        tiered = run(records, {"state.backend.ndb.enabled": "true",
                               "state.backend.ndb.url": mysql_url,
                               "state.backend.ndb.namespace": ns,
                               "state.backend.ndb.cache.max-entries": "4"})
        store = open_store(NdbStateOptions(url=mysql_url, namespace=ns))
        try:
            names = {row["state_name"] for row in store.catalog()}
        finally:
            store.close()
        # every operator ran on tiered state
        assert {"over", "n", "window-contents", "co-count", "_reduce_state"} <= names, names
    finally:
        drop_namespace(mysql_url, ns)
    problems = []
    tags = sorted({o[0] for o in heap} | {o[0] for o in tiered})
    for tag in tags:
        h = Counter({o: n for o, n in heap.items() if o[0] == tag})
        t = Counter({o: n for o, n in tiered.items() if o[0] == tag})
        if h != t:
            problems.append((tag, sum(h.values()), sum(t.values()),
                             list((h - t).items())[:3], list((t - h).items())[:3]))
    want = expected_bcast(records)
    got = Counter({o: n for o, n in tiered.items() if o[0] == "bcast"})
    if got != want:
        problems.append(("bcast vs exact", sum(want.values()), sum(got.values()),
                         list((want - got).items())[:3], list((got - want).items())[:3]))
    assert not problems, problems
