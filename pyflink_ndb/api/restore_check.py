"""At job submission: refuse a restore that would drop an operator's pyflink-ndb state.

A snapshot taken while an operator kept its keyed state in pyflink-ndb holds, for that
operator, only the bridge's snapshot tokens (operator state, `pyflink-ndb-snapshot-tokens`)
and its timers. Restored into a job where the same operator (the same operator ID, i.e. the
same `uid`) is a plain PyFlink operator — the job-wide switch turned off, or the function
no longer switched — Flink restores the tokens into an operator that never reads them and
starts its keyed state empty, without an error: Flink refuses only state of operators the
job lacks (`execution.state-recovery.ignore-unclaimed-state`, Flink docs "Savepoints"),
not state an operator does not register.

The other direction (keyed state of Flink's backend restored into a switched operator) is
refused in the task, where the restored keyed backend lists its states
(:func:`pyflink_ndb.runtime.backend.check_flink_keyed_state`). Both follow
`state.backend.ndb.restore.backend-change` (`fail` by default, or `ignore`).

This check runs in the client, on the stream graph PyFlink builds for `execute`,
`execute_async` and `get_execution_plan` (:func:`pyflink_ndb._pyflink.install_stream_graph_check`),
so it needs `import pyflink_ndb` in the job; a job without the package cannot be checked.
It reads the snapshot's metadata file (`Checkpoints.loadCheckpointMetadata`: operator IDs
and the names of their operator states, no state data) and the job graph's operator IDs
and classes (`StreamingJobGraphGenerator`, as Flink maps state at restore: a user-defined
operator ID, `setUidHash`, before the generated one).
"""

from __future__ import annotations

import logging
from typing import Any

from pyflink_ndb.config import PREFIX, from_flink_keys
from pyflink_ndb.errors import StateCompatibilityError

log = logging.getLogger(__name__)

#: The operator states by which the bridge's snapshots are known (java-bridge
#: StateBackendHooks: the tokens of row format 2, the epoch offset of format 1).
PYFLINK_NDB_OPERATOR_STATES = ("pyflink-ndb-snapshot-tokens", "pyflink-ndb-epoch-offset")

#: The Java package of the bridge's operators.
BRIDGE_PACKAGE = "io.pyflinkndb.bridge."

BACKEND_CHANGE_KEY = PREFIX + "restore.backend-change"


def check_stream_graph(j_stream_graph: Any, j_configuration: Any) -> None:
    """Refuse the job when the snapshot it restores holds pyflink-ndb state for an
    operator that the job runs as a plain PyFlink operator.

    :param j_stream_graph: the Java `StreamGraph` PyFlink built (its
        `SavepointRestoreSettings` name the snapshot: `execution.state-recovery.path`,
        formerly `execution.savepoint.path`, or `flink run -s`).
    :param j_configuration: the environment's Java configuration (for
        `state.backend.ndb.restore.backend-change`).
    :raises StateCompatibilityError: such an operator, and the option is `fail` (the
        default); the message names the operators and both ways on.
    :raises ConfigurationError: the option has a value other than `fail` or `ignore`.

    A snapshot the client cannot read (a file system only the cluster has) is logged and
    not checked: Flink itself reads it at the JobManager.
    """
    settings = j_stream_graph.getSavepointRestoreSettings()
    if settings is None or not settings.restoreSavepoint():
        return
    raw = j_configuration.getString(BACKEND_CHANGE_KEY, None)
    policy = from_flink_keys({} if raw is None else {BACKEND_CHANGE_KEY: raw}
                             ).restore_backend_change
    path = str(settings.getRestorePath())
    try:
        held = operators_with_ndb_state(path)
        plain = {op_id: (name, cls) for op_id, name, cls in job_operators(j_stream_graph)
                 if op_id in held and not cls.startswith(BRIDGE_PACKAGE)}
    except Exception as e:  # Py4J or Flink errors: the cluster may read what we cannot
        log.warning("pyflink-ndb: could not check restored snapshot %s for pyflink-ndb "
                    "state of operators now on Flink's state backend: %s", path, e)
        return
    if not plain:
        return
    named = ", ".join(f"{name} (operator ID {op_id})" for op_id, (name, _) in
                      sorted(plain.items(), key=lambda item: item[1][0]))
    if policy == "ignore":
        log.warning("pyflink-ndb: snapshot %s holds pyflink-ndb state of %s, which this job "
                    "runs on Flink's own state backend: ignored, as %s says. Their keyed "
                    "state starts empty, unless the snapshot also carries an older copy of "
                    "it in Flink's backend (left by a restore that ignored it when the "
                    "switch was turned on), which Flink restores", path, named,
                    BACKEND_CHANGE_KEY)
        return
    raise StateCompatibilityError(
        f"The snapshot this job restores ({path}) holds keyed state in pyflink-ndb for "
        f"{named}, which this job runs on Flink's own state backend (the job-wide switch "
        f"{PREFIX}enabled is off, or the function is no longer switched): Flink would start "
        "their keyed state empty without an error. To keep it, restore with the switch on "
        f"({PREFIX}enabled: true and the same {PREFIX}url and namespace). To start those "
        f"operators' state empty on purpose, set {BACKEND_CHANGE_KEY}: ignore "
        "(README, \"Limits\").")


