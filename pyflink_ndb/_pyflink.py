"""The one place that reaches into PyFlink internals, where PyFlink offers no public way.

Each function names what it reaches for; tests/test_pyflink_internals.py pins them against
the installed apache-flink 1.20.
"""

from __future__ import annotations

import copy
import datetime
import decimal
from typing import Any

from pyflink.common import Row
from pyflink.datastream import TimerService


def ttl_config_of(descriptor: Any) -> Any:
    """The `StateTtlConfig` of a state descriptor, or None (PyFlink has no getter)."""
    return getattr(descriptor, "_ttl_config", None)


def j_data_stream(stream: Any) -> Any:
    """The Java DataStream behind a PyFlink DataStream/KeyedStream."""
    return stream._j_data_stream


def j_env_configuration(stream: Any) -> Any:
    """The live Java `Configuration` of the stream's execution environment."""
    from pyflink.util.java_utils import get_j_env_configuration

    return get_j_env_configuration(j_data_stream(stream).getExecutionEnvironment())


def add_jar(stream: Any, jar_url: str) -> None:
    """Add a jar to `pipeline.jars` and to the client's class loader, as
    `StreamExecutionEnvironment.add_jars` does (which needs the Python env object)."""
    from pyflink.common import Configuration
    from pyflink.java_gateway import get_gateway
    from pyflink.util.java_utils import add_jars_to_context_class_loader

    jvm = get_gateway().jvm
    env_config = j_env_configuration(stream)
    jars_key = jvm.org.apache.flink.configuration.PipelineOptions.JARS.key()
    standard_yaml = jvm.org.apache.flink.configuration.GlobalConfiguration.isStandardYaml()
    old = Configuration.parse_list_value(env_config.getString(jars_key, None), standard_yaml)
    if jar_url in old:
        return
    add_jars_to_context_class_loader([jar_url])
    joined = [*old, jar_url]
    env_config.setString(jars_key, str(joined) if standard_yaml else ";".join(joined))


def python_function_info(func: Any, func_type: int) -> Any:
    """The Java `DataStreamPythonFunctionInfo` of a pickled Python function."""
    from pyflink.datastream.data_stream import _create_j_data_stream_python_function_info

    return _create_j_data_stream_python_function_info(func, func_type)


def function_types() -> Any:
    """PyFlink's `UserDefinedDataStreamFunction` enum (KEYED_PROCESS, KEYED_CO_PROCESS,
    KEYED_CO_BROADCAST_PROCESS, WINDOW)."""
    from pyflink.fn_execution.flink_fn_execution_pb2 import UserDefinedDataStreamFunction

    return UserDefinedDataStreamFunction


def hook_record_keys(operation: Any, set_key: Any, *,
                     second_input_keyed: bool = True) -> bool:
    """Call `set_key(record[0])` before each record of a keyed function operation.

    PyFlink's embedded keyed operations receive `(key, value)` rows and pass `value` to the
    user function; reading the key here saves a call into Java per record. Returns False
    (nothing changed) when the operation does not have the expected shape.

    :param second_input_keyed: False for a keyed broadcast operation, whose second
        (broadcast) input passes its records unkeyed (`KEYED_CO_BROADCAST_PROCESS` in
        `fn_execution/datastream/embedded/operations.py`): its records are not hooked.
    """
    main = getattr(operation, "_main_operation", None)
    candidates = ("_process_element_func", "_process_element_func1") + (
        ("_process_element_func2",) if second_input_keyed else ())
    names = [n for n in candidates if callable(getattr(main, n, None))]
    if not names:
        return False
    for name in names:
        original = getattr(main, name)

        def hooked(value: Any, _original: Any = original) -> Any:
            set_key(value[0])
            return _original(value)

        setattr(main, name, hooked)
    return True


