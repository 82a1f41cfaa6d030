"""Key groups computed in Python (`pyflink_ndb.runtime.key_groups`) against Flink's own
`KeyGroupRangeAssignment` (the JVM of the apache-flink wheel), and in jobs on Flink's
MiniCluster: every record's key group is the one Flink routes it by."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from conftest import thread_mode_env
from pyflink.common import Types
from pyflink.datastream import KeyedProcessFunction
from pyflink.datastream.state import ValueStateDescriptor

import pyflink_ndb
from pyflink_ndb.runtime.key_groups import (
    CHECKED_KEYS,
    KeyGroupCalculator,
    java_integer_hash,
    java_long_hash,
    java_string_hash,
    key_group_of_hash,
    murmur_hash,
)

pytestmark = pytest.mark.flink

cloudpickle.register_pickle_by_value(sys.modules[__name__])

STRINGS = ["", "a", "user-0067079", "N725MQ", "ünïcödé", "日本語のキー", "emoji 😀 key",
           "𝄞" * 7, "x" * 1000, "\x00", "tab\tand\nnewline"]
INTS = [0, 1, -1, 7, 2**31 - 1, -2**31, 123_456_789, -987_654]
LONGS = [*INTS, 2**31, -2**31 - 1, 2**63 - 1, -2**63, 2**40 + 17, -(2**50) + 3]


@pytest.fixture(scope="module")
def jvm() -> Any:
    from pyflink.java_gateway import get_gateway

    return get_gateway().jvm


def test_hashes_and_key_groups_equal_flinks(jvm):
    rng = random.Random(7)
    strings = STRINGS + ["".join(chr(rng.choice([rng.randrange(32, 127),
                                                 rng.randrange(0xA0, 0xD7FF),
                                                 rng.randrange(0x10000, 0x10FFFF)]))
                                 for _ in range(rng.randrange(0, 30)))
                         for _ in range(300)]
    assignment = jvm.org.apache.flink.runtime.state.KeyGroupRangeAssignment
    for s in strings:
        assert java_string_hash(s) == jvm.java.util.Objects.hashCode(s), repr(s)
        for max_parallelism in (128, 32768, 7):
            assert (key_group_of_hash(java_string_hash(s), max_parallelism)
                    == assignment.assignToKeyGroup(s, max_parallelism)), repr(s)
    ints = INTS + [rng.randrange(-2**31, 2**31) for _ in range(300)]
    longs = LONGS + [rng.randrange(-2**63, 2**63) for _ in range(300)]
    # py4j hands a Python int to Java as an Integer when it fits, else as a Long (the
    # job test below covers Long keys of every size).
    for v in ints:
        assert java_integer_hash(v) == jvm.java.util.Objects.hashCode(v)
        assert murmur_hash(v) == jvm.org.apache.flink.util.MathUtils.murmurHash(v)
        assert key_group_of_hash(java_integer_hash(v), 128) == \
            assignment.assignToKeyGroup(v, 128)
    for v in (x for x in longs if java_integer_hash(x) is None):
        assert java_long_hash(v) == jvm.java.util.Objects.hashCode(v)
        assert key_group_of_hash(java_long_hash(v), 128) == assignment.assignToKeyGroup(v, 128)
    assert java_integer_hash(2**31) is None and java_long_hash(2**63) is None
    assert java_string_hash("lone \ud800 surrogate") is None
    # PyFlink's key_by keys by a one-field Row: the bridge reports its hash code's offset.
    for s in strings[:50]:
        fields = jvm_array(jvm, s)
        row = jvm.org.apache.flink.types.Row.of(fields)
        offset = jvm.java.util.Objects.hashCode(row) - jvm.java.util.Objects.hashCode(s)
        calculator = KeyGroupCalculator(
            f"org.apache.flink.types.Row(java.lang.String)+{offset}", 128)
        assert calculator.key_group(s) == assignment.assignToKeyGroup(row, 128), repr(s)


def jvm_array(jvm: Any, *values: Any) -> Any:
    from pyflink.java_gateway import get_gateway

    array = get_gateway().new_array(jvm.Object, len(values))
    for i, v in enumerate(values):
        array[i] = v
    return array


class _Oracle:
    """Java's side in a unit test: a class name and key groups that differ from the
    computed ones from the `wrong_after`-th call on."""

    def __init__(self, java_class: str, wrong_after: int | None = None) -> None:
        self.java_class, self.wrong_after, self.calls = java_class, wrong_after, 0
        self.key: Any = None

    def currentKeyClass(self) -> str:  # noqa: N802 (the Java method name)
        return self.java_class

    def currentKeyGroup(self) -> int:  # noqa: N802
        self.calls += 1
        right = key_group_of_hash(java_string_hash(self.key), 128)
        return right if self.wrong_after is None or self.calls < self.wrong_after \
            else (right + 1) % 128


def _backend(oracle: _Oracle, tmp_path: Path) -> Any:
    from pyflink_ndb.config import NdbStateOptions
    from pyflink_ndb.runtime.backend import BindInfo, SubtaskStateBackend

    options = NdbStateOptions(url=f"sqlite:///{tmp_path / 's.sqlite'}", namespace="kg",
                              write_async=False, local_enabled=False)
    backend = SubtaskStateBackend(options, BindInfo(operator="op"), oracle)
    return backend


def test_checked_first_then_trusted_and_a_difference_turns_it_off(tmp_path):
    oracle = _Oracle("java.lang.String")
    backend = _backend(oracle, tmp_path)
    try:
        for i in range(CHECKED_KEYS + 500):
            oracle.key = f"key-{i}"
            backend.set_current_key(oracle.key)
            assert backend.current_key_group == key_group_of_hash(
                java_string_hash(oracle.key), 128)
        assert oracle.calls == CHECKED_KEYS, "Java was asked only for the checked keys"
    finally:
        backend.close()

    oracle = _Oracle("java.lang.String", wrong_after=10)
    backend = _backend(oracle, tmp_path)
    try:
        answers = []
        for i in range(50):
            oracle.key = f"other-{i}"
            backend.set_current_key(oracle.key)
            answers.append(backend.current_key_group)
        # From the 10th call on Java disagrees: Java's answer is used, and Java is asked
        # for every later key.
        assert oracle.calls == 50
        assert answers[9] == (key_group_of_hash(java_string_hash("other-9"), 128) + 1) % 128
        assert backend._kg_calculator.mismatches == 1 and not backend._kg_calculator.enabled
    finally:
        backend.close()


def test_keys_of_an_unknown_class_ask_java(tmp_path):
    oracle = _Oracle("org.apache.flink.types.Row")
    backend = _backend(oracle, tmp_path)
    try:
        for i in range(20):
            oracle.key = f"row-{i}"
            backend.set_current_key(oracle.key)
        assert oracle.calls == 20
        assert KeyGroupCalculator("java.lang.Long", 128).key_group("not an int") is None
        assert KeyGroupCalculator("java.lang.Long", 128).key_group(True) is None
    finally:
        backend.close()


class CheckKeyGroups(KeyedProcessFunction):
    """Compares, for every record, the key group the backend uses with Java's answer for
    the current key; reports mismatches and the calculator's state at close."""

    def __init__(self, report: str) -> None:
        self.report = report

    def open(self, runtime_context: Any) -> None:
        self.backend = runtime_context.backend
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.records = self.differ = 0

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.count.update((self.count.value() or 0) + 1)
        self.records += 1
        java = int(self.backend._key_groups.currentKeyGroup())
        self.differ += java != self.backend.current_key_group
        yield value[0]

    def close(self) -> None:
        calc = self.backend._kg_calculator
        with open(self.report, "a") as out:
            out.write(f"{self.records} {self.differ} {calc.java_class} {calc.unchecked} "
                      f"{calc.mismatches}\n")