def operators_with_ndb_state(path: str) -> set[str]:
    """The operator IDs (32 hex digits) for which the snapshot at `path` (a savepoint or
    retained checkpoint folder, or its `_metadata` file) holds the bridge's operator state.

    :raises Exception: the metadata cannot be read (Py4J's error, Flink's message)."""
    from pyflink.java_gateway import get_gateway

    jvm = get_gateway().jvm
    location = jvm.org.apache.flink.runtime.state.filesystem.\
        AbstractFsCheckpointStorageAccess.resolveCheckpointPointer(path)
    stream = jvm.java.io.DataInputStream(location.getMetadataHandle().openInputStream())
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        metadata = jvm.org.apache.flink.runtime.checkpoint.Checkpoints.loadCheckpointMetadata(
            stream, loader, path)
    finally:
        stream.close()
    held = set()
    for operator in metadata.getOperatorStates():
        names: set[str] = set()
        for subtask in operator.getSubtaskStates().values():
            for handle in subtask.getManagedOperatorState().toArray():
                names.update(str(n) for n in handle.getStateNameToPartitionOffsets().keySet())
        if names.intersection(PYFLINK_NDB_OPERATOR_STATES):
            held.add(str(operator.getOperatorID().toHexString()))
    return held


def job_operators(j_stream_graph: Any) -> list[tuple[str, str, str]]:
    """(operator ID that restores state, `uid U` or its name, Java class) of every operator of
    the job graph Flink builds from `j_stream_graph`, chained ones included. The class is
    the operator's (`SimpleOperatorFactory.getOperator()`), else the factory's."""
    from pyflink.java_gateway import get_gateway

    jvm = get_gateway().jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    found = []
    for vertex in j_stream_graph.getJobGraph().getVerticesAsArray():
        user_ids = {}
        for pair in vertex.getOperatorIDs():
            user = pair.getUserDefinedOperatorID()
            if user.isPresent():
                user_ids[str(pair.getGeneratedOperatorID().toHexString())] = \
                    str(user.get().toHexString())
        config = jvm.org.apache.flink.streaming.api.graph.StreamConfig(vertex.getConfiguration())
        for chained in config.getTransitiveChainedTaskConfigsWithSelf(loader).values():
            generated = str(chained.getOperatorID().toHexString())
            factory = chained.getStreamOperatorFactory(loader)
            try:
                cls = str(factory.getOperator().getClass().getName())
            except Exception:  # a factory without one operator (sources, sinks)
                cls = str(factory.getClass().getName())
            node = j_stream_graph.getStreamNode(chained.getVertexID())
            uid = node.getTransformationUID() if node is not None else None
            name = f"uid {uid}" if uid else f"{chained.getOperatorName()} (no uid)"
            found.append((user_ids.get(generated, generated), str(name), cls))
    return found
