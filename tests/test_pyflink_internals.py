"""Pins the PyFlink internals that pyflink_ndb._pyflink reaches for (apache-flink 1.20)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from pyflink.common import Time, Types
from pyflink.datastream.state import StateTtlConfig, ValueStateDescriptor

from pyflink_ndb import _pyflink


def test_ttl_config_of_reads_the_descriptor():
    descriptor = ValueStateDescriptor("v", Types.INT())
    assert _pyflink.ttl_config_of(descriptor) is None
    config = StateTtlConfig.new_builder(Time.seconds(5)).build()
    descriptor.enable_time_to_live(config)
    assert _pyflink.ttl_config_of(descriptor) is config


def _embedded_source(module: str) -> str:
    # These modules import pemja's findClass, which exists only inside the TaskManager's
    # embedded interpreter: read their source instead of importing them.
    spec = importlib.util.find_spec("pyflink")
    assert spec is not None and spec.origin is not None
    return (Path(spec.origin).parent / module).read_text()


def test_embedded_operations_have_the_hooked_attributes():
    source = _embedded_source("fn_execution/datastream/embedded/operations.py")
    for name in ("_process_element_func", "_process_element_func1", "_process_element_func2"):
        assert f"self.{name}(value)" in source
    assert "process_element(value[1], function_context)" in source
    main = _embedded_source("fn_execution/embedded/operations.py")
    assert "self._main_operation = operations[0]" in main


class _OneInput:
    def __init__(self):
        self._process_element_func = lambda value: [value[1]]

    def process_element(self, value):
        return self._process_element_func(value)


class _TwoInput:
    def __init__(self):
        self._process_element_func1 = lambda value: [value[1]]
        self._process_element_func2 = lambda value: [value[1]]


class _Operation:
    def __init__(self, main):
        self._main_operation = main


def test_record_keys_are_seen_before_one_input_records():
    seen_keys = []
    main = _OneInput()
    assert _pyflink.hook_record_keys(_Operation(main), seen_keys.append)
    assert list(main.process_element(("k1", "v1"))) == ["v1"]
    assert seen_keys == ["k1"]


def test_record_keys_are_seen_before_both_inputs():
    seen_keys = []
    main = _TwoInput()
    assert _pyflink.hook_record_keys(_Operation(main), seen_keys.append)
    main._process_element_func1(("a", 1))
    main._process_element_func2(("b", 2))
    assert seen_keys == ["a", "b"]


def test_the_broadcast_input_of_a_keyed_broadcast_operation_is_not_hooked():
    seen_keys = []
    main = _TwoInput()
    original = main._process_element_func2
    assert _pyflink.hook_record_keys(_Operation(main), seen_keys.append,
                                     second_input_keyed=False)
    main._process_element_func1(("a", 1))
    assert main._process_element_func2 is original
    assert seen_keys == ["a"]


def test_keyed_broadcast_operations_pass_broadcast_records_unkeyed():
    # KEYED_CO_BROADCAST_PROCESS: keyed (key, value) rows on input 1, plain values on 2.
    source = _embedded_source("fn_execution/datastream/embedded/operations.py")
    branch = source[source.index("func_type == UserDefinedDataStreamFunction."
                                 "KEYED_CO_BROADCAST_PROCESS"):]
    branch = branch[:branch.index("elif func_type")]
    assert "process_element(value[1], read_only_broadcast_ctx)" in branch
    assert "process_broadcast_element(value, broadcast_ctx)" in branch
    assert "runtime_context.set_keyed_state_backend(keyed_state_backend)" in branch


def test_keyed_broadcast_process_is_built_from_these_parts():
    import inspect

    from pyflink.datastream import data_stream

    process = data_stream._pyflink_ndb_originals[2]
    source = inspect.getsource(process)
    assert "PythonKeyedBroadcastStateTransformation" in source
    assert "KEYED_CO_BROADCAST_PROCESS" in source
    assert "self.broadcast_stream.input_stream._j_data_stream" in source
    assert "self.non_broadcast_stream._j_data_stream.getKeySelector()" in source
    broadcast = inspect.getsource(data_stream.DataStream.broadcast)
    assert "BroadcastStream(cast(DataStream, self.broadcast())" in broadcast


def test_unknown_operation_shape_is_left_alone():
    assert not _pyflink.hook_record_keys(object(), lambda key: None)


# -- the job-wide switch (issue 11) -----------------------------------------------------
def test_window_operations_close_over_their_timer_context_and_share_one_state_backend():
    source = _embedded_source("fn_execution/datastream/embedded/operations.py")
    # hook_timer_keys: the window's on_timer_func reads its key from the timer context.
    assert "key = window_timer_context.get_current_key()" in source
    # route_keyed_state: one KeyedStateBackend object for the runtime context and the
    # window operator.
    assert "runtime_context.set_keyed_state_backend(keyed_state_backend)" in source
    assert "window_operator = WindowOperator(\n            window_assigner,\n" \
           "            keyed_state_backend," in source
    runtime = _embedded_source("fn_execution/datastream/embedded/runtime_context.py")
    assert "def get_keyed_state_backend(self):" in runtime
    backend = _embedded_source("fn_execution/embedded/state_impl.py")
    for name in _pyflink.KEYED_STATE_GETTERS:
        assert f"def {name}(self" in backend
    window = _embedded_source("fn_execution/datastream/window/window_operator.py")
    assert "self.window_function.open(runtime_context)" in window
    assert "self.keyed_state_backend.get_map_state(state_descriptor)" in window


def test_timer_keys_are_seen_before_each_timer():
    class TimerContext:
        key = "k0"

        def get_current_key(self):
            return self.key

    def make_on_timer():
        window_timer_context = TimerContext()

        def on_timer_func(timestamp):
            return [(window_timer_context.get_current_key(), timestamp)]

        return on_timer_func, window_timer_context

    main = _OneInput()
    main._on_timer_func, context = make_on_timer()
    seen_keys = []
    assert _pyflink.hook_timer_keys(_Operation(main), seen_keys.append)
    context.key = "k1"
    assert main._on_timer_func(5) == [("k1", 5)]
    assert seen_keys == ["k1"]
    assert not _pyflink.hook_timer_keys(_Operation(_OneInput()), seen_keys.append)


def test_keyed_state_is_routed_on_the_shared_backend_object():
    class Backend:
        def get_current_key(self):
            return "k"

    class RuntimeContext:
        def __init__(self, backend):
            self._backend = backend

        def get_keyed_state_backend(self):
            return self._backend

    backend = Backend()
    assert not _pyflink.route_keyed_state(RuntimeContext(backend), lambda d: None)
    for name in _pyflink.KEYED_STATE_GETTERS:
        setattr(Backend, name, lambda self, descriptor: "java state")
    assert _pyflink.route_keyed_state(RuntimeContext(backend), lambda d: ("tiered", d))
    assert backend.get_map_state("merging-window-set") == ("tiered", "merging-window-set")
    assert not _pyflink.route_keyed_state(object(), lambda d: None)


def test_records_reach_the_operation_as_the_external_form_of_a_key_value_row():
    """What `record_key_reader` relies on: the one-input operation converts each record
    with `_input_data_converter`, a RowDataConverter whose external form is
    `(row kind, fields)`."""
    main = _embedded_source("fn_execution/embedded/operations.py")
    assert "self._input_data_converter = input_data_converter" in main
    assert "self._input_data_converter.to_internal(value))" in main
    converters = _embedded_source("fn_execution/embedded/converters.py")
    assert "self._field_data_converters = field_data_converters" in converters
    assert "for i, item in enumerate(value[1])]" in converters


def test_record_key_reader_converts_only_the_key_field():
    class Field:
        def __init__(self, tag):
            self.tag = tag

        def to_internal(self, value):
            return (self.tag, value)

    class Converter:
        _field_data_converters = [Field("key"), Field("value")]

    class Operation:
        _input_data_converter = Converter()

    read = _pyflink.record_key_reader(Operation())
    assert read((0, ("k1", b"pickled"))) == ("key", "k1")
    assert _pyflink.record_key_reader(object()) is None


def test_record_contexts_read_timestamp_and_timers_from_java():
    """`answer_from_bundle` shadows `timestamp` and `timer_service` of PyFlink's keyed
    record context, whose timer service registers through Java's current key."""
    source = _embedded_source("fn_execution/datastream/embedded/process_function.py")
    context = source.split("class InternalKeyedProcessFunctionContext", 1)[1]
    context = context.split("\nclass ", 1)[0]
    assert "def timestamp(self) -> int:\n        return self._j_context.timestamp()" in context
    assert "def timer_service(self) -> TimerService:" in context
    timers = _embedded_source("fn_execution/datastream/embedded/timerservice_impl.py")
    for method in ("registerProcessingTimeTimer", "registerEventTimeTimer",
                   "deleteProcessingTimeTimer", "deleteEventTimeTimer"):
        assert f"self._j_timer_service.{method}(timestamp)" in timers


