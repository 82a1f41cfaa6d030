"""The job-wide switch: `state.backend.ndb.enabled: true` puts every keyed Python operator
that can hold keyed state on tiered state, with the user's functions and stream calls
unchanged (README, "Switch a whole job").

Why a configuration value honoured by `import pyflink_ndb` (and not a call on the
environment): the job then changes by one import, and whether it runs on tiered state is
decided where Flink users already decide their state backend — `flink-conf.yaml`,
`flink run -D...`, or the job's `Configuration` — so the same job file runs on Flink's
own backends with the key off. The key is read from the environment's configuration each
time PyFlink builds a Python operator (so it must be set before the stream calls).

What is switched (each through PyFlink's one builder of Java Python-function operators,
:func:`pyflink_ndb._pyflink.install_operator_factories`):

* `KeyedStream.process`, `map`, `flat_map`, `filter` (PyFlink runs them as keyed process
  functions) when the user's function overrides `open()` — the one place a PyFlink
  function gets its runtime context, so one without it cannot hold keyed state and is
  left on PyFlink's operator; `KeyedStream.reduce` always (its running value is a
  `ReducingState`);
* keyed `ConnectedStreams.process/map/flat_map` under the same rule;
* windows on keyed streams (`WindowedStream.reduce/aggregate/process/apply`, any
  assigner of PyFlink's, merging ones included): the window contents, trigger state,
  the merging window set and `ProcessWindowFunction.window_state()/global_state()`;
* `keyed.connect(broadcast_stream).process(KeyedBroadcastProcessFunction)` under the
  `open()` rule: its keyed state is tiered, its broadcast state stays in Flink (operator
  state). PyFlink builds it as a `PythonKeyedBroadcastStateTransformation`, which Flink's
  `PythonKeyedBroadcastStateTransformationTranslator` turns, in streaming mode, into an
  `EmbeddedPythonKeyedCoProcessOperator` over the keyed input (its key selector) and the
  broadcast-partitioned input (no key selector); the switch builds the same two-input
  transformation with the bridge's `NdbKeyedCoProcessOperator`.

Not switched: non-keyed operators (they hold no keyed state) and everything in process
mode (`python.execution-mode: process`, which the bridge cannot run: ConfigurationError).
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Any

from pyflink_ndb import _pyflink
from pyflink_ndb.api.functions import (
    TieredKeyedBroadcastProcessFunction,
    TieredKeyedCoProcessFunction,
    TieredKeyedProcessFunction,
    TieredWindowFunction,
)
from pyflink_ndb.api.restore_check import check_stream_graph
from pyflink_ndb.api.stream import bridge_class, output_type_info, prepare_bridge
from pyflink_ndb.config import PREFIX, misspelled_switch, option_value
from pyflink_ndb.errors import ConfigurationError

#: The key of the switch.
ENABLED_KEY = PREFIX + "enabled"


def enabled(stream: Any) -> bool:
    """Whether the switch is on in the configuration of `stream`'s environment (unset:
    off; values as every boolean option: true/false, 1/0, yes/no).

    :raises ConfigurationError: a value that is not a boolean, or the switch unset and a
        misspelling of it set (`state.backend.ndb.enable`): the job would otherwise run on
        Flink's own state without a word.
    """
    j_conf = _pyflink.j_env_configuration(stream)
    raw = j_conf.getString(ENABLED_KEY, None)
    if raw is None:
        typo = misspelled_switch(j_conf.keySet())
        if typo is not None:
            raise ConfigurationError(
                f"Unknown option {typo}. Did you mean {ENABLED_KEY}? (Without it the job "
                "runs on Flink's own state.)")
        _warn_if_only_in_conf_dir()
        return False
    return bool(option_value("enabled", raw))


_conf_dir_checked = False


def _warn_if_only_in_conf_dir() -> None:
    """Once per process: warn when `$FLINK_CONF_DIR`'s `flink-conf.yaml` (or `config.yaml`)
    turns the switch on but the job's configuration does not have it. Flink applies that
    file to jobs submitted to a cluster (`flink run`), whose configuration then holds the
    key; a job run locally (`python job.py`, a MiniCluster) takes only the `Configuration`
    it was given, and ran on Flink's own state without a word (a new user's trial)."""
    global _conf_dir_checked
    if _conf_dir_checked:
        return
    _conf_dir_checked = True
    folder = os.environ.get("FLINK_CONF_DIR")
    if not folder:
        return
    for name in ("config.yaml", "flink-conf.yaml"):
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        found = re.search(r"^\s*" + re.escape(ENABLED_KEY) + r"\s*:\s*['\"]?(\w+)", text,
                          re.MULTILINE)
        if found is None:
            continue
        try:
            on = option_value("enabled", found.group(1))
        except ConfigurationError:
            on = False
        if on:
            warnings.warn(
                f"{path} sets {ENABLED_KEY}: true, but this job's configuration does not: "
                "a job run locally (python job.py, a MiniCluster) does not apply that file, "
                "and runs on Flink's own state. Set it in the job's Configuration "
                f"(config.set_string('{ENABLED_KEY}', 'true')), or submit the job with "
                "`flink run` to a cluster that uses that file.", stacklevel=2)
        return


def _one_input(original: Any, data_stream: Any, func: Any, func_type: int,
               output_type: Any = None) -> Any:
    types = _pyflink.function_types()
    if func_type not in (types.KEYED_PROCESS, types.WINDOW) or not enabled(data_stream):
        return original(data_stream, func, func_type, output_type)
    if func_type == types.KEYED_PROCESS and not _pyflink.declares_keyed_state(func):
        return original(data_stream, func, func_type, output_type)
    j_conf, options_json = prepare_bridge(data_stream, None, None, check_store=False)
    j_input = _pyflink.input_type_of(data_stream)
    # Pickle the function before asking for the Java output type, as PyFlink does: the
    # function may hold the same TypeInformation, which then caches an unpicklable Java
    # object.
    if func_type == types.KEYED_PROCESS:
        j_info = _pyflink.python_function_info(TieredKeyedProcessFunction(func), func_type)
        j_output = output_type_info(output_type).get_java_type_info()
        j_operator = bridge_class("NdbKeyedProcessOperator")(
            j_conf, j_info, j_input, j_output, options_json)
    else:
        descriptor = TieredWindowFunction.wrap_descriptor(func)
        j_info = _pyflink.python_function_info(descriptor, func_type)
        j_output = output_type_info(output_type).get_java_type_info()
        j_operator = bridge_class("NdbWindowOperator")(
            j_conf, j_info, j_input, j_output,
            _pyflink.window_namespace_serializer(descriptor.window_serializer), options_json)
    return j_operator, j_output


def _two_input(original: Any, connected: Any, func: Any, func_type: int,
               type_info: Any = None) -> Any:
    types = _pyflink.function_types()
    if (func_type != types.KEYED_CO_PROCESS or not enabled(connected.stream1)
            or not _pyflink.declares_keyed_state(func)):
        return original(connected, func, func_type, type_info)
    j_conf, options_json = prepare_bridge(connected.stream1, None, None, check_store=False)
    j_info = _pyflink.python_function_info(TieredKeyedCoProcessFunction(func), func_type)
    j_output = output_type_info(type_info).get_java_type_info()  # after pickling (above)
    j_operator = bridge_class("NdbKeyedCoProcessOperator")(
        j_conf, j_info, _pyflink.input_type_of(connected.stream1),
        _pyflink.input_type_of(connected.stream2), j_output, options_json)
    return j_operator, j_output


def _keyed_broadcast(original: Any, connected: Any, func: Any, output_type: Any = None
                     ) -> Any:
    from pyflink.datastream import DataStream, KeyedBroadcastProcessFunction, KeyedStream

    keyed, j_broadcast = _pyflink.broadcast_parts(connected)
    if (not isinstance(keyed, KeyedStream) or not isinstance(func, KeyedBroadcastProcessFunction)
            or not enabled(keyed) or not _pyflink.declares_keyed_state(func)):
        return original(connected, func, output_type)
    j_conf, options_json = prepare_bridge(keyed, None, None, check_store=False)
    types = _pyflink.function_types()
    j_info = _pyflink.python_function_info(TieredKeyedBroadcastProcessFunction(func),
                                           types.KEYED_CO_BROADCAST_PROCESS)
    j_output = output_type_info(output_type).get_java_type_info()  # after pickling (above)
    j_operator = bridge_class("NdbKeyedCoProcessOperator")(
        j_conf, j_info, _pyflink.input_type_of(keyed),
        j_broadcast.getTransformation().getOutputType(), j_output, options_json)
    # PyFlink's name for the operator (BroadcastConnectedStream.process).
    return DataStream(_pyflink.j_data_stream(keyed).connect(j_broadcast).transform(
        "Keyed-Co-Process-Broadcast", j_output, j_operator))


def install() -> None:
    """Install the switch into PyFlink (idempotent; `import pyflink_ndb` does it). With the
    key off, PyFlink builds every operator as before. Also installs the check of a restored
    snapshot at job submission (:mod:`pyflink_ndb.api.restore_check`), on or off."""
    _pyflink.install_operator_factories(_one_input, _two_input, _keyed_broadcast)
    _pyflink.install_stream_graph_check(check_stream_graph)
