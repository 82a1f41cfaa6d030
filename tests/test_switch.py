"""The job-wide switch picks the right operators when the job is built (issue 11).

Builds jobs on a real PyFlink environment (the JVM gateway, no job runs) and checks which
Java operator each call produced: the bridge's with `state.backend.ndb.enabled: true` for
every keyed operator that can hold keyed state, PyFlink's own otherwise. What the switched
operators compute is tests/test_switch_flink.py's job.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from pyflink.common import Configuration, Time, Types
from pyflink.datastream import (
    FilterFunction,
    KeyedBroadcastProcessFunction,
    KeyedProcessFunction,
    MapFunction,
    ProcessFunction,
    RuntimeContext,
    StreamExecutionEnvironment,
)
from pyflink.datastream.functions import CoMapFunction
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor
from pyflink.datastream.window import EventTimeSessionWindows, TumblingEventTimeWindows

import pyflink_ndb  # noqa: F401  (installs the switch)
from pyflink_ndb import _pyflink
from pyflink_ndb.api import switch
from pyflink_ndb.errors import ConfigurationError

pytestmark = pytest.mark.flink

NDB = "io.pyflinkndb.bridge."
EMBEDDED = "org.apache.flink.streaming.api.operators.python.embedded."
#: What PyFlink builds for a keyed broadcast process (an operator only at submission).
PYFLINK_BROADCAST = ("org.apache.flink.streaming.api.transformations.python."
                     "PythonKeyedBroadcastStateTransformation")


class WithState(MapFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.seen = runtime_context.get_state(ValueStateDescriptor("seen", Types.LONG()))

    def map(self, value: Any) -> Any:
        return value


class Stateless(FilterFunction):
    def filter(self, value: Any) -> bool:
        return True


class CoWithState(CoMapFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.seen = runtime_context.get_state(ValueStateDescriptor("seen", Types.LONG()))

    def map1(self, value: Any) -> Any:
        return value

    def map2(self, value: Any) -> Any:
        return value


class Process(KeyedProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.seen = runtime_context.get_state(ValueStateDescriptor("seen", Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        yield value


class ProcessWithoutOpen(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:
        yield value


class BroadcastWithState(KeyedBroadcastProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        self.seen = runtime_context.get_state(ValueStateDescriptor("seen", Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        yield value

    def process_broadcast_element(self, value: Any, ctx: Any) -> Any:
        return []


class BroadcastWithoutOpen(KeyedBroadcastProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:
        yield value

    def process_broadcast_element(self, value: Any, ctx: Any) -> Any:
        return []


RULES = MapStateDescriptor("rules", Types.STRING(), Types.INT())


class PlainProcess(ProcessFunction):
    def open(self, runtime_context: RuntimeContext) -> None:
        pass

    def process_element(self, value: Any, ctx: Any) -> Any:
        yield value


def environment(**keys: str) -> StreamExecutionEnvironment:
    config = Configuration()
    config.set_string("python.execution-mode", keys.pop("mode", "thread"))
    config.set_string("python.executable", sys.executable)
    for key, value in keys.items():
        config.set_string(key, value)
    return StreamExecutionEnvironment.get_execution_environment(config)


def operator_class(stream: Any) -> str:
    """The Java operator's class; for a transformation that Flink translates into an
    operator only when the job is submitted (it holds a `DelegateOperator`), the
    transformation's class."""
    transformation = stream._j_data_stream.getTransformation()
    name = str(transformation.getOperatorFactory().getOperator().getClass().getName())
    if name.endswith("DelegateOperatorTransformation$DelegateOperator"):
        return str(transformation.getClass().getName())
    return name


def build_all(env: StreamExecutionEnvironment) -> dict[str, str]:
    source = env.from_collection([("a", 1)], Types.TUPLE([Types.STRING(), Types.INT()]))
    keyed = source.key_by(lambda v: v[0])
    streams = {
        "map with open": keyed.map(WithState()),
        "lambda map": keyed.map(lambda v: v),
        "filter without open": keyed.filter(Stateless()),
        "reduce": keyed.reduce(lambda a, b: a),
        "process": keyed.process(Process()),
        "process without open": keyed.process(ProcessWithoutOpen()),
        "tumbling window": keyed.window(TumblingEventTimeWindows.of(Time.hours(1)))
        .reduce(lambda a, b: a),
        "session window": keyed.window(EventTimeSessionWindows.with_gap(Time.hours(1)))
        .reduce(lambda a, b: a),
        "keyed connect map": keyed.connect(source.key_by(lambda v: v[0])).map(CoWithState()),
        "keyed broadcast": keyed.connect(source.broadcast(RULES)).process(BroadcastWithState()),
        "keyed broadcast without open": keyed.connect(source.broadcast(RULES))
        .process(BroadcastWithoutOpen()),
        "non-keyed process": source.process(PlainProcess()),
    }
    return {name: operator_class(stream) for name, stream in streams.items()}


