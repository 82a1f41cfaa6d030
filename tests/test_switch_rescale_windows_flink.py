"""The job-wide switch (a breaker's attack, kept): the switched job of
test_switch_odd_keys_flink (odd keys; tumbling, count and
session windows; keyed co-process; keyed broadcast; keyed reduce; cache of 4 entries) on
MariaDB, stopped with a savepoint mid-stream (no drain) and restored at another keyed
parallelism (2 -> 3, 3 -> 1), and from the same savepoint once more at a third one. The
union of the first run's outputs and each restored run's must equal the exact expected
outputs (windows fire only at the end of input of the second run; count windows,
co-process, broadcast and reduce outputs are per record)."""

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
from pyflink.datastream import CheckpointingMode, MapFunction
from pyflink.datastream.functions import SinkFunction
from test_switch_odd_keys_flink import build, diff, expected, make_records

import pyflink_ndb  # noqa: F401  (installs the switch)
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.stores.factory import open_store

pytestmark = pytest.mark.flink

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Throttle(MapFunction):
    def __init__(self, ms: float) -> None:
        self.ms = ms

    def map(self, value: Any) -> Any:
        if self.ms:
            time.sleep(self.ms / 1000)
        return value




def start(records: list[Any], p: int, extra: dict[str, str], path: Path,
          throttle_ms: float) -> Any:
    env = thread_mode_env(1, {"pipeline.auto-watermark-interval": "0", **extra})
    env.enable_checkpointing(300, CheckpointingMode.EXACTLY_ONCE)
    build(env, records, None, p=p, throttle=Throttle(throttle_ms) if throttle_ms else None) \
        .map(append_to(str(path))) \
        .add_sink(SinkFunction("org.apache.flink.streaming.api.functions.sink.DiscardingSink"))
    return env.execute_async(f"breaker-rescale-p{p}")


def outputs(path: Path) -> Counter:
    if not path.exists():
        return Counter()
    return Counter(ast.literal_eval(line) for line in path.read_text().splitlines())


def wait_for_commit(options: NdbStateOptions, path: Path, min_lines: int,
                    timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            store = open_store(options)
        except Exception:  # tables not there yet
            time.sleep(0.3)
            continue
        try:
            committed = [r for r in store.operators() if r.committed is not None]
        finally:
            store.close()
        if committed and path.exists() and sum(
                1 for line in path.read_text().splitlines() if "'bcast'" in line) >= min_lines:
            return
        time.sleep(0.3)
    pytest.fail("no committed checkpoint / progress in time")


@pytest.mark.parametrize("p1,p2,flink_backend", [(2, 3, "hashmap"), (3, 1, "rocksdb")])
def test_savepoint_and_restore_at_other_parallelism_exact(p1, p2, flink_backend, tmp_path,
                                                          mysql_url):
    """`flink_backend` keeps the timers (in RocksDB: column families of their own, whose
    restore must not pass for keyed state written with the switch off)."""
    records = make_records(1800)
    want = expected(records)
    ns = unique_namespace("brkr")
    options = NdbStateOptions(url=mysql_url, namespace=ns)
    switched = {"state.backend.ndb.enabled": "true", "state.backend.ndb.url": mysql_url,
                "state.backend.ndb.namespace": ns, "state.backend.ndb.cache.max-entries": "4",
                "state.backend.type": flink_backend}
    try:
        first_path = tmp_path / "first.txt"
        first = start(records, p1, switched, first_path, throttle_ms=6.0)
        try:
            wait_for_commit(options, first_path, min_lines=len(records) // 4)
        except BaseException:
            first.cancel().result()
            raise
        savepoint = first.stop_with_savepoint(False, str(tmp_path / "sp")).result()
        first.get_job_execution_result().result()
        got1 = outputs(first_path)
        n1 = sum(n for o, n in got1.items() if o[0] == "bcast")
        assert 0 < n1 < len(records), n1
        second_path = tmp_path / "second.txt"
        second = start(records, p2, {**switched, "execution.savepoint.path": savepoint},
                       second_path, throttle_ms=0)
        second.get_job_execution_result().result()
        got = got1 + outputs(second_path)
        assert got == want, diff(want, got)
        # The same savepoint again, at yet another parallelism: a second branch of the
        # history must see the savepoint's state, not what the second job wrote.
        p3 = 2 if p2 != 2 else 1
        third_path = tmp_path / "third.txt"
        third = start(records, p3, {**switched, "execution.savepoint.path": savepoint},
                      third_path, throttle_ms=0)
        third.get_job_execution_result().result()
        got = got1 + outputs(third_path)
        assert got == want, diff(want, got)
    finally:
        drop_namespace(mysql_url, ns)
