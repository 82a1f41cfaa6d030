package io.pyflinkndb.bridge;

import org.apache.flink.api.common.TaskInfo;
import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.StateRecoveryOptions;
import org.apache.flink.runtime.checkpoint.CheckpointOptions;
import org.apache.flink.runtime.checkpoint.SavepointType;
import org.apache.flink.runtime.execution.SuppressRestartsException;
import org.apache.flink.runtime.state.CheckpointableKeyedStateBackend;
import org.apache.flink.runtime.state.DoneFuture;
import org.apache.flink.runtime.state.FullSnapshotResources;
import org.apache.flink.runtime.state.KeyGroupRange;
import org.apache.flink.runtime.state.KeyGroupRangeAssignment;
import org.apache.flink.runtime.state.KeyedStateBackend;
import org.apache.flink.runtime.state.StateInitializationContext;
import org.apache.flink.runtime.state.OperatorStateHandle;
import org.apache.flink.runtime.state.SnapshotResult;
import org.apache.flink.runtime.state.StateSnapshotContext;
import org.apache.flink.runtime.state.metainfo.StateMetaInfoSnapshot;
import org.apache.flink.runtime.taskmanager.TaskManagerRuntimeInfo;
import org.apache.flink.streaming.api.operators.OperatorSnapshotFutures;
import org.apache.flink.streaming.api.operators.StreamingRuntimeContext;
import org.apache.flink.streaming.api.operators.python.AbstractPythonFunctionOperator;
import org.apache.flink.streaming.runtime.tasks.StreamTask;

import pemja.core.PythonInterpreter;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.OptionalLong;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.RunnableFuture;

/**
 * The life-cycle logic shared by {@link NdbKeyedProcessOperator} and {@link
 * NdbKeyedCoProcessOperator}: one instance per running operator (transient, built at runtime).
 *
 * <p>The Python side contract (module {@code pyflink_ndb.runtime.bridge}) is described in
 * {@code java-bridge/README.md}. In short, in the operator's own PEMJA interpreter:
 *
 * <pre>
 * from pyflink_ndb.runtime.bridge import bind as ndb_bind
 * ndb_bind_info  = "&lt;JSON&gt;"            # str
 * ndb_key_groups = &lt;KeyGroupProbe&gt;       # Java object, .currentKeyGroup() -> int
 * ndb_listener   = &lt;DurabilityListener&gt;  # Java object, .durable(id) / .failed(id, msg)
 * ndb_backend    = ndb_bind(ndb_bind_info, ndb_key_groups, ndb_listener)
 * ndb_backend.snapshot(checkpoint_id: int, is_savepoint: bool) -> str   # the token
 * ndb_backend.notify_checkpoint_complete(checkpoint_id: int)
 * ndb_backend.notify_checkpoint_aborted(checkpoint_id: int)
 * ndb_backend.finish()
 * ndb_backend.close()
 * </pre>
 */
final class StateBackendHooks {

    private static final Logger LOG = LoggerFactory.getLogger(StateBackendHooks.class);

    /** Prefix of the cluster / job configuration keys handed to Python. */
    static final String OPTION_PREFIX = "state.backend.ndb.";

    /**
     * Union list state of the snapshot tokens (one JSON text per subtask: branch, epoch, key
     * groups): a restore hands every subtask all tokens of the restored snapshot, which names
     * exactly what it restores (docs/protocol.md).
     */
    static final String TOKENS_STATE = "pyflink-ndb-snapshot-tokens";

    /** Union list state of row format 1 (the epoch offset), read only to restore its checkpoints. */
    static final String LEGACY_EPOCH_OFFSET_STATE = "pyflink-ndb-epoch-offset";

    /** Flink's keys of the number of retained checkpoints, handed to Python with the others. */
    static final List<String> FLINK_KEYS =
            Arrays.asList("execution.checkpointing.num-retained", "state.checkpoints.num-retained");

    /** Python global names. */
    static final String PY_BIND_INFO = "ndb_bind_info";

    static final String PY_KEY_GROUPS = "ndb_key_groups";
    static final String PY_LISTENER = "ndb_listener";
    static final String PY_BACKEND = "ndb_backend";

    private final AbstractPythonFunctionOperator<?> operator;
    private final String stateOptionsJson;

