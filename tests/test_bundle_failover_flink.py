"""Bundles (a breaker's attack that found them sound): a task failure thrown in the
middle of a bundle (its 37th record), then a
restart from the last completed checkpoint, with a function that reads and updates four
state kinds per record and keys of many types (pickled keys: tuples, None, bools, ints,
floats, -0.0). Every output (collect sink: exactly-once with checkpoints) and so every
state it reports must equal a model of one pass over the input."""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from typing import Any

import cloudpickle
import pytest
from conftest import drop_namespace, fixed_delay_restarts, thread_mode_env, unique_namespace
from pyflink.common import Types, WatermarkStrategy
from pyflink.datastream import (
    CheckpointingMode,
    KeyedProcessFunction,
    ReduceFunction,
)
from pyflink.datastream.connectors.number_seq import NumberSequenceSource
from pyflink.datastream.state import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)

import pyflink_ndb

pytestmark = pytest.mark.flink
cloudpickle.register_pickle_by_value(sys.modules[__name__])

RECORDS = 4000
KEYS: list[Any] = [("a", 1), ("a", None), None, (None,), True, 1, 1.0, 0.0, -0.0, "x",
                   "", b"x", ("x",), (1, (2, 3)), frozenset({1, 2}), 7, -7, 2 ** 70]


def key_of(i: int) -> Any:
    return KEYS[(i * 7 + i // 13) % len(KEYS)]


class Sum(ReduceFunction):
    def reduce(self, a: Any, b: Any) -> Any:
        return a + b


class FourStates(KeyedProcessFunction):
    def __init__(self, marker: str, fail_at_index: int) -> None:
        self.marker = marker
        self.fail_at_index = fail_at_index

    def open(self, runtime_context: Any) -> None:
        self.attempt = runtime_context.get_attempt_number()
        self.backend = runtime_context.backend
        self.seen = 0
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.by_mod = runtime_context.get_map_state(
            MapStateDescriptor("by_mod", Types.INT(), Types.LONG()))
        self.recent = runtime_context.get_list_state(ListStateDescriptor("recent", Types.LONG()))
        self.total = runtime_context.get_reducing_state(
            ReducingStateDescriptor("total", Sum(), Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.seen += 1
        time.sleep(0.0004)
        bundle = self.backend.bundle
        if (self.attempt == 0 and self.seen >= RECORDS // 4 and bundle is not None
                and bundle.index == self.fail_at_index
                and not os.path.exists(self.marker)):
            with open(self.marker, "w") as out:
                out.write(f"failing at bundle index {bundle.index} after {self.seen}\n")
            raise RuntimeError("injected failure in the middle of a bundle")
        seq = value[1]
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        m = seq % 5
        self.by_mod.put(m, (self.by_mod.get(m) or 0) + 1)
        self.recent.add(seq)
        recent = list(self.recent.get())
        if len(recent) > 4:
            self.recent.update(recent[-4:])
        self.total.add(seq)
        yield (repr(ctx.get_current_key()), seq, n, sorted(self.by_mod.items()),
               list(self.recent.get()), self.total.get())


def run(options: dict[str, str], marker: str, fail_at_index: int) -> list[Any]:
    env = thread_mode_env(2, fixed_delay_restarts(1, "200 ms"))
    env.enable_checkpointing(150, CheckpointingMode.EXACTLY_ONCE)
    stream = env.from_source(NumberSequenceSource(0, RECORDS - 1),
                             WatermarkStrategy.no_watermarks(), "seq").set_parallelism(1) \
        .map(lambda i: (key_of(i), i)).set_parallelism(1)
    keyed = stream.key_by(lambda r: r[0])
    out = pyflink_ndb.process(keyed, FourStates(marker, fail_at_index), uid="four-states",
                              options=options)
    with out.execute_and_collect() as results:
        return list(results)


def model() -> dict[str, list[Any]]:
    per_key: dict[str, list[Any]] = defaultdict(list)
    count: dict[Any, int] = defaultdict(int)
    by_mod: dict[Any, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    recent: dict[Any, list[int]] = defaultdict(list)
    total: dict[Any, int] = defaultdict(int)
    for i in range(RECORDS):
        k = repr(key_of(i))
        count[k] += 1
        by_mod[k][i % 5] += 1
        recent[k] = (recent[k] + [i])[-4:]
        total[k] += i
        per_key[k].append((k, i, count[k], sorted(by_mod[k].items()), list(recent[k]),
                           total[k]))
    return per_key


@pytest.mark.parametrize("bundle", ["100", "1000", "1"])
def test_failure_in_the_middle_of_a_bundle_then_exact_state(bundle, tmp_path, mysql_url):
    namespace = unique_namespace("brkf")
    marker = str(tmp_path / "marker.txt")
    options = {"state.backend.ndb.url": mysql_url, "state.backend.ndb.namespace": namespace,
               "state.backend.ndb.bundle.records": bundle,
               "state.backend.ndb.bundle.max-wait-ms": "1",
               "state.backend.ndb.cache.max-entries": "4"}
    fail_at = 0 if bundle == "1" else 36
    try:
        got = run(options, marker, fail_at)
    finally:
        drop_namespace(mysql_url, namespace)
    assert os.path.exists(marker), "the failure was injected"
    per_key: dict[str, list[Any]] = defaultdict(list)
    for k, seq, n, mods, recent, total in got:
        per_key[k].append((k, seq, n, [tuple(x) for x in mods], list(recent), total))
    expected = model()
    for k in expected:
        expected[k] = [(a, b, c, [tuple(x) for x in d], e, f) for a, b, c, d, e, f in expected[k]]
    wrong = {k: (len(per_key.get(k, [])), len(v)) for k, v in expected.items()
             if per_key.get(k) != v}
    first = next(iter(wrong), None)
    detail = None
    if first is not None:
        pairs = zip(per_key.get(first, []), expected[first], strict=False)
        detail = [(g, e) for g, e in pairs if g != e][:2]
    assert not wrong and set(per_key) == set(expected), (wrong, detail)