def record_key_reader(operation: Any) -> Any:
    """A function that reads the key of a record as Java hands it to `operation` (a
    thread-mode keyed operation, before its input converter), or None when the operation
    has another shape.

    PyFlink's embedded `OneInputFunctionOperation.process_element` converts the record
    with `_input_data_converter` (`fn_execution/embedded/converters.py`): a
    `RowDataConverter` of the `(key, value)` row, whose external form is
    `(row kind, (key, value))`. Only the key field is converted here (the value may be
    pickled: unpickling it twice per record would cost more than the read it saves).
    """
    converter = getattr(operation, "_input_data_converter", None)
    fields = getattr(converter, "_field_data_converters", None)
    if not fields or not callable(getattr(fields[0], "to_internal", None)):
        return None
    key_field = fields[0]

    def record_key(record: Any) -> Any:
        return key_field.to_internal(record[1][0])
    return record_key


#: The getters of PyFlink's embedded `KeyedStateBackend` that create keyed state.
KEYED_STATE_GETTERS = ("get_value_state", "get_list_state", "get_map_state",
                       "get_reducing_state", "get_aggregating_state")


def route_keyed_state(runtime_context: Any, get_state: Any) -> bool:
    """Make the keyed state of a thread-mode operation come from `get_state(descriptor)`.

    PyFlink's embedded operations (`fn_execution/datastream/embedded/operations.py`) hand
    one `KeyedStateBackend` object both to the runtime context and to the window operator
    (window contents, trigger state, per-window and global state, the merging window set);
    its five getters are replaced on that object. Returns False when the runtime context
    has no keyed state backend (not a keyed operation).
    """
    getter = getattr(runtime_context, "get_keyed_state_backend", None)
    keyed_backend = getter() if callable(getter) else None
    if keyed_backend is None or not all(hasattr(keyed_backend, n) for n in KEYED_STATE_GETTERS):
        return False
    for name in KEYED_STATE_GETTERS:
        setattr(keyed_backend, name, get_state)
    return True


def hook_timer_keys(operation: Any, set_key: Any) -> bool:
    """Call `set_key(<the timer's key>)` before each timer of a thread-mode operation.

    PyFlink's embedded `on_timer_func` closes over the timer context whose
    `get_current_key()` reads the firing timer's key from Java. Returns False (nothing
    changed) when the operation does not have that shape.
    """
    main: Any = getattr(operation, "_main_operation", None)
    on_timer: Any = getattr(main, "_on_timer_func", None)
    cells = getattr(on_timer, "__closure__", None) or ()
    contexts = [c.cell_contents for c in cells
                if callable(getattr(c.cell_contents, "get_current_key", None))]
    if len(contexts) != 1:
        return False
    context = contexts[0]

    def hooked(timestamp: Any) -> Any:
        set_key(context.get_current_key())
        return on_timer(timestamp)

    main._on_timer_func = hooked
    return True


def answer_key_from_record(context: Any, backend: Any) -> bool:
    """Make a record context's `get_current_key()` return `backend.current_key`, the key
    that :func:`hook_record_keys` read from the record, instead of asking Java.

    PyFlink's `InternalKeyedProcessFunctionContext.get_current_key()`
    (`fn_execution/datastream/embedded/process_function.py`) converts
    `j_context.getCurrentKey()`, a call into the JVM per record (1.5 us of CPU but about
    10 us of wall time at parallelism 2: java-bridge/README.md, "PEMJA across threads");
    the record carries the same key, converted by the same key type information, since
    PyFlink keys a stream by field 0 of the `(key, value)` rows its key selector made.
    An instance attribute shadows the method on this context object only; the timer
    context keeps Java's answer. As PyFlink's own answer, each call returns an object of
    its own: a key that can be changed in place (a `Row`, or a list or dict in a pickled
    key) is copied (:func:`key_answer`), so a function that changes the key it got does
    not change what the next call returns.

    :returns: True when the context now answers from the record; False (nothing changed)
        when it takes no attributes.
    """
    import functools

    try:
        context.get_current_key = functools.partial(key_answer, backend)
    except AttributeError:
        return False
    return True