def test_the_switch_on_puts_every_keyed_operator_with_state_on_the_bridge():
    classes = build_all(environment(**{"state.backend.ndb.enabled": "true"}))
    assert classes == {
        "map with open": NDB + "NdbKeyedProcessOperator",
        "lambda map": EMBEDDED + "EmbeddedPythonKeyedProcessOperator",
        "filter without open": EMBEDDED + "EmbeddedPythonKeyedProcessOperator",
        "reduce": NDB + "NdbKeyedProcessOperator",
        "process": NDB + "NdbKeyedProcessOperator",
        "process without open": EMBEDDED + "EmbeddedPythonKeyedProcessOperator",
        "tumbling window": NDB + "NdbWindowOperator",
        "session window": NDB + "NdbWindowOperator",
        "keyed connect map": NDB + "NdbKeyedCoProcessOperator",
        "keyed broadcast": NDB + "NdbKeyedCoProcessOperator",
        "keyed broadcast without open": PYFLINK_BROADCAST,
        "non-keyed process": EMBEDDED + "EmbeddedPythonProcessOperator",
    }


def test_the_switch_off_leaves_every_operator_to_pyflink():
    for keys in ({}, {"state.backend.ndb.enabled": "false"}):
        classes = build_all(environment(**keys))
        assert not any(name.startswith(NDB) for name in classes.values()), classes
        assert classes["keyed broadcast"] == PYFLINK_BROADCAST


def test_the_switched_broadcast_keeps_pyflinks_checks_and_partitioning():
    env = environment(**{"state.backend.ndb.enabled": "true"})
    source = env.from_collection([("a", 1)], Types.TUPLE([Types.STRING(), Types.INT()]))
    with pytest.raises(TypeError, match="KeyedBroadcastProcessFunction should be applied"):
        source.connect(source.broadcast(RULES)).process(BroadcastWithState())
    stream = source.key_by(lambda v: v[0]).connect(source.broadcast(RULES)) \
        .process(BroadcastWithState())
    transformation = stream._j_data_stream.getTransformation()
    # Keyed first input, broadcast-partitioned second input without a key selector.
    assert transformation.getStateKeySelector1() is not None
    assert transformation.getStateKeySelector2() is None
    partitioner = transformation.getInput2().getPartitioner()
    assert "BroadcastPartitioner" in str(partitioner.getClass().getName())
    assert str(transformation.getName()) == "Keyed-Co-Process-Broadcast"


def test_the_switch_reads_every_boolean_spelling_and_refuses_others():
    for value, on in (("true", True), ("YES", True), ("1", True), ("false", False),
                      ("no", False), ("0", False)):
        classes = build_all(environment(**{"state.backend.ndb.enabled": value}))
        assert (classes["process"] == NDB + "NdbKeyedProcessOperator") is on, value
    env = environment(**{"state.backend.ndb.enabled": "on"})
    keyed = env.from_collection([1], Types.INT()).key_by(lambda v: v)
    with pytest.raises(ConfigurationError, match="state.backend.ndb.enabled='on' is not "
                                                 "true or false"):
        keyed.map(WithState())