    /** Restored checkpoint id, or null on a fresh start. */
    private Long restoredCheckpointId;

    /** Max of the restored legacy (format 1) epoch offsets, or null. */
    private Long restoredEpochOffset;

    /** The restored snapshot's tokens (all subtasks'), empty on a fresh start. */
    private List<String> restoredTokens = Collections.emptyList();

    /**
     * The keyed states of Flink's own state backend that the restored snapshot holds for this
     * operator ({@code {"name", "kind"}} each, timers left out); empty on a fresh start; null
     * when the backend could not tell.
     */
    private List<Map<String, String>> restoredFlinkKeyedStates = Collections.emptyList();

    private ListState<String> tokensState;

    private ListState<Long> legacyOffsetState;

    /** Non-null iff {@code ndb_backend} was bound in this interpreter and not closed yet. */
    private PythonInterpreter boundInterpreter;

    /** Set by the 4-arg snapshotState, read by snapshotState(ctx) of the same checkpoint. */
    private long lastSnapshotCheckpointId = Long.MIN_VALUE;

    private boolean lastSnapshotIsSavepoint;
    /** The last snapshot is a stop-with-savepoint's: the job finishes after it completes. */
    private boolean lastSnapshotEndsJob;

    /** Completes each checkpoint's asynchronous phase when Python says it is durable. */
    private final DurabilityListener listener = new DurabilityListener();

    /** The epoch future of the snapshot being taken (set in snapshotState(ctx)). */
    private CompletableFuture<Void> lastDurable;

    private long lastDurableCheckpointId = Long.MIN_VALUE;

    StateBackendHooks(AbstractPythonFunctionOperator<?> operator, String stateOptionsJson) {
        this.operator = operator;
        this.stateOptionsJson = stateOptionsJson == null ? "{}" : stateOptionsJson;
    }

    /** Call after {@code super.initializeState(ctx)}. */
    void initializeState(StateInitializationContext ctx) throws Exception {
        OptionalLong restored = ctx.getRestoredCheckpointId();
        restoredCheckpointId = restored.isPresent() ? restored.getAsLong() : null;

        tokensState =
                ctx.getOperatorStateStore()
                        .getUnionListState(new ListStateDescriptor<>(TOKENS_STATE, String.class));
        legacyOffsetState =
                ctx.getOperatorStateStore()
                        .getUnionListState(
                                new ListStateDescriptor<>(LEGACY_EPOCH_OFFSET_STATE, Long.class));
        restoredEpochOffset = null;
        restoredTokens = new ArrayList<>();
        if (ctx.isRestored()) {
            Iterable<String> tokens = tokensState.get();
            if (tokens != null) {
                for (String t : tokens) {
                    if (t != null) {
                        restoredTokens.add(t);
                    }
                }
            }
            Iterable<Long> values = legacyOffsetState.get();
            if (values != null) {
                for (Long v : values) {
                    if (v != null && (restoredEpochOffset == null || v > restoredEpochOffset)) {
                        restoredEpochOffset = v;
                    }
                }
            }
            restoredFlinkKeyedStates = flinkKeyedStates(operator.getKeyedStateBackend());
        } else {
            restoredFlinkKeyedStates = Collections.emptyList();
        }
    }

