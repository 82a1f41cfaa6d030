"""Bundles: stop-with-savepoint (no drain) while the bridge holds a bundle back (bundles of
1,000 records that may wait a minute, no periodic checkpoint before the stop), then a
second job restored from that savepoint runs the rest of the same replayable source. Every
record must be counted exactly once over both jobs: the held-back records must run before
the savepoint's snapshot (else they are lost: the source resumes after them)."""

from __future__ import annotations

import ast
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from conftest import append_to, drop_namespace, thread_mode_env, unique_namespace
from pyflink.common import Types, WatermarkStrategy
from pyflink.datastream import (
    CheckpointingMode,
    KeyedProcessFunction,
    MapFunction,
)
from pyflink.datastream.connectors.number_seq import NumberSequenceSource
from pyflink.datastream.functions import SinkFunction
from pyflink.datastream.state import ValueStateDescriptor

import pyflink_ndb

pytestmark = pytest.mark.flink
cloudpickle.register_pickle_by_value(sys.modules[__name__])

RECORDS = 3000
KEYS = 37
ROW = Types.TUPLE([Types.STRING(), Types.LONG()])


class Throttle(MapFunction):
    def __init__(self, ms: float) -> None:
        self.ms = ms

    def map(self, i: Any) -> Any:
        if self.ms:
            time.sleep(self.ms / 1000)
        return (f"k{i % KEYS}", i)


class Count(KeyedProcessFunction):
    def open(self, runtime_context: Any) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("n", Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield repr((value[0], value[1], n))


def start(options: dict[str, str], path: Path, throttle_ms: float,
          extra: dict[str, str]) -> Any:
    env = thread_mode_env(1, extra)
    env.enable_checkpointing(600_000, CheckpointingMode.EXACTLY_ONCE)
    stream = env.from_source(NumberSequenceSource(0, RECORDS - 1),
                             WatermarkStrategy.no_watermarks(), "seq").uid("seq") \
        .map(Throttle(throttle_ms), output_type=ROW).uid("throttle")
    keyed = stream.key_by(lambda r: r[0], key_type=Types.STRING())
    out = pyflink_ndb.process(keyed, Count(), output_type=Types.STRING(), uid="count",
                              options=options).set_parallelism(2)
    out.map(append_to(str(path)), output_type=Types.STRING()).add_sink(
        SinkFunction("org.apache.flink.streaming.api.functions.sink.DiscardingSink"))
    return env.execute_async("breaker-savepoint")


def lines(path: Path) -> list[Any]:
    return [ast.literal_eval(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("bundle", ["1000", "100"])
def test_stop_with_savepoint_while_a_bundle_is_held_back(bundle, tmp_path, mysql_url):
    namespace = unique_namespace("brks")
    options = {"state.backend.ndb.url": mysql_url, "state.backend.ndb.namespace": namespace,
               "state.backend.ndb.bundle.records": bundle,
               "state.backend.ndb.bundle.max-wait-ms": "60000"}
    first_out, second_out = tmp_path / "first.txt", tmp_path / "second.txt"
    try:
        client = start(options, first_out, 1.0, {})
        try:
            deadline = time.monotonic() + 60
            while len(lines(first_out)) < 150 and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.35)  # a bundle is being filled now
        except BaseException:
            client.cancel().result()
            raise
        savepoint = client.stop_with_savepoint(False, str(tmp_path / "sp")).result()
        client.get_job_execution_result().result()
        first = lines(first_out)
        assert 0 < len(first) < RECORDS
        second_client = start(options, second_out, 0.0, {"execution.savepoint.path": savepoint})
        second_client.get_job_execution_result().result()
        second = lines(second_out)
    finally:
        drop_namespace(mysql_url, namespace)
    seqs = Counter(s for (_k, s, _n) in first + second)
    missing = sorted(set(range(RECORDS)) - set(seqs))
    twice = sorted(s for s, c in seqs.items() if c > 1)
    assert (missing[:10], twice[:10]) == ([], []), (len(first), len(second), len(missing))
    final: dict[str, int] = {}
    for k, _s, n in first + second:
        final[k] = max(final.get(k, 0), n)
    expected = Counter(f"k{i % KEYS}" for i in range(RECORDS))
    assert final == dict(expected)