#: Builds a keyed map with keyed state twice in a local environment and prints the
#: operator's class; run in a process of its own (FLINK_CONF_DIR is read when PyFlink's
#: Java gateway starts: changed in the test process, it reaches later tests' jobs).
CONF_DIR_JOB = """
import sys, warnings
warnings.simplefilter("default")
from pyflink.common import Configuration, Types
from pyflink.datastream import MapFunction, StreamExecutionEnvironment
from pyflink.datastream.state import ValueStateDescriptor
import pyflink_ndb

class WithState(MapFunction):
    def open(self, runtime_context):
        self.seen = runtime_context.get_state(ValueStateDescriptor("seen", Types.LONG()))

    def map(self, value):
        return value

config = Configuration()
config.set_string("python.execution-mode", "thread")
config.set_string("python.executable", sys.executable)
env = StreamExecutionEnvironment.get_execution_environment(config)
keyed = env.from_collection([1], Types.INT()).key_by(lambda v: v)
for _ in range(2):
    mapped = keyed.map(WithState())
    factory = mapped._j_data_stream.getTransformation().getOperatorFactory()
    print(factory.getOperator().getClass().getName())
"""


@pytest.mark.parametrize("value,warned", [("true", True), ("false", False)])
def test_a_switch_only_in_the_conf_dir_warns_that_a_local_job_ignores_it(
        value, warned, tmp_path):
    """A new user's trial: `FLINK_CONF_DIR` with `state.backend.ndb.enabled: true` and a
    job started with `python job.py` (a MiniCluster, which does not apply that file): the
    job ran on Flink's own state without a word. Now `import pyflink_ndb` warns, once per
    process; a file that leaves the switch off says nothing."""
    import os
    import subprocess

    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "flink-conf.yaml").write_text(f"state.backend.ndb.enabled: {value}\n")
    (tmp_path / "job.py").write_text(CONF_DIR_JOB)
    run = subprocess.run([sys.executable, str(tmp_path / "job.py")], capture_output=True,
                         text=True, timeout=180, cwd=tmp_path,
                         env={**os.environ, "FLINK_CONF_DIR": str(conf)})
    assert run.returncode == 0, run.stderr[-3000:]
    # (the JVM's log4j also prints to stdout: no log4j file in this FLINK_CONF_DIR)
    classes = [line for line in run.stdout.split() if line.startswith(("org.", "io."))]
    assert len(classes) == 2 and not any(c.startswith(NDB) for c in classes), run.stdout
    assert run.stderr.count("does not apply that file") == (1 if warned else 0), run.stderr


def test_the_switch_in_process_mode_is_a_configuration_error():
    env = environment(mode="process", **{"state.backend.ndb.enabled": "true"})
    keyed = env.from_collection([1], Types.INT()).key_by(lambda v: v)
    with pytest.raises(ConfigurationError, match="python.execution-mode"):
        keyed.map(WithState())


def test_installing_twice_keeps_pyflinks_originals():
    from pyflink.datastream import data_stream

    first = data_stream._pyflink_ndb_originals
    switch.install()
    assert data_stream._pyflink_ndb_originals is first
    assert first[0].__module__ == "pyflink.datastream.data_stream"


def test_reduce_state_names_are_pinned_against_pyflinks_fresh_uuid():
    import inspect

    from pyflink.datastream import data_stream

    source = inspect.getsource(data_stream.KeyedStream.reduce)
    assert '"_reduce_state" + str(uuid.uuid4())' in source
    import uuid

    assert _pyflink.stable_state_name("_reduce_state" + str(uuid.uuid4())) == "_reduce_state"
    assert _pyflink.stable_state_name("_reduce_state_mine") == "_reduce_state_mine"
    assert _pyflink.stable_state_name("count") == "count"


def test_operator_ids_are_flinks_hashes_of_the_uids():
    # What Flink's StreamGraphHasherV2.generateUserSpecifiedHash computes, through the
    # Guava that flink-dist ships (murmur3_128(0) over the uid's UTF-8 bytes).
    from pyflink.java_gateway import get_gateway

    from pyflink_ndb.operator_ids import operator_id_of_uid

    hashing = get_gateway().jvm.org.apache.flink.shaded.guava31.com.google.common.hash.Hashing
    charset = get_gateway().jvm.java.nio.charset.StandardCharsets.UTF_8
    for uid in ("counter", "", "a", "12345678", "123456789", "sixteen-bytes-id",
                "a uid longer than thirty-two bytes, with ünïcode ☃", "x" * 100):
        java = hashing.murmur3_128(0).newHasher().putString(uid, charset).hash().toString()
        assert operator_id_of_uid(uid) == str(java), uid
    # The ID of the README example's `uid("counter")`, as a real job stored it.
    assert operator_id_of_uid("counter") == "0da08f51eaa85fc298e176a139b3649a"