    /**
     * The keyed value states (value, list, map, reducing, aggregating: Flink's {@code
     * BackendStateType.KEY_VALUE}) that {@code backend} holds right after its restore, before
     * the operator registers any: a switched operator keeps none there (its keyed state is
     * pyflink-ndb's; only its timers, {@code PRIORITY_QUEUE}, are Flink's), so any it holds was
     * written by the same operator running on Flink's own state backend (a savepoint or
     * checkpoint taken with the switch off). Flink keeps restored state that no operator
     * registers without a word, so Python refuses the restore unless told to ignore it
     * ({@code state.backend.ndb.restore.backend-change}).
     *
     * <p>The names come from the state meta information that every keyed snapshot of
     * Flink's backends carries ({@code KeyedBackendSerializationProxy}), read through {@link
     * CheckpointableKeyedStateBackend#savepoint()}: the HashMap and the RocksDB backends (and
     * the changelog backend over them) register each restored state's meta information at
     * restore; the resources are released at once, nothing is read or written.
     *
     * @return {@code [{"name": .., "kind": ..}]}; null when the backend cannot tell (not a
     *     checkpointable backend, or it failed: logged).
     */
    static List<Map<String, String>> flinkKeyedStates(KeyedStateBackend<?> backend) {
        if (!(backend instanceof CheckpointableKeyedStateBackend)) {
            return backend == null ? Collections.<Map<String, String>>emptyList() : null;
        }
        List<Map<String, String>> found = new ArrayList<>();
        FullSnapshotResources<?> resources;
        try {
            resources =
                    ((CheckpointableKeyedStateBackend<?>) backend)
                            .savepoint()
                            .getSnapshotResources();
        } catch (Exception | LinkageError e) {
            LOG.warn(
                    "pyflink-ndb: cannot list the restored keyed states of Flink's backend {}",
                    backend.getClass().getName(),
                    e);
            return null;
        }
        try {
            for (StateMetaInfoSnapshot meta : resources.getMetaInfoSnapshots()) {
                if (meta.getBackendStateType()
                        != StateMetaInfoSnapshot.BackendStateType.KEY_VALUE) {
                    continue;
                }
                Map<String, String> state = new LinkedHashMap<>();
                state.put("name", meta.getName());
                String kind =
                        meta.getOption(
                                StateMetaInfoSnapshot.CommonOptionsKeys.KEYED_STATE_TYPE);
                state.put("kind", kind == null ? "UNKNOWN" : kind);
                found.add(state);
            }
        } finally {
            resources.release();
        }
        return found;
    }

    /**
     * Lets the backend read each record's key from the record itself, so that a record whose
     * state is cached needs no call into Java. Call AFTER {@code super.openPythonInterpreter()},
     * which creates {@code operation}.
     */
    void attachOperation(PythonInterpreter interpreter) {
        if (boundInterpreter != null) {
            interpreter.exec(PY_BACKEND + ".attach_operation(operation)");
        }
    }

    /**
     * Binds {@code ndb_backend} in the operator's interpreter. Call from {@code
     * openPythonInterpreter()} BEFORE {@code super.openPythonInterpreter()}, so that the user's
     * {@code open()} already finds the backend.
     */
    void bind(PythonInterpreter interpreter) {
        if (interpreter == null) {
            throw new IllegalStateException("pyflink-ndb: no Python interpreter to bind to");
        }
        KeyGroupProbe probe = new KeyGroupProbe(operator, maxParallelism());
        String info = bindInfoJson();
        interpreter.exec("from pyflink_ndb.runtime.bridge import bind as ndb_bind");
        interpreter.set(PY_BIND_INFO, info);
        interpreter.set(PY_KEY_GROUPS, probe);
        interpreter.set(PY_LISTENER, listener);
        try {
            interpreter.exec(
                    PY_BACKEND
                            + " = ndb_bind("
                            + PY_BIND_INFO
                            + ", "
                            + PY_KEY_GROUPS
                            + ", "
                            + PY_LISTENER
                            + ")");
        } catch (Exception e) {
            // PEMJA's PythonException is a checked exception thrown from native code
            // without a declaration: caught here as Exception, rethrown as it is (precise
            // rethrow) unless it is a refused change of backend.
            if (isBackendChangeRefusal(e)) {
                throw new SuppressRestartsException(e);
            }
            throw e;
        }
        boundInterpreter = interpreter;
        Object tierFolder = interpreter.invokeMethod(PY_BACKEND, "process_tier_folder");
        if (tierFolder instanceof String) {
            TierFolders.deleteAtExit((String) tierFolder);
        }
        TaskInfo ti = operator.getRuntimeContext().getTaskInfo();
        LOG.info(
                "pyflink-ndb: bound Python state backend for {} (operator {}), restored checkpoint {}, "
                        + "{} restored token(s), legacy epoch offset {}",
                ti.getTaskNameWithSubtasks(),
                operator.getOperatorID(),
                restoredCheckpointId,
                restoredTokens.size(),
                restoredEpochOffset);
    }

    /** The Python message of a refused change of backend (pyflink_ndb.runtime.backend). */
    static final String BACKEND_CHANGE_REFUSAL = "state.backend.ndb.restore.backend-change: ignore";

