"""The job-wide switch (a breaker's attack, kept): a failure thrown by a window function
itself, in the middle of the firings
that the end-of-input watermark triggers (some windows have fired and been cleared, in
memory, when it throws), on the job-wide switch with a cache of 4 entries (MariaDB).
The job restarts from the last completed checkpoint and must give exactly the expected
outputs: tumbling windows with `window_state()` and a `global_state()` counter of
firings per key, and a count window `aggregate`.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from conftest import drop_namespace, fixed_delay_restarts, thread_mode_env, unique_namespace
from pyflink.common import Time, Types, WatermarkStrategy
from pyflink.datastream import (
    CheckpointingMode,
    ProcessWindowFunction,
    RuntimeContext,
    StreamExecutionEnvironment,
)
from pyflink.datastream.connectors.number_seq import NumberSequenceSource
from pyflink.datastream.state import ListStateDescriptor, ValueStateDescriptor
from pyflink.datastream.window import TumblingEventTimeWindows
from test_switch_odd_keys_flink import HOUR, RecordAt, SumCount, Ts, make_records

import pyflink_ndb  # noqa: F401

pytestmark = pytest.mark.flink

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class FiringCounter(ProcessWindowFunction):
    """Per window: its contents' ids (window_state keeps a list of them, written at the
    firing) and the key's number of firings so far (global_state)."""

    def __init__(self, marker: str | None, fail_at: int) -> None:
        self.marker = marker
        self.fail_at = fail_at

    def open(self, runtime_context: RuntimeContext) -> None:
        self.armed = (self.marker is not None and runtime_context.get_attempt_number() == 0
                      and runtime_context.get_index_of_this_subtask() == 0)
        self.firings = 0

    def process(self, key: Any, context: Any, elements: Any) -> Any:
        ids = sorted(e[0] for e in elements)
        seen = context.window_state().get_list_state(ListStateDescriptor("ids", Types.LONG()))
        seen.add_all(ids)
        fired = context.global_state().get_state(ValueStateDescriptor("fired", Types.LONG()))
        n = (fired.value() or 0) + 1
        fired.update(n)
        if self.armed:
            self.firings += 1
            if self.firings == self.fail_at:
                Path(self.marker).write_text("failed\n")
                raise RuntimeError("injected failure in a window firing")
        yield ("fire", repr(key), context.window().start, tuple(ids),
               tuple(sorted(seen.get())), n)

    def clear(self, context: Any) -> None:
        context.window_state().get_list_state(ListStateDescriptor("ids", Types.LONG())).clear()


class CountAcc(ProcessWindowFunction):
    def process(self, key: Any, context: Any, elements: Any) -> Any:
        for acc in elements:
            yield ("count", repr(key), context.window().id, acc[0], acc[1])


def build(env: StreamExecutionEnvironment, records: list[Any], marker: str | None) -> Any:
    p = 2
    src = env.from_source(NumberSequenceSource(0, len(records) - 1),
                          WatermarkStrategy.no_watermarks(), "ids").uid("ids") \
        .map(RecordAt(records, marker), Types.PICKLED_BYTE_ARRAY()) \
        .assign_timestamps_and_watermarks(
            WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(Ts()))
    keyed = src.key_by(lambda r: r[1])
    outs = [
        keyed.window(TumblingEventTimeWindows.of(Time.hours(3)))
        .process(FiringCounter(marker, 40)).set_parallelism(p).uid("fire"),
        keyed.count_window(5, 2).aggregate(SumCount(), window_function=CountAcc())
        .set_parallelism(p).uid("count"),
    ]
    return outs[0].union(*outs[1:]).map(repr, Types.STRING())


def expected(records: list[Any]) -> Counter:
    want: Counter = Counter()
    per_key: dict = defaultdict(list)
    for r in records:
        per_key[repr(r[1])].append(r)
    for k, rs in per_key.items():
        windows: dict = defaultdict(list)
        for r in rs:
            windows[r[2] // (3 * HOUR) * 3 * HOUR].append(r[0])
        for n, start in enumerate(sorted(windows), 1):
            ids = tuple(sorted(windows[start]))
            want[("fire", k, start, ids, ids, n)] += 1
        # count_window(5, 2): window i holds records 2i .. 2i+4 (sliding by 2), fires
        # (CountTrigger(5), no purge) each time its count reaches 5: once
        for i in range(len(rs)):
            members = [r for j, r in enumerate(rs) if 2 * i <= j <= 2 * i + 4]
            if len(members) == 5:
                want[("count", k, i, 5, sum(r[3] for r in members))] += 1
    return want


def run(records: list[Any], extra: dict[str, str], marker: str | None) -> Counter:
    env = thread_mode_env(1, {"pipeline.auto-watermark-interval": "0",
                              **fixed_delay_restarts(2, "500 ms"), **extra})
    env.enable_checkpointing(200, CheckpointingMode.EXACTLY_ONCE)
    with build(env, records, marker).execute_and_collect() as results:
        return Counter(ast.literal_eval(line) for line in results)


def test_failure_inside_window_firings_exact(tmp_path, mysql_url):
    records = make_records(1200)
    want = expected(records)
    ns = unique_namespace("brkf")
    marker = tmp_path / "failed.txt"
    try:
        got = run(records, {"state.backend.ndb.enabled": "true",
                            "state.backend.ndb.url": mysql_url,
                            "state.backend.ndb.namespace": ns,
                            "state.backend.ndb.cache.max-entries": "4"}, str(marker))
    finally:
        drop_namespace(mysql_url, ns)
    assert marker.exists(), "the injected failure did not happen"
    problems = []
    for tag in ("fire", "count"):
        w = Counter({o: n for o, n in want.items() if o[0] == tag})
        g = Counter({o: n for o, n in got.items() if o[0] == tag})
        if w != g:
            problems.append((tag, sum(w.values()), sum(g.values()),
                             list((w - g).items())[:3], list((g - w).items())[:3]))
    assert not problems, problems
