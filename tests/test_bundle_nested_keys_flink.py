"""Bundles and read-ahead: keys whose type nests Tuples inside a LIST (PyFlink's Java
converters reuse a
Tuple's array from one record to the next): each bundled record's state must be its own
key's. Reference: the same job on PyFlink's own keyed state, parallelism 1."""

from __future__ import annotations

import ast
import sys
from typing import Any

import cloudpickle
import pytest
from conftest import drop_namespace, thread_mode_env, unique_namespace
from pyflink.common import Types
from pyflink.datastream import KeyedProcessFunction
from pyflink.datastream.state import ValueStateDescriptor

import pyflink_ndb

pytestmark = pytest.mark.flink
cloudpickle.register_pickle_by_value(sys.modules[__name__])

RECORDS = 400
KEY = Types.ROW([Types.STRING(), Types.LIST(Types.TUPLE([Types.INT(), Types.INT()]))])
VALUE = Types.TUPLE([Types.INT(), Types.INT()])


class Count(KeyedProcessFunction):
    def open(self, runtime_context: Any) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("n", Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        key = ctx.get_current_key()
        yield repr((value[0], key[0], [tuple(t) for t in key[1]], n))


def run(options: dict[str, str] | None) -> list[Any]:
    env = thread_mode_env(1)
    stream = env.from_collection([(i, i % 5) for i in range(RECORDS)], type_info=VALUE)
    from pyflink.common import Row
    keyed = stream.key_by(lambda v: Row("k", [(v[1], v[1] * 10)]), key_type=KEY)
    if options is None:
        out = keyed.process(Count(), output_type=Types.STRING())
    else:
        out = pyflink_ndb.process(keyed, Count(), output_type=Types.STRING(), uid="count",
                                  options=options)
    with out.execute_and_collect() as results:
        return [ast.literal_eval(line) for line in results]


@pytest.mark.parametrize("bundle", ["0", "100"])
def test_nested_tuple_keys_in_bundles(bundle, mysql_url):
    namespace = unique_namespace("brkn")
    options = {"state.backend.ndb.url": mysql_url, "state.backend.ndb.namespace": namespace,
               "state.backend.ndb.bundle.records": bundle,
               "state.backend.ndb.bundle.max-wait-ms": "200"}
    try:
        got = run(options)
    finally:
        drop_namespace(mysql_url, namespace)
    expected = run(None)
    assert [(i, "k", [(i % 5, i % 5 * 10)], i // 5 + 1) for i in range(RECORDS)] == expected
    bad = [(g, e) for g, e in zip(got, expected, strict=False) if g != e]
    assert not bad and len(got) == RECORDS, f"{len(bad)} differ; e.g. {bad[:3]}"


def test_nested_tuple_keys_read_ahead_after_resume(mysql_url):
    """Without bundles (`bundle.records` 0) but reading ahead after a restart (the second
    job resumes the first one's committed state): each key's count must go on from the
    first job's, whatever the records a read-ahead bundle holds."""
    namespace = unique_namespace("brkr")
    options = {"state.backend.ndb.url": mysql_url, "state.backend.ndb.namespace": namespace,
               "state.backend.ndb.bundle.records": "0",
               "state.backend.ndb.read-ahead.records": "0"}
    try:
        first = run(options)
        options = {**options, "state.backend.ndb.on-fresh-start": "resume",
                   "state.backend.ndb.read-ahead.records": "100",
                   "state.backend.ndb.read-ahead.max-wait-ms": "200"}
        second = run(options)
    finally:
        drop_namespace(mysql_url, namespace)
    assert first == [(i, "k", [(i % 5, i % 5 * 10)], i // 5 + 1) for i in range(RECORDS)]
    wanted = [(i, "k", [(i % 5, i % 5 * 10)], RECORDS // 5 + i // 5 + 1)
              for i in range(RECORDS)]
    bad = [(g, e) for g, e in zip(second, wanted, strict=False) if g != e]
    assert not bad and len(second) == RECORDS, f"{len(bad)} differ; e.g. {bad[:3]}"


class CountPickled(KeyedProcessFunction):
    def open(self, runtime_context: Any) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("n", Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield repr((value[0], n))


def same_object_twice_or_not(v: Any) -> tuple[str, str]:
    """(s, s) for even records, (s, an equal but distinct str) for odd ones: pickled, two
    keys to Flink (pickle writes the repeated object as a reference), one to the tiers."""
    s = f"key-{v[1]}"
    return (s, s) if v[0] % 2 == 0 else (s, "".join(list(s)))


def test_equal_keys_that_pickle_differently_fail_clearly_in_bundles(mysql_url):
    """A key_by without key_type keys the stream by the key's pickle; keys equal in Python
    whose pickles differ are two keys in two key groups to Flink, one key to pyflink-ndb.
    Where both reach one subtask in bundles, the job fails with the error that names the
    fix (a key_type) instead of keeping both keys' state under one key group (a breaker's
    find). With the key_type it names, the same job counts each key by value."""
    from py4j.protocol import Py4JJavaError

    namespace = unique_namespace("bkpk")
    options = {"state.backend.ndb.url": mysql_url, "state.backend.ndb.namespace": namespace}
    records = [(i, i % 5) for i in range(200)]
    try:
        env = thread_mode_env(1)
        keyed = env.from_collection(records, type_info=VALUE).key_by(same_object_twice_or_not)
        out = pyflink_ndb.process(keyed, CountPickled(), output_type=Types.STRING(),
                                  uid="count", options=options)
        with pytest.raises(Py4JJavaError) as err:
            with out.execute_and_collect() as results:
                list(results)
        assert "Give key_by a key_type" in str(err.value)
        env = thread_mode_env(1)
        keyed = env.from_collection(records, type_info=VALUE).key_by(
            same_object_twice_or_not, key_type=Types.TUPLE([Types.STRING(), Types.STRING()]))
        options["state.backend.ndb.on-fresh-start"] = "truncate"
        out = pyflink_ndb.process(keyed, CountPickled(), output_type=Types.STRING(),
                                  uid="count", options=options)
        with out.execute_and_collect() as results:
            got = [ast.literal_eval(line) for line in results]
    finally:
        drop_namespace(mysql_url, namespace)
    assert got == [(i, i // 5 + 1) for i in range(200)]
