"""Bad input at job build time gets a clear error that names the fix."""

from __future__ import annotations

import sys

import pytest
from pyflink.common import Configuration, Types
from pyflink.datastream import KeyedProcessFunction, StreamExecutionEnvironment

import pyflink_ndb
from pyflink_ndb.api import stream as api_stream
from pyflink_ndb.errors import ConfigurationError, StoreUnavailableError

pytestmark = pytest.mark.flink


class Noop(KeyedProcessFunction):
    def process_element(self, value, ctx):
        yield value


def keyed(mode: str = "thread"):
    config = Configuration()
    config.set_string("python.execution-mode", mode)
    config.set_string("python.executable", sys.executable)
    env = StreamExecutionEnvironment.get_execution_environment(config)
    return env.from_collection([1, 2, 3], Types.INT()).key_by(lambda x: x, Types.INT())


def test_process_mode_is_rejected_naming_the_setting(tmp_path):
    with pytest.raises(ConfigurationError,
                       match=r"config\.set_string\('python\.execution-mode', 'thread'\)"):
        pyflink_ndb.process(keyed("process"), Noop(), options={
            "state.backend.ndb.url": f"sqlite:///{tmp_path}/s.sqlite"})


def test_unknown_option_lists_known_ones(tmp_path):
    with pytest.raises(ConfigurationError) as err:
        pyflink_ndb.process(keyed(), Noop(), options={
            "state.backend.ndb.url": f"sqlite:///{tmp_path}/s.sqlite",
            "state.backend.ndb.cache.size": "10"})
    assert "state.backend.ndb.cache.size" in str(err.value)
    assert "state.backend.ndb.cache.max-entries" in str(err.value)


def test_unreachable_database_names_host_port_and_setting():
    with pytest.raises(StoreUnavailableError) as err:
        pyflink_ndb.process(keyed(), Noop(), options={
            "state.backend.ndb.url": "mysql://root@127.0.0.1:1/test"})
    assert "127.0.0.1:1" in str(err.value)
    assert "state.backend.ndb.url" in str(err.value)


def test_missing_bridge_jar_says_how_to_build(tmp_path, monkeypatch):
    monkeypatch.setattr(api_stream, "BRIDGE_JAR", tmp_path / "absent.jar")
    with pytest.raises(ConfigurationError, match="make jar"):
        pyflink_ndb.process(keyed(), Noop(), options={
            "state.backend.ndb.url": f"sqlite:///{tmp_path}/s.sqlite"})


def test_fresh_start_on_used_namespace_fails_with_what_to_do(tmp_path):
    from pyflink_ndb.config import NdbStateOptions
    from pyflink_ndb.errors import NamespaceInUseError
    from pyflink_ndb.stores.factory import open_store
    from pyflink_ndb.testing import LocalSubtask

    store = open_store(NdbStateOptions(url=f"sqlite:///{tmp_path}/s.sqlite", namespace="ns"))
    first = LocalSubtask(store, local_dir=str(tmp_path / "a"))
    from pyflink.datastream.state import ValueStateDescriptor

    first.context.get_state(ValueStateDescriptor("v", Types.INT()))
    first.key("k").context.get_state(ValueStateDescriptor("v", Types.INT())).update(1)
    first.checkpoint(1)
    first.close()
    with pytest.raises(NamespaceInUseError) as err:
        LocalSubtask(store, local_dir=str(tmp_path / "b"))
    message = str(err.value)
    assert "on-fresh-start" in message and "resume" in message and "truncate" in message
    store.close()


def test_fresh_start_on_used_namespace_fails_when_the_job_is_built(tmp_path):
    from pyflink.datastream.state import ValueStateDescriptor

    from pyflink_ndb.config import NdbStateOptions
    from pyflink_ndb.errors import NamespaceInUseError
    from pyflink_ndb.stores.factory import open_store
    from pyflink_ndb.testing import LocalSubtask

    url = f"sqlite:///{tmp_path}/s.sqlite"
    store = open_store(NdbStateOptions(url=url, namespace="used"))
    earlier = LocalSubtask(store, operator="counter", local_dir=str(tmp_path / "a"))
    earlier.key("k").context.get_state(ValueStateDescriptor("v", Types.INT())).update(1)
    earlier.checkpoint(1)
    earlier.close()
    store.close()
    options = {"state.backend.ndb.url": url, "state.backend.ndb.namespace": "used"}
    with pytest.raises(NamespaceInUseError, match="on-fresh-start"):
        pyflink_ndb.process(keyed(), Noop(), uid="counter", options=options)
    # Restoring a savepoint, or another policy, is allowed. Flink 1.20's `flink run -s`
    # sets execution.state-recovery.path (the older execution.savepoint.path also counts).
    for key in ("execution.state-recovery.path", "execution.savepoint.path"):
        config = Configuration()
        config.set_string(key, str(tmp_path / "savepoint-1"))
        config.set_string("python.execution-mode", "thread")
        config.set_string("python.executable", sys.executable)
        env = StreamExecutionEnvironment.get_execution_environment(config)
        stream = env.from_collection([1], Types.INT()).key_by(lambda x: x, Types.INT())
        pyflink_ndb.process(stream, Noop(), uid="counter", options=options)
    pyflink_ndb.process(keyed(), Noop(), uid="counter",
                        options={**options, "state.backend.ndb.on-fresh-start": "resume"})


def test_unknown_database_and_host_are_named(mysql_url):
    from pyflink_ndb.config import NdbStateOptions
    from pyflink_ndb.stores.factory import open_store

    base = mysql_url.rsplit("/", 1)[0]
    with pytest.raises(StoreUnavailableError, match="no database 'nosuchdb_ndb'"):
        open_store(NdbStateOptions(url=base + "/nosuchdb_ndb"))
    with pytest.raises(StoreUnavailableError, match="Cannot resolve the database host"):
        open_store(NdbStateOptions(url="mysql://root@no-such-host.invalid:3306/test"))


def test_importing_pyflink_ndb_puts_the_interpreter_first_on_path():
    import os

    assert os.environ["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)


def test_a_function_that_is_not_a_keyed_process_function_names_the_two_ways():
    from pyflink.datastream import MapFunction

    class CountPerKey(MapFunction):
        def map(self, value):
            return value

    with pytest.raises(TypeError, match="not a CountPerKey") as err:
        pyflink_ndb.process(keyed(), CountPerKey())
    assert "KeyedProcessFunction" in str(err.value)
    assert "state.backend.ndb.enabled" in str(err.value)


def test_a_misspelled_switch_is_refused_instead_of_running_on_flinks_state():
    """`state.backend.ndb.enable` (no d) with the switch unset left the job on Flink's own
    state without a word (found by a new user); a typo of another key is refused by the
    switch's option check once it is on."""
    config = Configuration()
    config.set_string("python.execution-mode", "thread")
    config.set_string("state.backend.ndb.enable", "true")
    env = StreamExecutionEnvironment.get_execution_environment(config)
    stream = env.from_collection([1, 2, 3], Types.INT()).key_by(lambda x: x, Types.INT())
    with pytest.raises(ConfigurationError, match="Did you mean state.backend.ndb.enabled"):
        stream.map(lambda x: x, Types.INT())
