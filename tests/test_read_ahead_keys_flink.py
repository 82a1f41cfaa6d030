"""Read-ahead with key types other than STRING (a resumed job, so reads miss): the
bridge hands Python the records as the operation receives them, and Python must read
the same key from them as the record's own processing does (found by a breaker run;
its other key types passed too: negative and large numbers, DOUBLE, BIG_DEC, SQL_DATE,
booleans, the empty string, a 1,900-character string, pickled bytes and None). The
record context's `get_current_key()`, which answers from the record without calling
Java, must give the same key as Java's own answer, for every key type."""

from __future__ import annotations

import ast
import datetime
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from conftest import thread_mode_env, unique_namespace
from pyflink.common import Row, Types
from pyflink.datastream import CheckpointingMode, KeyedProcessFunction
from pyflink.datastream.state import ValueStateDescriptor

import pyflink_ndb

pytestmark = pytest.mark.flink
cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = 600
PER_KEY = 3
ROW = Types.TUPLE([Types.STRING(), Types.INT(), Types.LONG()])


def records() -> list[tuple[str, int, int]]:
    return [(f"k{i % KEYS}", i // KEYS, i) for i in range(KEYS * PER_KEY)]


class Counting(KeyedProcessFunction):
    def __init__(self, report: str) -> None:
        self.report = report

    def open(self, runtime_context: Any) -> None:
        self.backend = runtime_context.backend
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        # The context answers the record's key without Java; Java's own answer must agree
        # (in a bundle, once the bridge made this record Java's current one, as it does
        # before a timer call).
        answered = "get_current_key" in vars(ctx)
        self.backend.select_bundle_record()
        java = type(ctx).get_current_key(ctx)
        yield repr((value[0], value[1], n, repr(ctx.get_current_key()), repr(java), answered))

    def close(self) -> None:
        t = self.backend.table
        with open(self.report, "a") as out:
            out.write(f"{t.read_ahead_queries} {t.read_ahead_entries}\n")


def _num(r: Any) -> int:
    return int(r[0][1:])


KEYINGS = {
    "int": (lambda r: _num(r), Types.INT()),
    "row": (lambda r: Row(r[0], _num(r) % 7), Types.ROW([Types.STRING(), Types.INT()])),
    "pickled-tuple": (lambda r: (r[0], _num(r) % 5), None),
    "pickled-none-like": (lambda r: None if _num(r) == 0 else ("" if _num(r) == 1 else r[0]),
                          None),
    "timestamp": (lambda r: datetime.datetime(2000, 1, 1)
                  + datetime.timedelta(seconds=_num(r), microseconds=7),
                  Types.SQL_TIMESTAMP()),
    "nested-row": (lambda r: Row(Row(r[0], _num(r) % 3), (_num(r), r[0])),
                   Types.ROW([Types.ROW([Types.STRING(), Types.INT()]),
                              Types.TUPLE([Types.INT(), Types.STRING()])])),
}


def run(keying: str, options: dict[str, str], report: Path, reuse: bool = False) -> list[Any]:
    selector, key_type = KEYINGS[keying]
    env = thread_mode_env(2, {"pipeline.object-reuse": str(reuse).lower()})
    env.enable_checkpointing(500, CheckpointingMode.EXACTLY_ONCE)
    stream = env.from_collection(records(), type_info=ROW)
    keyed = stream.key_by(selector, key_type=key_type) if key_type is not None \
        else stream.key_by(selector)
    out = pyflink_ndb.process(keyed, Counting(str(report)), output_type=Types.STRING(),
                              uid="read-ahead-keys", options=options)
    with out.execute_and_collect() as results:
        return [ast.literal_eval(line) for line in results]


def check(output: list[Any], resumed: int) -> None:
    """Per key (keys that several names map to merge: counted by the key's repr), the
    counts continue the resumed ones, in order."""
    seen: dict[str, list[int]] = defaultdict(list)
    for _name, _seq, n, key, java_key, answered in output:
        assert answered and key == java_key, (key, java_key, answered)
        seen[key].append(n)
    for key, ns in seen.items():
        m = len(ns)
        assert sorted(ns) == list(range(resumed * m + 1, resumed * m + m + 1)), (key, ns)
        assert ns == sorted(ns), (key, ns)
    assert sum(len(v) for v in seen.values()) == KEYS * PER_KEY


@pytest.mark.parametrize("keying", list(KEYINGS))
def test_each_record_sees_its_own_key_after_a_resume(keying, tmp_path):
    reuse = keying == "row"  # one key type with pipeline.object-reuse
    namespace = unique_namespace("rak")
    url = f"sqlite:///{tmp_path / 'state.sqlite'}"
    options = {"state.backend.ndb.url": url, "state.backend.ndb.namespace": namespace,
               "state.backend.ndb.on-fresh-start": "truncate",
               "state.backend.ndb.read-ahead.records": "50"}
    first = run(keying, options, tmp_path / "first.txt", reuse)
    check(first, 0)
    options["state.backend.ndb.on-fresh-start"] = "resume"
    second = run(keying, options, tmp_path / "second.txt", reuse)
    check(second, 1)
    q, e = map(sum, zip(*(map(int, line.split()) for line in
                          (tmp_path / "second.txt").read_text().splitlines()), strict=True))
    assert q >= 1 and e >= KEYS // 4, (q, e)
