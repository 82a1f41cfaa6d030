"""The one place that reaches into PyFlink internals, where PyFlink offers no public way.

Each function names what it reaches for; tests/test_pyflink_internals.py pins them against
the installed apache-flink 1.20.
"""

from __future__ import annotations

from typing import Any


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
    """PyFlink's `UserDefinedDataStreamFunction` enum (KEYED_PROCESS, KEYED_CO_PROCESS)."""
    from pyflink.fn_execution.flink_fn_execution_pb2 import UserDefinedDataStreamFunction

    return UserDefinedDataStreamFunction


def hook_record_keys(operation: Any, set_key: Any) -> bool:
    """Call `set_key(record[0])` before each record of a keyed function operation.

    PyFlink's embedded keyed operations receive `(key, value)` rows and pass `value` to the
    user function; reading the key here saves a call into Java per record. Returns False
    (nothing changed) when the operation does not have the expected shape.
    """
    main = getattr(operation, "_main_operation", None)
    names = [n for n in ("_process_element_func", "_process_element_func1",
                         "_process_element_func2") if callable(getattr(main, n, None))]
    if not names:
        return False
    for name in names:
        original = getattr(main, name)

        def hooked(value: Any, _original: Any = original) -> Any:
            set_key(value[0])
            return _original(value)

        setattr(main, name, hooked)
    return True
