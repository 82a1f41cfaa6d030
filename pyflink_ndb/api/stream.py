"""`process` and `co_process`: apply a keyed function on the bridge operator.

These are the only calls a job needs; the function itself stays an ordinary PyFlink
`KeyedProcessFunction` / `KeyedCoProcessFunction` that declares its state in `open()`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyflink.datastream import (
    ConnectedStreams,
    DataStream,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    KeyedStream,
)

from pyflink_ndb import _pyflink
from pyflink_ndb.api.functions import TieredKeyedCoProcessFunction, TieredKeyedProcessFunction
from pyflink_ndb.checkpoint.protocol import check_fresh_start
from pyflink_ndb.config import (
    FLINK_RETAINED_KEYS,
    PREFIX,
    NdbStateOptions,
    from_flink_keys,
    resolve_sqlite_url,
    to_flink_keys,
)
from pyflink_ndb.errors import ConfigurationError
from pyflink_ndb.runtime.bridge import DEFAULT_URL_KEY, OPERATOR_KEY
from pyflink_ndb.stores.factory import open_store

#: The bridge jar shipped inside the package (the wheel's build step compiles it; in a
#: checkout `make jar` does).
BRIDGE_JAR = Path(__file__).resolve().parent.parent / "jars" / "pyflink-ndb-bridge.jar"
_BRIDGE_PACKAGE = "io.pyflinkndb.bridge"
#: What rebuilds a missing jar, for an installed package and for a checkout.
MISSING_JAR_FIX = (
    "Installed from a wheel: reinstall it, `pip install --force-reinstall --no-deps "
    "pyflink_ndb-<version>-py3-none-any.whl` (`pip wheel --no-deps .` or `python -m build "
    "--wheel` builds one that carries the jar; building needs a JDK 11 or newer). In a "
    "checkout of the repository: `make jar` (javac against the jars of the installed "
    "apache-flink wheel).")


def bridge_jar() -> Path:
    """Path of the bridge jar, :data:`BRIDGE_JAR`.

    :raises ConfigurationError: the jar is missing; the message names the fix for an
        installed package (reinstall the wheel) and for a checkout (`make jar`).
    """
    if not BRIDGE_JAR.is_file():
        raise ConfigurationError(
            f"The pyflink-ndb bridge jar is missing at {BRIDGE_JAR}. {MISSING_JAR_FIX}")
    return BRIDGE_JAR


#: The configuration keys by which a job restores a checkpoint or savepoint.
RESTORE_PATH_KEYS = ("execution.state-recovery.path", "execution.savepoint.path")


def _job_options(j_conf: Any, options: NdbStateOptions | Mapping[str, Any] | None
                 ) -> tuple[NdbStateOptions, dict[str, Any]]:
    """(validated options, the `state.backend.ndb.*` keys the client was given).

    Only given keys travel with the job, so that keys a job leaves unset can come from the
    TaskManagers' flink-conf.yaml; a relative SQLite path is resolved here.
    """
    env_keys = {k: v for k, v in dict(j_conf.toMap()).items()
                if k.startswith(PREFIX) or k in FLINK_RETAINED_KEYS}
    if isinstance(options, NdbStateOptions):
        explicit = to_flink_keys(options)
    else:
        explicit = dict(options or {})
    given = {**env_keys, **explicit}
    resolved = from_flink_keys(given)
    resolved = resolved.replace(url=resolve_sqlite_url(resolved.url))
    if PREFIX + "url" in given:
        given[PREFIX + "url"] = resolved.url
    return resolved, given


def operator_name(function: Any, uid: str | None) -> str:
    """The name of an operator applied with :func:`process`: its uid, else the function's
    qualified class name."""
    return uid or f"{type(function).__module__}.{type(function).__qualname__}"


def prepare_bridge(stream: Any, operator: str | None,
                   options: NdbStateOptions | Mapping[str, Any] | None,
                   check_store: bool) -> tuple[Any, str]:
    """Check thread mode, resolve the options, add the bridge jar to the job.

    :param operator: the operator's name in the store; None: the Flink operator ID the
        subtasks see (stable when the user sets a uid, as Flink's own state mapping).
    :param check_store: open the store once now (only with a URL on the client and an
        `operator`) to fail early on a wrong URL or a forbidden fresh start.
    :returns: (the environment's Java configuration, the options JSON for the bridge).
    :raises ConfigurationError: process mode, a bad option, the jar missing.
    """
    j_conf = _pyflink.j_env_configuration(stream)
    mode = j_conf.getString("python.execution-mode", "process")
    if mode != "thread":
        raise ConfigurationError(
            f"pyflink-ndb needs thread mode, but python.execution-mode is {mode!r}. Set it "
            "in the job's Configuration: config.set_string('python.execution-mode', "
            "'thread') before StreamExecutionEnvironment.get_execution_environment(config) "
            "(a local `python job.py` reads only that; flink-conf.yaml applies to jobs "
            "submitted with `flink run` to a cluster).")
    if not j_conf.containsKey("python.executable"):
        # Restarted tasks need the same interpreter (see README, "Thread mode").
        j_conf.setString("python.executable", sys.executable)
    resolved, given = _job_options(j_conf, options)
    if check_store and operator is not None and PREFIX + "url" in given:
        store = open_store(resolved)
        try:
            # Flink 1.20's `flink run -s` sets execution.state-recovery.path; the older
            # key is still honoured (SavepointConfigOptions / StateRecoveryOptions).
            if not any(j_conf.containsKey(key) for key in RESTORE_PATH_KEYS):
                check_fresh_start(store, resolved, operator)
        finally:
            store.close()
    jar = bridge_jar()
    _pyflink.add_jar(stream, jar.as_uri())
    keys = {k: str(v) for k, v in given.items()}
    if operator is not None:
        keys[OPERATOR_KEY] = operator
    keys[DEFAULT_URL_KEY] = resolved.url
    return j_conf, json.dumps(keys, sort_keys=True)


def bridge_class(name: str) -> Any:
    """The Java class `name` of the bridge jar (added to the job by :func:`prepare_bridge`)."""
    from pyflink.java_gateway import get_gateway

    return getattr(get_gateway().jvm, f"{_BRIDGE_PACKAGE}.{name}")


def output_type_info(output_type: Any) -> Any:
    """PyFlink's rule for an operator's output type: None is pickled bytes, a list is a
    `RowTypeInfo`."""
    from pyflink.common.typeinfo import RowTypeInfo, Types

    if output_type is None:
        return Types.PICKLED_BYTE_ARRAY()
    if isinstance(output_type, list):
        return RowTypeInfo(output_type)
    return output_type


def process(keyed_stream: KeyedStream, function: KeyedProcessFunction,
            output_type: Any = None, *, uid: str | None = None, name: str | None = None,
            options: NdbStateOptions | Mapping[str, Any] | None = None,
            check_store: bool = True) -> DataStream:
    """Apply `function` to `keyed_stream` with its keyed state in pyflink-ndb.

    :param keyed_stream: the result of `DataStream.key_by(...)`.
    :param function: an ordinary `KeyedProcessFunction`; it declares state in `open()`.
    :param output_type: `TypeInformation` of the output (None: pickled bytes), as for
        `KeyedStream.process`.
    :param uid: stable operator name; it names the operator's states in the store and is
        set as the Flink operator uid. None: the function's qualified class name (give a
        uid when one job applies the same class twice).
    :param name: display name of the operator (default "NDB KEYED PROCESS").
    :param options: `NdbStateOptions` or a dict of `state.backend.ndb.*` keys; they override
        the environment's configuration (flink-conf.yaml, `Configuration`).
    :param check_store: when the client is given a URL, open the store once now, so that
        a wrong URL, an unreachable database or (without `execution.savepoint.path`) a
        fresh start that `on-fresh-start: fail` forbids fails when the job is built
        (default True). Without a URL on the client the TaskManagers' configuration
        decides, and the subtasks check it when they open.
    :returns: the output stream.
    :raises ConfigurationError: process mode, an unknown `state.backend.ndb.*` key, a bad
        value or a missing bridge jar.
    :raises StoreUnavailableError: `check_store` and the database cannot be reached.
    :raises NamespaceInUseError: `check_store` and the fresh start is forbidden.
    """
    if not isinstance(keyed_stream, KeyedStream):
        raise TypeError("pyflink_ndb.process needs a KeyedStream: call key_by(...) first.")
    if not isinstance(function, KeyedProcessFunction):
        raise TypeError(
            f"pyflink_ndb.process needs a KeyedProcessFunction, not a "
            f"{type(function).__name__}: write the function as one (its process_element "
            "yields the outputs), or keep keyed_stream.map/flat_map/reduce and turn on the "
            "job-wide switch (state.backend.ndb.enabled: true), which covers them.")

    j_conf, options_json = prepare_bridge(keyed_stream, operator_name(function, uid), options,
                                          check_store)
    types = _pyflink.function_types()
    j_info = _pyflink.python_function_info(TieredKeyedProcessFunction(function),
                                           types.KEYED_PROCESS)
    j_stream = _pyflink.j_data_stream(keyed_stream)
    j_output = output_type_info(output_type).get_java_type_info()
    operator_cls = bridge_class("NdbKeyedProcessOperator")
    j_operator = operator_cls(j_conf, j_info, j_stream.getTransformation().getOutputType(),
                              j_output, options_json)
    result = DataStream(j_stream.transform(name or "NDB KEYED PROCESS", j_output, j_operator))
    if uid:
        result.uid(uid)
    return result


def co_process(connected: ConnectedStreams, function: KeyedCoProcessFunction,
               output_type: Any = None, *, uid: str | None = None, name: str | None = None,
               options: NdbStateOptions | Mapping[str, Any] | None = None,
               check_store: bool = True) -> DataStream:
    """Apply a `KeyedCoProcessFunction` to two connected keyed streams with tiered state.

    Arguments, result and errors as :func:`process`; `connected` is
    `keyed1.connect(keyed2)` where both inputs are keyed.
    """
    if not (isinstance(connected, ConnectedStreams)
            and isinstance(connected.stream1, KeyedStream)
            and isinstance(connected.stream2, KeyedStream)):
        raise TypeError("pyflink_ndb.co_process needs two connected KeyedStreams.")
    if not isinstance(function, KeyedCoProcessFunction):
        raise TypeError("pyflink_ndb.co_process needs a KeyedCoProcessFunction.")

    j_conf, options_json = prepare_bridge(connected.stream1, operator_name(function, uid),
                                          options, check_store)
    types = _pyflink.function_types()
    j_info = _pyflink.python_function_info(TieredKeyedCoProcessFunction(function),
                                           types.KEYED_CO_PROCESS)
    j1 = _pyflink.j_data_stream(connected.stream1)
    j2 = _pyflink.j_data_stream(connected.stream2)
    j_output = output_type_info(output_type).get_java_type_info()
    operator_cls = bridge_class("NdbKeyedCoProcessOperator")
    j_operator = operator_cls(j_conf, j_info, j1.getTransformation().getOutputType(),
                              j2.getTransformation().getOutputType(), j_output, options_json)
    result = DataStream(j1.connect(j2).transform(name or "NDB KEYED CO-PROCESS", j_output,
                                                 j_operator))
    if uid:
        result.uid(uid)
    return result