    /**
     * A refused change of backend ({@code check_flink_keyed_state}: the restored snapshot
     * holds this operator's keyed state in Flink's own backend) fails the job without
     * restarts: every attempt would restore the same snapshot and be refused again, and
     * Flink's default restart strategy (exponential delay, unlimited attempts) would restart
     * it for ever with the cause only in its exception history. Flink fails a restore it
     * cannot map the same way, at once ({@code execution.state-recovery.ignore-unclaimed-
     * state}). {@link SuppressRestartsException} is Flink's non-recoverable error ({@code
     * ExecutionFailureHandler} finds it in the cause chain), wrapped around it by {@link
     * #bind}; other errors keep Flink's restart strategy.
     */
    static boolean isBackendChangeRefusal(Throwable e) {
        String message = String.valueOf(e.getMessage());
        return message.contains("StateCompatibilityError")
                && message.contains(BACKEND_CHANGE_REFUSAL);
    }

    boolean isBound() {
        return boundInterpreter != null;
    }

    /** Called from the 4-arg {@code snapshotState}: remembers whether this one is a savepoint. */
    void beforeSnapshot(long checkpointId, CheckpointOptions options) {
        lastSnapshotCheckpointId = checkpointId;
        lastSnapshotIsSavepoint =
                options != null
                        && options.getCheckpointType() != null
                        && options.getCheckpointType().isSavepoint();
        // A synchronous savepoint is a stop-with-savepoint's (SavepointType.suspend or
        // terminate): once it completes, the tasks finish and the job reaches FINISHED, and
        // Flink deletes the job's retained checkpoints (CheckpointProperties).
        lastSnapshotEndsJob =
                lastSnapshotIsSavepoint
                        && options.getCheckpointType() instanceof SavepointType
                        && ((SavepointType) options.getCheckpointType()).isSynchronous();
    }

    /**
     * Call after {@code super.snapshotState(ctx)}: the synchronous phase. Python freezes the
     * dirty set and returns the token; its background writer reports the epoch to {@link
     * #listener}, whose future {@link #wrapSnapshot} puts in front of Flink's asynchronous
     * phase. Any exception propagates and fails the checkpoint (and the task).
     */
    void snapshotState(StateSnapshotContext ctx) throws Exception {
        long checkpointId = ctx.getCheckpointId();
        boolean isSavepoint = checkpointId == lastSnapshotCheckpointId && lastSnapshotIsSavepoint;
        boolean endsJob = checkpointId == lastSnapshotCheckpointId && lastSnapshotEndsJob;
        lastDurable = null;
        if (boundInterpreter == null) {
            // Never bound (should not happen for a running task): keep what we restored.
            tokensState.update(restoredTokens);
            return;
        }
        CompletableFuture<Void> durable = listener.register(checkpointId);
        Object token;
        try {
            token =
                    boundInterpreter.invokeMethod(
                            PY_BACKEND, "snapshot", checkpointId, isSavepoint, endsJob);
        } catch (RuntimeException e) {
            listener.forget(checkpointId);
            throw e;
        }
        lastDurable = durable;
        lastDurableCheckpointId = checkpointId;
        if (!(token instanceof String)) {
            throw new IllegalStateException(
                    "pyflink-ndb: ndb_backend.snapshot() must return the token (str), got "
                            + (token == null ? "None" : token.getClass().getName()));
        }
        tokensState.update(Collections.singletonList((String) token));
        legacyOffsetState.update(Collections.<Long>emptyList());
    }

    /**
     * Call on the {@link OperatorSnapshotFutures} that {@code super.snapshotState(id, ...)}
     * returned: Flink's asynchronous phase of this checkpoint first waits for the epoch.
     */
    OperatorSnapshotFutures wrapSnapshot(long checkpointId, OperatorSnapshotFutures futures) {
        CompletableFuture<Void> durable = lastDurable;
        lastDurable = null;
        if (futures == null || durable == null || lastDurableCheckpointId != checkpointId) {
            return futures;
        }
        RunnableFuture<SnapshotResult<OperatorStateHandle>> inner =
                futures.getOperatorStateManagedFuture();
        if (inner == null) {
            inner = DoneFuture.of(SnapshotResult.empty());
        }
        futures.setOperatorStateManagedFuture(new DurableSnapshotFuture<>(inner, durable));
        return futures;
    }

