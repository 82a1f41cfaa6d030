"""`ctx.get_current_key()` answered from the record (pyflink_ndb/_pyflink.py,
`answer_key_from_record`) returns an object of its own per call, as PyFlink's answer from
Java does: a function that changes the key `Row` it got (reusing it as an output row)
still gets the record's key on its next call. Found by a breaker helper: the context
handed out the backend's own key object, so the next call returned the changed Row.
"""

from __future__ import annotations

import sys
from typing import Any

import cloudpickle
import pytest
from conftest import unique_namespace
from pyflink.common import Configuration, Row, Types
from pyflink.datastream import KeyedProcessFunction, StreamExecutionEnvironment
from pyflink.datastream.state import ValueStateDescriptor

import pyflink_ndb

pytestmark = pytest.mark.flink
cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEY_TYPE = Types.ROW([Types.STRING(), Types.INT()])
REC = Types.TUPLE([Types.STRING(), Types.INT()])


class KeyAsOutput(KeyedProcessFunction):
    """Changes the key Row it got, then asks again; emits both answers of the second ask
    (from the record, and Java's own) and whether the context answers from the record."""

    def open(self, runtime_context: Any) -> None:
        self.n = runtime_context.get_state(ValueStateDescriptor("n", Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        n = (self.n.value() or 0) + 1
        self.n.update(n)
        out = ctx.get_current_key()
        out[1] = -n  # reuse the key Row as an output row
        yield repr(tuple(out))
        yield repr(("key", repr(ctx.get_current_key()), repr(type(ctx).get_current_key(ctx)),
                    "get_current_key" in vars(ctx)))


def test_a_function_that_changes_the_key_it_got_gets_the_record_key_again(tmp_path):
    """Every record: the context answers from the record, its second `get_current_key()`
    equals Java's answer, not the Row the function changed; and the changed Rows came out
    as the function made them."""
    config = Configuration()
    config.set_string("python.execution-mode", "thread")
    config.set_string("python.executable", sys.executable)
    config.set_string("restart-strategy.type", "none")
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(1)
    stream = env.from_collection([(f"k{i % 3}", i % 2) for i in range(12)], type_info=REC)
    keyed = stream.key_by(lambda r: Row(r[0], r[1]), key_type=KEY_TYPE)
    options = {"state.backend.ndb.url": f"sqlite:///{tmp_path / 's.sqlite'}",
               "state.backend.ndb.namespace": unique_namespace("ckm"),
               "state.backend.ndb.on-fresh-start": "truncate"}
    out = pyflink_ndb.process(keyed, KeyAsOutput(), output_type=Types.STRING(),
                              uid="key-copy", options=options)
    with out.execute_and_collect() as results:
        lines = [eval(line) for line in results]  # noqa: S307
    keys = [o for o in lines if o[0] == "key"]
    assert len(keys) == 12
    wrong = [o for o in keys if o[1] != o[2]]
    assert not wrong, f"get_current_key() after modifying its result: {wrong[:3]}"
    changed = [o for o in lines if o[0] != "key"]
    assert len(changed) == 12 and all(o[1] < 0 for o in changed)
    assert all(o[3] for o in keys), "the context did not answer from the record"
