"""Bundles (a breaker's attack that found them sound): a source that pauses (no
records, no watermark, no barrier for 4 s) while the
bridge holds a bundle back that is far from full (`bundle.records` 1000): the held-back
records must leave after `bundle.max-wait-ms`, not when the source resumes."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from conftest import drop_namespace, thread_mode_env, unique_namespace
from pyflink.common import Types, WatermarkStrategy
from pyflink.datastream import KeyedProcessFunction, MapFunction
from pyflink.datastream.connectors.number_seq import NumberSequenceSource
from pyflink.datastream.functions import SinkFunction
from pyflink.datastream.state import ValueStateDescriptor

import pyflink_ndb

pytestmark = pytest.mark.flink
cloudpickle.register_pickle_by_value(sys.modules[__name__])

PAUSE_S = 4.0
ROW = Types.TUPLE([Types.STRING(), Types.LONG()])


class PauseAt(MapFunction):
    def __init__(self, at: int, path: str) -> None:
        self.at, self.path = at, path

    def map(self, i: Any) -> Any:
        if i == self.at:
            with open(self.path, "w") as out:
                out.write(repr(time.time()))
            time.sleep(PAUSE_S)
        return (f"k{i % 3}", i)


class Count(KeyedProcessFunction):
    def open(self, runtime_context: Any) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("n", Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield value[1]


class Stamp(MapFunction):
    def __init__(self, path: str) -> None:
        self.path = path

    def open(self, runtime_context: Any) -> None:
        self.handle = open(self.path, "a")

    def map(self, value: Any) -> Any:
        self.handle.write(f"{value} {time.time()}\n")
        self.handle.flush()
        return value

    def close(self) -> None:
        self.handle.close()


@pytest.mark.parametrize("bundle", ["1000", "100"])
def test_held_back_records_leave_while_the_source_pauses(bundle, tmp_path: Path, mysql_url):
    namespace = unique_namespace("brki")
    paused, stamps = tmp_path / "paused.txt", tmp_path / "stamps.txt"
    env = thread_mode_env(1)
    env.enable_checkpointing(600_000)
    stream = env.from_source(NumberSequenceSource(0, 9), WatermarkStrategy.no_watermarks(),
                             "seq").map(PauseAt(5, str(paused)), output_type=ROW)
    options = {"state.backend.ndb.url": mysql_url, "state.backend.ndb.namespace": namespace,
               "state.backend.ndb.bundle.records": bundle,
               "state.backend.ndb.bundle.max-wait-ms": "50"}
    out = pyflink_ndb.process(stream.key_by(lambda r: r[0], key_type=Types.STRING()),
                              Count(), output_type=Types.LONG(), uid="count",
                              options=options).set_parallelism(2)
    out.map(Stamp(str(stamps)), output_type=Types.LONG()).set_parallelism(1).add_sink(
        SinkFunction("org.apache.flink.streaming.api.functions.sink.DiscardingSink"))
    try:
        env.execute("breaker-idle")
    finally:
        drop_namespace(mysql_url, namespace)
    pause_start = float(paused.read_text())
    seen = {int(a): float(b) for a, b in (x.split() for x in stamps.read_text().splitlines())}
    assert sorted(seen) == list(range(10))
    late = {i: round(seen[i] - pause_start, 2) for i in range(5)
            if seen[i] > pause_start + PAUSE_S - 1.0}
    assert not late, f"records held back until the source resumed: {late}"