    void notifyCheckpointComplete(long checkpointId) {
        if (boundInterpreter != null) {
            boundInterpreter.invokeMethod(PY_BACKEND, "notify_checkpoint_complete", checkpointId);
        }
    }

    void notifyCheckpointAborted(long checkpointId) {
        if (boundInterpreter != null) {
            boundInterpreter.invokeMethod(PY_BACKEND, "notify_checkpoint_aborted", checkpointId);
        }
    }

    /**
     * The read-ahead and bundle settings Python resolved ({@code read-ahead.records}, {@code
     * read-ahead.max-wait-ms}, {@code bundle.records}, {@code bundle.max-wait-ms}), or null when
     * records are not to be buffered; {@code bundlesPossible} false (an operator with side
     * outputs) ignores the bundle settings. Call after {@link #attachOperation}.
     */
    <T> ReadAhead<T> readAhead(boolean bundlesPossible) {
        if (boundInterpreter == null) {
            return null;
        }
        Object settings = boundInterpreter.invokeMethod(PY_BACKEND, "read_ahead_settings");
        long records = element(settings, 0);
        long waitMs = element(settings, 1);
        long bundleRecords = element(settings, 2);
        long bundleWaitMs = element(settings, 3);
        if (bundleRecords > 0 && bundlesPossible) {
            return new ReadAhead<>(
                    (int) bundleRecords, Math.max(1, bundleWaitMs), true, records > 0);
        }
        return records > 0 ? new ReadAhead<>((int) records, Math.max(1, waitMs)) : null;
    }

    /** Hands Python the cursor through which it makes a record of a bundle the current one. */
    void enableBundles(BundleCursor cursor) {
        if (boundInterpreter != null) {
            boundInterpreter.invokeMethod(PY_BACKEND, "enable_bundles", cursor);
        }
    }

    /**
     * Processes {@code values[start:]} in one call ({@code ndb_backend.process_bundle}): returns
     * Python's {@code (gain, outputs, rest)} as an {@code Object[]}.
     */
    Object[] processBundle(
            Object[] values, int[] keyGroups, long[] timestamps, int start, boolean readAhead) {
        return (Object[])
                boundInterpreter.invokeMethod(
                        PY_BACKEND,
                        "process_bundle",
                        values,
                        keyGroups,
                        timestamps,
                        start,
                        readAhead);
    }

    private static long element(Object list, int index) {
        Object item =
                list instanceof List
                        ? ((List<?>) list).get(index)
                        : ((Object[]) list)[index];
        return ((Number) item).longValue();
    }

    /**
     * Hands a bundle to Python before its records are processed: {@code values} as the operation
     * receives them, {@code keyGroups} their key groups. Returns the store reads the bundle saved
     * or needed (0: nothing to gain).
     */
    long readAhead(Object[] values, int[] keyGroups) {
        if (boundInterpreter == null) {
            return 0;
        }
        Object gain = boundInterpreter.invokeMethod(PY_BACKEND, "read_ahead", values, keyGroups);
        return gain instanceof Number ? ((Number) gain).longValue() : 0;
    }

    /** Call after {@code super.finish()}. */
    void finish() {
        if (boundInterpreter != null) {
            boundInterpreter.invokeMethod(PY_BACKEND, "finish");
        }
    }

    /** Call before {@code super.close()} (which closes the interpreter). Idempotent. */
    void close() {
        PythonInterpreter interpreter = boundInterpreter;
        boundInterpreter = null;
        try {
            if (interpreter != null) {
                // A normal end (bounded input, stop-with-savepoint) lets the writer finish
                // what is queued (the final checkpoint's completion moves what readers
                // see); a cancelled or failing task stops it at once.
                StreamTask<?, ?> task = operator.getContainingTask();
                boolean drain = !(task.isCanceled() || task.isFailing());
                interpreter.invokeMethod(PY_BACKEND, "close", drain);
            }
        } finally {
            listener.failAll("the subtask closed before the checkpoint was written");
        }
    }

    // ------------------------------------------------------------------------------------------

    private int maxParallelism() {
        return operator.getRuntimeContext().getTaskInfo().getMaxNumberOfParallelSubtasks();
    }

