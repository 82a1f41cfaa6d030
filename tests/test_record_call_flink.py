"""The bridge runs each record in one call into the interpreter (`RecordCall`,
`SubtaskStateBackend.process_element`): on Flink's MiniCluster the outputs are PyFlink's,
in the same order, also beyond one call's `OUTPUTS_PER_CALL`; an operator with side
outputs keeps PyFlink's path, so its side outputs stay interleaved with its outputs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from conftest import thread_mode_env
from pyflink.common import Types
from pyflink.datastream import KeyedProcessFunction, OutputTag
from pyflink.datastream.state import ValueStateDescriptor

import pyflink_ndb
from pyflink_ndb.runtime.backend import OUTPUTS_PER_CALL

pytestmark = pytest.mark.flink

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SIDE = OutputTag("side", Types.STRING())


class Fanning(KeyedProcessFunction):
    """Record (key, n): n outputs `key:i`, counting the key's records in state; with
    `side`, every third output also goes to the side output first. Writes how the bridge
    called it to `report` at close: calls of `process_element` and the kinds returned."""

    def __init__(self, report: str, side: bool) -> None:
        self.report, self.side = report, side

    def open(self, runtime_context: Any) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))
        backend = runtime_context.backend
        original = backend.process_element
        self.returned: list[str] = []

        def spy(value: Any) -> Any:
            result = original(value)
            self.returned.append(type(result).__name__)
            return result

        backend.process_element = spy

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        for i in range(value[1]):
            if self.side and i % 3 == 0:
                yield SIDE, f"side {value[0]}:{i}"
            yield f"{value[0]}:{n}:{i}"

    def close(self) -> None:
        with open(self.report, "a") as out:
            out.write(" ".join(self.returned) + "\n")


def run(records: list[tuple[str, int]], tmp_path: Path, side: bool
        ) -> tuple[list[str], list[str], list[str]]:
    env = thread_mode_env(1)  # one subtask: its outputs arrive in the order it emitted them
    stream = env.from_collection(records, type_info=Types.TUPLE([Types.STRING(), Types.INT()]))
    report = tmp_path / "report.txt"
    # One call per record (bundles: tests/test_bundle_flink.py).
    options = {"state.backend.ndb.url": f"sqlite:///{tmp_path / 'state.sqlite'}",
               "state.backend.ndb.namespace": "record_call",
               "state.backend.ndb.bundle.records": "0"}
    out = pyflink_ndb.process(stream.key_by(lambda r: r[0], key_type=Types.STRING()),
                              Fanning(str(report), side), output_type=Types.STRING(),
                              uid="fanning", options=options)
    if side:
        merged = out.union(out.get_side_output(SIDE))
    else:
        merged = out
    with merged.execute_and_collect() as results:
        got = list(results)
    return got, report.read_text().split(), records


def expected(records: list[tuple[str, int]]) -> list[str]:
    seen: dict[str, int] = {}
    want = []
    for key, n in records:
        seen[key] = seen.get(key, 0) + 1
        want += [f"{key}:{seen[key]}:{i}" for i in range(n)]
    return want


def test_outputs_in_order_also_beyond_one_calls_share(tmp_path):
    many = OUTPUTS_PER_CALL * 2 + 5
    records = [("a", 1), ("b", 0), ("a", many), ("c", 3), ("b", OUTPUTS_PER_CALL),
               ("a", 2)]
    got, returned, _ = run(records, tmp_path, side=False)
    assert got == expected(records)
    # Each record came back from one call: None without outputs, a list below the cap,
    # the first outputs and a generator of the rest from the cap on.
    assert returned == ["list", "NoneType", "tuple", "list", "tuple", "list"]


def test_an_operator_with_side_outputs_keeps_pyflinks_path(tmp_path):
    records = [("a", 4), ("b", 2), ("a", 1)]
    got, returned, _ = run(records, tmp_path, side=True)
    main = [x for x in got if not x.startswith("side ")]
    side = [x for x in got if x.startswith("side ")]
    assert main == expected(records)
    assert side == ["side a:0", "side a:3", "side b:0", "side a:0"]
    assert returned == [], "process_element was not called: PyFlink's iterator path ran"