class _Timers:
    def __init__(self, calls):
        self.calls = calls

    def current_processing_time(self):
        return 5

    def current_watermark(self):
        return 7

    def register_event_time_timer(self, timestamp):
        self.calls.append(("register", timestamp))

    def delete_event_time_timer(self, timestamp):
        self.calls.append(("delete", timestamp))

    register_processing_time_timer = register_event_time_timer
    delete_processing_time_timer = delete_event_time_timer


class _RecordContext:
    def __init__(self, calls):
        self._timers = _Timers(calls)

    def timestamp(self):
        return "java"

    def timer_service(self):
        return self._timers


class _BundleBackend:
    def __init__(self, calls):
        self.bundle = None
        self.calls = calls

    def select_bundle_record(self):
        self.calls.append(("select", self.bundle.index))

    def bundle_processing_timer(self, timestamp, delete):
        """As the bridge answers: timestamp 99 is the timer firing now."""
        self.calls.append(("processing", self.bundle.index, timestamp, delete))
        return timestamp == 99


def test_a_record_context_answers_for_the_record_of_a_bundle():
    from pyflink_ndb.runtime.backend import RecordInBundle

    calls: list = []
    backend = _BundleBackend(calls)
    context = _RecordContext(calls)
    assert _pyflink.answer_from_bundle(context, backend)
    timers = context.timer_service()
    assert context.timestamp() == "java"  # outside a bundle: Java's answer
    record = backend.bundle = RecordInBundle()
    record.index, record.timestamp = 3, 1234
    assert context.timestamp() == 1234
    timers.register_event_time_timer(10)
    timers.delete_event_time_timer(12)
    timers.delete_processing_time_timer(11)
    timers.register_processing_time_timer(13)
    assert (timers.current_processing_time(), timers.current_watermark()) == (5, 7)
    assert calls == [("select", 3), ("register", 10), ("select", 3), ("delete", 12),
                     ("processing", 3, 11, True), ("delete", 11),
                     ("processing", 3, 13, False), ("register", 13)]
    # The timer whose firing runs the bundle: the bridge cancels or restores it itself.
    del calls[:]
    timers.delete_processing_time_timer(99)
    timers.register_processing_time_timer(99)
    assert calls == [("processing", 3, 99, True), ("processing", 3, 99, False)]
    assert _pyflink.answer_from_bundle(object(), backend) is False  # takes no attributes