@pytest.mark.parametrize("key_type,keys", [
    ("STRING", [f"user-{i:07d}" for i in range(1500)] + STRINGS[1:]),
    ("LONG", LONGS + list(range(-700, 700))),
    ("INT", INTS + list(range(-700, 700))),
])
def test_every_record_in_a_job_gets_flinks_key_group(key_type, keys, tmp_path):
    env = thread_mode_env(2)
    kind = getattr(Types, key_type)()
    stream = env.from_collection([(k,) for k in keys], type_info=Types.TUPLE([kind]))
    keyed = stream.key_by(lambda r: r[0], key_type=kind)
    report = tmp_path / "report.txt"
    # One call per record: in bundles Java hands each record's key group to Python and
    # the calculator this test checks is not asked.
    options = {"state.backend.ndb.url": f"sqlite:///{tmp_path / 'state.sqlite'}",
               "state.backend.ndb.namespace": "kg_job", "state.backend.ndb.bundle.records": "0"}
    out = pyflink_ndb.process(keyed, CheckKeyGroups(str(report)), output_type=kind,
                              uid="key-groups", options=options)
    with out.execute_and_collect() as results:
        assert sorted(results) == sorted(keys)
    lines = [line.split() for line in report.read_text().splitlines()]
    assert len(lines) == 2
    assert sum(int(r[0]) for r in lines) == len(keys)
    assert all(r[1] == "0" for r in lines), lines  # no record had another key group
    # PyFlink's key_by keys the Java stream by a one-field Row.
    field = f"java.lang.{key_type.title().replace('Int', 'Integer')}"
    assert all(r[2].startswith(f"org.apache.flink.types.Row({field})+") for r in lines), lines
    assert all(r[3] == "0" and r[4] == "0" for r in lines), \
        f"each subtask checked {CHECKED_KEYS} keys, then trusted the calculator: {lines}"