def answer_from_bundle(context: Any, backend: Any) -> bool:
    """Make a record context answer for the record of a bundle (`bundle.records`): its
    `timestamp()` is the record's, and its timer service makes the record Java's current
    record before a timer is registered or deleted (:class:`BundleTimerService`). Outside
    a bundle both ask Java as before. Its `get_current_key()` answers from the record
    already (:func:`answer_key_from_record`).

    PyFlink's `InternalKeyedProcessFunctionContext`
    (`fn_execution/datastream/embedded/process_function.py`) reads `j_context.timestamp()`,
    the Java operator's timestamp of the record it processes, and registers timers through
    Flink's `SimpleTimerService`, whose `InternalTimerService` takes the key from the
    operator's current key: while a bundle is processed in one call, Java's current record
    is not the one Python processes. Instance attributes shadow the methods on this
    context object only.

    :returns: True when the context now answers for bundles; False (nothing changed) when
        it takes no attributes or has no timer service.
    """
    java_timestamp = getattr(context, "timestamp", None)
    java_timer_service = getattr(context, "timer_service", None)
    if not callable(java_timestamp) or not callable(java_timer_service):
        return False
    service = BundleTimerService(backend, java_timer_service())
    try:
        context.timestamp = _bundle_timestamp(backend, java_timestamp)
        context.timer_service = lambda: service
    except AttributeError:
        return False
    return True


class BundleTimerService(TimerService):
    """A record context's timer service in a bundle: Flink registers and deletes a timer
    for Java's current key, so the record being processed is made Java's current record
    first (`backend.select_bundle_record()`, one call into Java per record that touches
    its timers; nothing outside a bundle). A processing-time timer is first checked
    against the one whose firing runs the bundle (`backend.bundle_processing_timer`):
    Flink took that one out of its queue already, so the bridge cancels or restores it.
    The clock and the watermark are Java's (a bundle is processed before any watermark
    that follows its records; the clock is read when the bundle runs, at most
    `bundle.max-wait-ms` after the record arrived)."""

    def __init__(self, backend: Any, service: Any) -> None:
        self._backend = backend
        self._service = service

    def current_processing_time(self) -> int:
        return self._service.current_processing_time()

    def current_watermark(self) -> int:
        return self._service.current_watermark()

    def register_processing_time_timer(self, timestamp: int) -> None:
        if not self._backend.bundle_processing_timer(timestamp, False):
            self._service.register_processing_time_timer(timestamp)

    def register_event_time_timer(self, timestamp: int) -> None:
        self._backend.select_bundle_record()
        self._service.register_event_time_timer(timestamp)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        if not self._backend.bundle_processing_timer(timestamp, True):
            self._service.delete_processing_time_timer(timestamp)

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._backend.select_bundle_record()
        self._service.delete_event_time_timer(timestamp)


def answer_chained_timestamps(operation: Any, backend: Any) -> bool:
    """Make the record contexts of the operations PyFlink chained after a keyed operation
    (`FunctionOperation._chained_operations`, `fn_execution/embedded/operations.py`)
    answer `timestamp()` for the record of a bundle, as :func:`answer_from_bundle` does for
    the keyed function's own context: each chained operation closes over a context of its
    own (`InternalProcessFunctionContext`, `fn_execution/datastream/embedded/
    process_function.py`) that reads the Java operator's timestamp.

    :returns: True when every chained operation's context answers now (also when none is
        chained); False when one has another shape (then no bundles: see
        :meth:`SubtaskStateBackend.read_ahead_settings`).
    """
    for chained in getattr(operation, "_chained_operations", None) or ():
        function = getattr(chained, "_process_element_func", None)
        cells = getattr(function, "__closure__", None) or ()
        contexts = [c.cell_contents for c in cells
                    if hasattr(c.cell_contents, "_j_context")
                    and callable(getattr(c.cell_contents, "timestamp", None))]
        if not contexts:
            return False
        for context in contexts:
            try:
                context.timestamp = _bundle_timestamp(backend, context.timestamp)
            except AttributeError:
                return False
    return True


def _bundle_timestamp(backend: Any, java_timestamp: Any) -> Any:
    """A context's `timestamp()`: the record's in a bundle, else `java_timestamp()`."""
    def timestamp() -> Any:
        record = backend.bundle
        return java_timestamp() if record is None else record.timestamp
    return timestamp