def test_every_stream_graph_of_a_job_passes_the_restore_check(tmp_path, caplog):
    """PyFlink builds a job's Java StreamGraph in `_generate_stream_graph` (execute,
    execute_async, get_execution_plan); `import pyflink_ndb` wraps it so that the restore
    check (pyflink_ndb.api.restore_check) sees each one, with its restore settings and the
    job graph's operators (tests/test_switch_from_flink_state_flink.py runs it on Flink)."""
    import sys

    from pyflink.common import Configuration, Types
    from pyflink.datastream import StreamExecutionEnvironment

    import pyflink_ndb  # noqa: F401
    from pyflink_ndb.api import restore_check

    config = Configuration()
    config.set_string("python.execution-mode", "thread")
    config.set_string("python.executable", sys.executable)
    config.set_string("execution.savepoint.path", str(tmp_path / "nowhere"))
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.from_collection([1, 2], Types.INT()).key_by(lambda v: v) \
        .map(lambda v: v, output_type=Types.INT()).uid("doubled")
    with caplog.at_level("WARNING"):
        graph = env._generate_stream_graph(clear_transformations=False)
    # a snapshot the client cannot read is left to Flink, and said
    assert "could not check restored snapshot" in caplog.text
    settings = graph.getSavepointRestoreSettings()
    assert settings.restoreSavepoint() and str(tmp_path / "nowhere") in settings.getRestorePath()
    ops = restore_check.job_operators(graph)
    assert any(name == "uid doubled" for _, name, _ in ops), ops
    assert all(len(op_id) == 32 for op_id, _, _ in ops), ops
    assert StreamExecutionEnvironment._generate_stream_graph.__name__ == "generate_stream_graph"
    # a wrong value of the option is refused at once, by name
    from pyflink.util.java_utils import get_j_env_configuration

    from pyflink_ndb.errors import ConfigurationError

    get_j_env_configuration(env._j_stream_execution_environment).setString(
        "state.backend.ndb.restore.backend-change", "drop")
    with pytest.raises(ConfigurationError, match="restore.backend-change"):
        env._generate_stream_graph(clear_transformations=False)