    /** Builds the JSON handed to {@code bind()}; see README for the field list. */
    String bindInfoJson() {
        StreamingRuntimeContext rc = operator.getRuntimeContext();
        TaskInfo ti = rc.getTaskInfo();
        int maxParallelism = ti.getMaxNumberOfParallelSubtasks();
        int parallelism = ti.getNumberOfParallelSubtasks();
        int subtask = ti.getIndexOfThisSubtask();
        KeyGroupRange range =
                KeyGroupRangeAssignment.computeKeyGroupRangeForOperatorIndex(
                        maxParallelism, parallelism, subtask);

        TaskManagerRuntimeInfo tm = operator.getContainingTask().getEnvironment().getTaskManagerInfo();
        String[] tmpDirs = tm.getTmpDirectories();

        Map<String, Object> m = new LinkedHashMap<>();
        m.put("options", stateOptionsJson);
        m.put("cluster_options", prefixed(tm.getConfiguration()));
        Map<String, String> jobOptions =
                prefixed(operator.getContainingTask().getEnvironment().getJobConfiguration());
        jobOptions.putAll(prefixed(operator.getConfiguration()));
        m.put("job_options", jobOptions);
        m.put("operator_id", operator.getOperatorID().toString());
        m.put("task_name", ti.getTaskName());
        m.put("subtask_index", subtask);
        m.put("parallelism", parallelism);
        m.put("max_parallelism", maxParallelism);
        m.put("attempt", ti.getAttemptNumber());
        m.put("key_group_start", range.getStartKeyGroup());
        m.put("key_group_end", range.getEndKeyGroup());
        m.put("restored_checkpoint_id", restoredCheckpointId);
        m.put("restored_tokens", restoredTokens);
        m.put("restored_epoch_offset", restoredEpochOffset);
        m.put("restored_flink_keyed_states", restoredFlinkKeyedStates);
        m.put("checkpointing_enabled", rc.isCheckpointingEnabled());
        m.put("local_dirs", asList(tmpDirs));
        m.put("job_id", rc.getJobInfo().getJobId().toString());
        Configuration recovery = jobOverCluster(tm.getConfiguration(),
                operator.getContainingTask().getEnvironment().getJobConfiguration());
        m.put("restore_claim_mode", recovery.get(StateRecoveryOptions.RESTORE_MODE).name());
        m.put("restore_path", recovery.get(StateRecoveryOptions.SAVEPOINT_PATH));
        m.put("externalized_retention",
                recovery.get(CheckpointingOptions.EXTERNALIZED_CHECKPOINT_RETENTION).name());
        return Json.toJson(m);
    }

    /**
     * The job's configuration over the TaskManager's, for the settings of a restore at job
     * submission: its claim mode ({@code execution.state-recovery.claim-mode}, formerly {@code
     * execution.savepoint-restore-mode}; Flink's default NO_CLAIM) and the snapshot's path
     * ({@code execution.state-recovery.path}, formerly {@code execution.savepoint.path}).
     * Python records both with a restore (docs/protocol.md, "Garbage collection": a snapshot
     * restored in CLAIM mode is the new job's, one restored otherwise at submission stays until
     * released), and whether the job keeps its checkpoints when it ends ({@code
     * execution.checkpointing.externalized-checkpoint-retention}: later jobs' retention leaves
     * them to the user).
     */
    static Configuration jobOverCluster(Configuration cluster, Configuration job) {
        Configuration merged = new Configuration();
        if (cluster != null) {
            merged.addAll(cluster);
        }
        if (job != null) {
            merged.addAll(job);
        }
        return merged;
    }

    private static Map<String, String> prefixed(Configuration conf) {
        Map<String, String> out = new TreeMap<>();
        if (conf == null) {
            return out;
        }
        for (Map.Entry<String, String> e : conf.toMap().entrySet()) {
            if (e.getKey() != null
                    && (e.getKey().startsWith(OPTION_PREFIX) || FLINK_KEYS.contains(e.getKey()))) {
                out.put(e.getKey(), e.getValue());
            }
        }
        return out;
    }

    private static List<String> asList(String[] a) {
        return a == null ? Collections.<String>emptyList() : Arrays.asList(a);
    }
}