#: Key types whose objects cannot change: returned as they are by :func:`key_answer`.
_IMMUTABLE_KEY_TYPES = frozenset({int, str, float, bool, bytes, type(None), datetime.date,
                                  datetime.datetime, datetime.time, decimal.Decimal})


def key_answer(backend: Any) -> Any:
    """`backend.current_key` as `get_current_key()` returns it: an object of its own
    (:func:`key_copy`)."""
    return key_copy(backend.current_key)


def key_copy(key: Any) -> Any:
    """A key that shares nothing changeable with `key`: the object itself when nothing in
    it can change (:data:`_IMMUTABLE_KEY_TYPES`, or a tuple of such); a `Row` field by
    field (1.2 us for two fields here, where `copy.deepcopy` takes 8); anything else (a
    list or dict of a pickled key) by `copy.deepcopy`."""
    kind = type(key)
    if kind in _IMMUTABLE_KEY_TYPES:
        return key
    if kind is tuple:
        if all(type(k) in _IMMUTABLE_KEY_TYPES for k in key):
            return key
        return tuple(key_copy(k) for k in key)
    if isinstance(key, Row):
        row = object.__new__(kind)
        fields = dict(key.__dict__)
        fields["_values"] = [key_copy(v) for v in key._values]
        if "_fields" in fields:
            fields["_fields"] = list(fields["_fields"])
        row.__dict__.update(fields)
        return row
    return copy.deepcopy(key)


def install_operator_factories(one_input: Any, two_input: Any,
                               keyed_broadcast: Any) -> tuple[Any, Any, Any]:
    """Replace PyFlink's builders of Java Python-function operators
    (`pyflink.datastream.data_stream._get_one_input_stream_operator` /
    `_get_two_input_stream_operator`, which every `DataStream`/`KeyedStream`/
    `WindowedStream`/`ConnectedStreams` call that runs a Python function goes through) and
    `BroadcastConnectedStream.process` (which builds a `PythonKeyedBroadcastStateTransformation`
    that Flink's Java translator, `PythonKeyedBroadcastStateTransformationTranslator`, turns
    into an `EmbeddedPythonKeyedCoProcessOperator` in streaming mode).

    :param one_input: called as `one_input(original, data_stream, func, func_type,
        output_type)`.
    :param two_input: called as `two_input(original, connected_streams, func, func_type,
        type_info)`.
    :param keyed_broadcast: called as `keyed_broadcast(original, broadcast_connected_stream,
        func, output_type)`.
    :returns: PyFlink's originals. Installing twice keeps the first originals.
    """
    from pyflink.datastream import data_stream

    originals = getattr(data_stream, "_pyflink_ndb_originals", None)
    if originals is None:
        originals = (data_stream._get_one_input_stream_operator,
                     data_stream._get_two_input_stream_operator,
                     data_stream.BroadcastConnectedStream.process)
        data_stream._pyflink_ndb_originals = originals
    one, two, broadcast = originals

    def one_input_operator(*args: Any, **kwargs: Any) -> Any:
        return one_input(one, *args, **kwargs)

    def two_input_operator(*args: Any, **kwargs: Any) -> Any:
        return two_input(two, *args, **kwargs)

    def broadcast_process(self: Any, func: Any, output_type: Any = None) -> Any:
        return keyed_broadcast(broadcast, self, func, output_type)

    broadcast_process.__doc__ = broadcast.__doc__
    data_stream._get_one_input_stream_operator = one_input_operator
    data_stream._get_two_input_stream_operator = two_input_operator
    data_stream.BroadcastConnectedStream.process = broadcast_process
    return originals


def broadcast_parts(connected: Any) -> tuple[Any, Any]:
    """(the non-broadcast stream, the broadcast-partitioned Java DataStream) of a PyFlink
    `BroadcastConnectedStream`; `DataStream.broadcast(descriptor)` keeps the partitioned
    stream as the `BroadcastStream`'s `input_stream`."""
    return (connected.non_broadcast_stream,
            j_data_stream(connected.broadcast_stream.input_stream))


