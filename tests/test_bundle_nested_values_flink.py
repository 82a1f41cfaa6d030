"""Bundles: the values a bundle hands to Python must be each record's own, whatever their
type (nested Rows and Tuples inside LIST and MAP fields; PyFlink's Java converters reuse
the arrays of Rows and Tuples from one record to the next). Reference: the same job on
PyFlink's own keyed state (no pyflink-ndb), at parallelism 1."""

from __future__ import annotations

import ast
import sys
from typing import Any

import cloudpickle
import pytest
from conftest import drop_namespace, thread_mode_env, unique_namespace
from pyflink.common import Row, Types
from pyflink.datastream import KeyedProcessFunction
from pyflink.datastream.state import ValueStateDescriptor

import pyflink_ndb

pytestmark = pytest.mark.flink
cloudpickle.register_pickle_by_value(sys.modules[__name__])

RECORDS = 300


class Echo(KeyedProcessFunction):
    """Reports each record's value as it sees it, with a per-key count."""

    def open(self, runtime_context: Any) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("n", Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield repr((ctx.get_current_key(), n, _plain(value), ctx.timestamp()))


def _plain(v: Any) -> Any:
    if isinstance(v, Row):
        return ("Row",) + tuple(_plain(x) for x in v)
    if isinstance(v, (list, tuple)):
        return tuple(_plain(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _plain(x)) for k, x in v.items()))
    return v


CASES = {
    "list-of-tuple": (
        Types.ROW([Types.STRING(), Types.LIST(Types.TUPLE([Types.INT(), Types.LONG()]))]),
        lambda i: Row(f"k{i % 3}", [(i, 10 * i)])),
    "flat-row": (
        Types.ROW([Types.STRING(), Types.TUPLE([Types.INT(), Types.STRING()])]),
        lambda i: Row(f"k{i % 3}", (i, f"v{i}"))),
    "map-of-row": (
        Types.ROW([Types.STRING(), Types.MAP(Types.STRING(), Types.ROW([Types.INT()]))]),
        lambda i: Row(f"k{i % 3}", {"a": Row(i)})),
    "array-of-row": (
        Types.ROW([Types.STRING(), Types.OBJECT_ARRAY(Types.ROW([Types.INT()]))]),
        lambda i: Row(f"k{i % 3}", [Row(i)])),
}
#: Two elements per field: PyFlink's own converters collapse these (README, Limits).
TWO_ELEMENTS = {
    "list-of-two-tuples": (
        Types.ROW([Types.STRING(), Types.LIST(Types.TUPLE([Types.INT(), Types.LONG()]))]),
        lambda i: Row(f"k{i % 3}", [(i, 10 * i), (i + 1, 10 * i + 1)])),
    "pickled-two-tuples": (
        Types.ROW([Types.STRING(), Types.PICKLED_BYTE_ARRAY()]),
        lambda i: Row(f"k{i % 3}", [(i, 10 * i), (i + 1, 10 * i + 1)])),
}


def run(case: str, options: dict[str, str] | None, reuse: bool = False) -> list[Any]:
    type_info, make = {**CASES, **TWO_ELEMENTS}[case]
    env = thread_mode_env(1, {"pipeline.object-reuse": "true"} if reuse else None)
    stream = env.from_collection(list(range(RECORDS)), type_info=Types.INT()).map(
        make, output_type=type_info)
    keyed = stream.key_by(lambda r: r[0], key_type=Types.STRING())
    if options is None:
        out = keyed.process(Echo(), output_type=Types.STRING())
    else:
        out = pyflink_ndb.process(keyed, Echo(), output_type=Types.STRING(), uid="echo",
                                  options=options)
    with out.execute_and_collect() as results:
        return [ast.literal_eval(line) for line in results]


@pytest.mark.parametrize("bundle", ["0", "100"])
@pytest.mark.parametrize("case", list(CASES))
def test_bundled_records_keep_their_nested_values(case, bundle, mysql_url):
    namespace = unique_namespace("brkv")
    options = {"state.backend.ndb.url": mysql_url, "state.backend.ndb.namespace": namespace,
               "state.backend.ndb.bundle.records": bundle,
               "state.backend.ndb.bundle.max-wait-ms": "200"}
    try:
        got = run(case, options)
    finally:
        drop_namespace(mysql_url, namespace)
    expected = run(case, None)
    assert len(got) == RECORDS
    bad = [(g, e) for g, e in zip(got, expected, strict=False) if g != e]
    assert not bad, f"{len(bad)} of {RECORDS} differ; e.g. {bad[:3]}"


@pytest.mark.parametrize("case", ["flat-row", "array-of-row"])
def test_bundled_records_with_object_reuse(case, mysql_url):
    namespace = unique_namespace("brko")
    options = {"state.backend.ndb.url": mysql_url, "state.backend.ndb.namespace": namespace,
               "state.backend.ndb.bundle.max-wait-ms": "200"}
    try:
        got = run(case, options, reuse=True)
    finally:
        drop_namespace(mysql_url, namespace)
    expected = run(case, None, reuse=True)
    assert len(got) == RECORDS
    bad = [(g, e) for g, e in zip(got, expected, strict=False) if g != e]
    assert not bad, f"{len(bad)} of {RECORDS} differ; e.g. {bad[:3]}"


def test_pyflinks_own_converters_keep_one_element_of_a_list_of_rows(mysql_url):
    """README, Limits: PyFlink 1.20's thread-mode converters reuse one tuple per element
    type, so a field of two tuples arrives as two copies of the last, on PyFlink's own state
    and on pyflink-ndb's alike (bundled); a PICKLED_BYTE_ARRAY field arrives intact. If
    PyFlink fixes its converters, the first assertion fails: update the README's row."""
    own = run("list-of-two-tuples", None)
    assert [value[2][2] for value in own[:2]] == [((1, 1), (1, 1)), ((2, 11), (2, 11))]
    outcomes = {}
    for case in TWO_ELEMENTS:
        namespace = unique_namespace("brk2")
        options = {"state.backend.ndb.url": mysql_url, "state.backend.ndb.namespace": namespace,
                   "state.backend.ndb.bundle.max-wait-ms": "200"}
        try:
            outcomes[case] = run(case, options)
        finally:
            drop_namespace(mysql_url, namespace)
    assert outcomes["list-of-two-tuples"] == own
    pickled = outcomes["pickled-two-tuples"]
    make = TWO_ELEMENTS["pickled-two-tuples"][1]
    assert [value[2] for value in pickled] == [_plain(make(i)) for i in range(RECORDS)]
