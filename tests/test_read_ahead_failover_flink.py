"""A failure injected into a resumed job while it reads ahead (found by a breaker run):
the state committed at the end must be exact (exactly-once), checked by a third job
against a model."""

from __future__ import annotations

import ast
import sys
import time
from collections import defaultdict
from typing import Any

import cloudpickle
import pytest
from conftest import drop_namespace, unique_namespace
from pyflink.common import Configuration, Types, WatermarkStrategy
from pyflink.datastream import CheckpointingMode, KeyedProcessFunction, StreamExecutionEnvironment
from pyflink.datastream.connectors.number_seq import NumberSequenceSource
from pyflink.datastream.state import ValueStateDescriptor

import pyflink_ndb

pytestmark = pytest.mark.flink
cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = 400
PER_KEY = 5
ROW = Types.TUPLE([Types.STRING(), Types.INT(), Types.LONG()])


def records(per_key: int) -> list[tuple[str, int, int]]:
    return [(f"k{i % KEYS}", i // KEYS, i) for i in range(KEYS * per_key)]


class Counting(KeyedProcessFunction):
    def __init__(self, fail_after: int, sleep_s: float, marker: str) -> None:
        self.fail_after = fail_after
        self.sleep_s = sleep_s
        self.marker = marker

    def open(self, runtime_context: Any) -> None:
        self.attempt = runtime_context.get_attempt_number()
        self.subtask = runtime_context.get_index_of_this_subtask()
        self.backend = runtime_context.backend
        self.seen = 0
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.total = runtime_context.get_state(ValueStateDescriptor("total", Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.seen += 1
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if self.fail_after and self.attempt == 0 and self.subtask == 0 \
                and self.seen == self.fail_after:
            with open(self.marker, "a") as out:
                t = self.backend.table
                out.write(f"failing {t.read_ahead_queries} {t.read_ahead_entries}\n")
            raise RuntimeError("injected failure")
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        self.total.update((self.total.value() or 0) + value[2])
        yield repr((value[0], value[1], n, self.total.value()))


def run(options: dict[str, str], per_key: int, fail_after: int, sleep_s: float,
        marker: str) -> list[Any]:
    config = Configuration()
    config.set_string("python.execution-mode", "thread")
    config.set_string("python.executable", sys.executable)
    if fail_after:
        config.set_string("restart-strategy.type", "fixed-delay")
        config.set_string("restart-strategy.fixed-delay.attempts", "1")
        config.set_string("restart-strategy.fixed-delay.delay", "500 ms")
    else:
        config.set_string("restart-strategy.type", "none")
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(2)
    env.enable_checkpointing(200, CheckpointingMode.EXACTLY_ONCE)
    # A replayable source: PyFlink's from_collection (an InputFormatSourceFunction) keeps
    # no position in checkpoints and replays everything after a restore, which no state
    # backend can make exactly-once. One subtask, so that each key's records keep their
    # order.
    stream = env.from_source(NumberSequenceSource(0, KEYS * per_key - 1),
                             WatermarkStrategy.no_watermarks(), "sequence") \
        .set_parallelism(1) \
        .map(lambda i: (f"k{i % KEYS}", i // KEYS, i), output_type=ROW).set_parallelism(1)
    keyed = stream.key_by(lambda r: r[0], key_type=Types.STRING())
    out = pyflink_ndb.process(keyed, Counting(fail_after, sleep_s, marker),
                              output_type=Types.STRING(), uid="read-ahead-failover",
                              options=options)
    with out.execute_and_collect() as results:
        return [ast.literal_eval(line) for line in results]


@pytest.mark.parametrize(("kind", "records_opt"), [("mysql", "100"), ("sqlite", "1")])
def test_failure_while_reading_ahead_then_exact_state(kind, records_opt, tmp_path, mysql_url):
    namespace = unique_namespace("rabf")
    url = mysql_url if kind == "mysql" else f"sqlite:///{tmp_path / 'state.sqlite'}"
    options = {"state.backend.ndb.url": url, "state.backend.ndb.namespace": namespace,
               "state.backend.ndb.on-fresh-start": "truncate",
               "state.backend.ndb.read-ahead.records": records_opt,
               "state.backend.ndb.cache.max-entries": "64"}
    marker = str(tmp_path / "marker.txt")
    try:
        run(options, PER_KEY, 0, 0.0, marker)
        options["state.backend.ndb.on-fresh-start"] = "resume"
        second = run(options, PER_KEY, 700, 0.002, marker)
        third = run(options, 1, 0, 0.0, marker)
    finally:
        if kind == "mysql":
            drop_namespace(mysql_url, namespace)
    assert "failing" in open(marker).read(), "the failure was injected"
    model_total: dict[str, int] = defaultdict(int)
    for _ in range(2):
        for key, _seq, ts in records(PER_KEY):
            model_total[key] += ts
    # second job's output (collect sink with checkpoints: exactly-once after restart)
    per_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for key, seq, n, _t in second:
        per_key[key].append((seq, n))
    bad = {k: v for k, v in per_key.items()
           if v != [(s, PER_KEY + s + 1) for s in range(PER_KEY)]}
    assert not bad, list(bad.items())[:5]
    # third job: state after the second
    assert len(third) == KEYS
    wrong = []
    for key, _seq, n, total in third:
        if n != 2 * PER_KEY + 1 or total != model_total[key] + int(key[1:]):
            wrong.append((key, n, total, model_total[key] + int(key[1:])))
    assert not wrong, (len(wrong), wrong[:5])