def input_type_of(stream: Any) -> Any:
    """The Java output type of a stream's transformation (its records' type)."""
    return stream._j_data_stream.getTransformation().getOutputType()


def window_namespace_serializer(window_serializer: Any) -> Any:
    """The Java serializer of a window type, as PyFlink's `_get_one_input_stream_operator`
    picks it for `EmbeddedPythonWindowOperator`."""
    from pyflink.datastream.window import (
        CountWindowSerializer,
        GlobalWindowSerializer,
        TimeWindowSerializer,
    )
    from pyflink.java_gateway import get_gateway

    jvm = get_gateway().jvm
    if isinstance(window_serializer, TimeWindowSerializer):
        return jvm.org.apache.flink.table.runtime.operators.window.TimeWindow.Serializer()
    if isinstance(window_serializer, CountWindowSerializer):
        return jvm.org.apache.flink.table.runtime.operators.window.CountWindow.Serializer()
    if isinstance(window_serializer, GlobalWindowSerializer):
        return jvm.org.apache.flink.streaming.api.windowing.windows.GlobalWindow.Serializer()
    return jvm.org.apache.flink.streaming.api.utils.ByteArrayWrapperSerializer()


def declares_keyed_state(function: Any) -> bool:
    """Whether a keyed function can declare keyed state: only in `open(runtime_context)`,
    the one place a PyFlink function is given its runtime context.

    PyFlink wraps `KeyedStream.map/flat_map/filter/reduce` and keyed `ConnectedStreams.
    map/flat_map` in `...Adapter` classes (`pyflink/datastream/data_stream.py`) that keep
    the user's `open` as `_open_func` (None for a plain callable); the reduce adapter always
    keeps its running value in a `ReducingState`.
    """
    from pyflink.datastream.functions import Function

    if type(function).__name__.endswith("Adapter") and hasattr(function, "_open_func"):
        if hasattr(function, "_reduce_function"):
            return True
        user_open = function._open_func
        owner = getattr(user_open, "__self__", None)
        return owner is not None and type(owner).open is not Function.open
    return type(function).open is not Function.open


_REDUCE_STATE_PREFIX = "_reduce_state"
_UUID_LENGTH = 36


def stable_state_name(name: str) -> str:
    """The name under which a state is kept: `name`, except for the running value of
    `KeyedStream.reduce`, which PyFlink names `"_reduce_state" + str(uuid.uuid4())` anew
    at every `open()` (`data_stream.py`, `ReduceProcessKeyedProcessFunctionAdapter`), so
    that a restored attempt would never find it: it is kept as `_reduce_state`."""
    if name.startswith(_REDUCE_STATE_PREFIX) and len(name) == (
            len(_REDUCE_STATE_PREFIX) + _UUID_LENGTH):
        return _REDUCE_STATE_PREFIX
    return name


def install_stream_graph_check(check: Any) -> None:
    """Call `check(j_stream_graph, j_configuration)` on every Java `StreamGraph` PyFlink
    builds for a job, before it is used (`StreamExecutionEnvironment._generate_stream_graph`,
    which `execute`, `execute_async` and `get_execution_plan` call, after PyFlink's Python
    operator chaining). An exception from `check` fails that call. Installing twice keeps
    PyFlink's original."""
    from pyflink.datastream import StreamExecutionEnvironment
    from pyflink.util.java_utils import get_j_env_configuration

    original = getattr(StreamExecutionEnvironment, "_pyflink_ndb_original_generate", None)
    if original is None:
        original = StreamExecutionEnvironment._generate_stream_graph
        StreamExecutionEnvironment._pyflink_ndb_original_generate = original

    def generate_stream_graph(self: Any, *args: Any, **kwargs: Any) -> Any:
        j_stream_graph = original(self, *args, **kwargs)
        check(j_stream_graph, get_j_env_configuration(self._j_stream_execution_environment))
        return j_stream_graph

    StreamExecutionEnvironment._generate_stream_graph = generate_stream_graph
