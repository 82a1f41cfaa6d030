package io.pyflinkndb.bridge;

import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.runtime.checkpoint.CheckpointOptions;
import org.apache.flink.runtime.state.CheckpointStreamFactory;
import org.apache.flink.runtime.state.StateInitializationContext;
import org.apache.flink.runtime.state.StateSnapshotContext;
import org.apache.flink.streaming.api.functions.python.DataStreamPythonFunctionInfo;
import org.apache.flink.streaming.api.operators.OperatorSnapshotFutures;
import org.apache.flink.streaming.api.operators.python.embedded.AbstractEmbeddedDataStreamPythonFunctionOperator;
import org.apache.flink.streaming.api.operators.python.embedded.EmbeddedPythonKeyedProcessOperator;
import org.apache.flink.api.common.typeutils.TypeSerializer;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.runtime.state.KeyGroupRangeAssignment;
import org.apache.flink.runtime.state.VoidNamespace;
import org.apache.flink.streaming.api.operators.InternalTimer;
import org.apache.flink.streaming.api.utils.PythonTypeUtils;
import org.apache.flink.streaming.api.watermark.Watermark;
import org.apache.flink.streaming.runtime.streamrecord.RecordAttributes;
import org.apache.flink.streaming.runtime.streamrecord.StreamRecord;
import org.apache.flink.streaming.runtime.watermarkstatus.WatermarkStatus;

import pemja.core.object.PyIterator;

import java.util.List;

/**
 * PyFlink's thread-mode keyed process operator, with the operator life cycle forwarded to the
 * pyflink-ndb Python state backend (see {@link StateBackendHooks} and java-bridge/README.md).
 *
 * <p>It holds records back in bundles ({@link ReadAhead}): with {@code bundle.records} (on by
 * default) every record, and each bundle is processed in one call into the interpreter ({@link
 * #processInOneCall}); else only while its reads miss (after a restore). While reads miss, Python
 * reads the bundle's keys' entries in one query before processing them in arrival order.
 * A bundle is processed before anything that must follow its records: a watermark (and so every
 * event-time timer), a processing-time timer, a checkpoint barrier ({@link
 * #prepareSnapshotPreBarrier}, aligned or not), the end of input and {@link #finish()}; else when
 * it is full or its first record has waited {@code read-ahead.max-wait-ms}. In BATCH execution
 * mode records are never held back.
 */
public class NdbKeyedProcessOperator<K, IN, OUT>
        extends EmbeddedPythonKeyedProcessOperator<K, IN, OUT> {

    private static final long serialVersionUID = 1L;

    /** Kept here because the base class's getter is package-private; needed by copy(). */
    private final TypeInformation<IN> ndbInputTypeInfo;

    private final TypeInformation<OUT> ndbOutputTypeInfo;

    private final String stateOptionsJson;

    private transient RecordCall<IN, OUT> recordCall;

    private transient StateBackendHooks hooks;

    /** The bundle being collected; null when reading ahead is off. */
    private transient ReadAhead<IN> readAhead;

    private transient PythonTypeUtils.DataConverter<IN, Object> readAheadConverter;

    /** The records of the bundle being processed in one call; null between bundles. */
    private transient List<StreamRecord<IN>> bundleRecords;

    /** The processing-time timer whose firing runs the held-back bundle first; else null. */
    private transient InternalTimer<K, VoidNamespace> firingTimer;

    /** Whether a record of that bundle deleted {@link #firingTimer} (it then does not fire). */
    private transient boolean firingTimerDeleted;

    /** Copies a held-back value when Flink may reuse the object; null without object reuse. */
    private transient TypeSerializer<IN> reusedValueCopier;

    public NdbKeyedProcessOperator(
            Configuration config,
            DataStreamPythonFunctionInfo pythonFunctionInfo,
            TypeInformation<IN> inputTypeInfo,
            TypeInformation<OUT> outputTypeInfo,
            String stateOptionsJson) {
        super(config, pythonFunctionInfo, inputTypeInfo, outputTypeInfo);
        this.ndbInputTypeInfo = inputTypeInfo;
        this.ndbOutputTypeInfo = outputTypeInfo;
        this.stateOptionsJson = stateOptionsJson == null ? "{}" : stateOptionsJson;
    }

    public String getStateOptionsJson() {
        return stateOptionsJson;
    }

    private StateBackendHooks hooks() {
        if (hooks == null) {
            hooks = new StateBackendHooks(this, stateOptionsJson);
        }
        return hooks;
    }

    @Override
    public void initializeState(StateInitializationContext context) throws Exception {
        super.initializeState(context);
        hooks().initializeState(context);
    }

    @Override
    public void openPythonInterpreter() {
        hooks().bind(interpreter);
        super.openPythonInterpreter();
        hooks().attachOperation(interpreter);
    }

    @Override
    public void open() throws Exception {
        super.open();
        recordCall = new RecordCall<>("process_element", ndbInputTypeInfo, ndbOutputTypeInfo);
        readAhead = null;
        String backendClass = getKeyedStateBackend().getClass().getName();
        if (!backendClass.contains("BatchExecution")) {
            readAhead = hooks().readAhead(!hasSideOutput);
        }
        if (readAhead != null && readAhead.processesBundles) {
            hooks().enableBundles(
                    new BundleCursor(this::selectBundleRecord, this::bundleTouchesProcessingTimer));
        }
        if (readAhead != null) {
            readAheadConverter =
                    PythonTypeUtils.TypeInfoToDataConverter.typeInfoDataConverter(ndbInputTypeInfo);
            reusedValueCopier =
                    getExecutionConfig().isObjectReuseEnabled()
                            ? ndbInputTypeInfo.createSerializer(
                                    getExecutionConfig().getSerializerConfig())
                            : null;
        }
    }

    @Override
    public void processElement(StreamRecord<IN> element) throws Exception {
        ReadAhead<IN> bundle = readAhead;
        if (bundle == null || !bundle.admit()) {
            processRecord(element);
            return;
        }
        IN value = element.getValue();
        if (reusedValueCopier != null) {
            value = reusedValueCopier.copy(value);
        }
        boolean first = bundle.add(element.copy(value));
        if (bundle.isFull()) {
            processBundle();
        } else if (first) {
            long generation = bundle.generation();
            long now = getProcessingTimeService().getCurrentProcessingTime();
            getProcessingTimeService()
                    .registerTimer(
                            now + bundle.maxWaitMs,
                            timestamp -> {
                                if (bundle.generation() == generation) {
                                    processBundleAfterWait();
                                }
                            });
        }
    }

    /**
     * The bundle whose first record waited {@code read-ahead.max-wait-ms}: Flink reports an error
     * of this callback as a timer's ("Caught exception while processing timer"), so the message
     * says that it came from records.
     */
    private void processBundleAfterWait() throws Exception {
        try {
            processBundle();
        } catch (Exception e) {
            throw new Exception(
                    "pyflink-ndb: processing a bundle of held-back records failed (the "
                            + "bundle ran when its first record had waited "
                            + (readAhead != null && readAhead.processesBundles
                                    ? "state.backend.ndb.bundle.max-wait-ms): "
                                    : "state.backend.ndb.read-ahead.max-wait-ms): ")
                            + e.getMessage(),
                    e);
        }
    }

    /**
     * Python reads the bundle's keys ahead (while that pays), then its records are processed in
     * arrival order: in one call into the interpreter ({@code bundle.records}, {@link
     * #processInOneCall}), else one call each.
     */
    private void processBundle() throws Exception {
        ReadAhead<IN> bundle = readAhead;
        if (bundle == null || bundle.isEmpty()) {
            return;
        }
        List<StreamRecord<IN>> records = bundle.take();
        @SuppressWarnings("unchecked")
        KeySelector<IN, ?> keySelector = (KeySelector<IN, ?>) getStateKeySelector1();
        int maxParallelism = getRuntimeContext().getTaskInfo().getMaxNumberOfParallelSubtasks();
        Object[] values = new Object[records.size()];
        int[] keyGroups = new int[records.size()];
        for (int i = 0; i < values.length; i++) {
            IN value = records.get(i).getValue();
            // PyFlink's row and tuple converters return the same arrays for every record.
            values[i] = ReadAhead.copyArrays(readAheadConverter.toExternal(value));
            keyGroups[i] =
                    KeyGroupRangeAssignment.assignToKeyGroup(
                            keySelector.getKey(value), maxParallelism);
        }
        if (bundle.processesBundles) {
            processInOneCall(bundle, records, values, keyGroups);
            return;
        }
        bundle.observe(hooks().readAhead(values, keyGroups));
        for (StreamRecord<IN> record : records) {
            setKeyContextElement1(record);
            processRecord(record);
        }
    }

    /**
     * The bundle's records in one call into the interpreter ({@code ndb_backend.process_bundle}),
     * their outputs emitted afterwards in the same order, each with its record's timestamp. A
     * record with more than {@code OUTPUTS_PER_CALL} outputs ends the call: its further outputs
     * are iterated as PyFlink does (with the record current), and the next call goes on from the
     * next record. Python asks for a record to be made current ({@link #selectBundleRecord})
     * before it registers or deletes a timer.
     */
    private void processInOneCall(
            ReadAhead<IN> bundle, List<StreamRecord<IN>> records, Object[] values, int[] keyGroups)
            throws Exception {
        int size = records.size();
        long[] timestamps = new long[size];
        for (int i = 0; i < size; i++) {
            timestamps[i] = records.get(i).getTimestamp();
        }
        boolean readAheadFirst = bundle.readAheadFor(size);
        bundleRecords = records;
        try {
            int start = 0;
            while (start < size) {
                boolean reading = readAheadFirst && start == 0;
                Object[] result =
                        hooks().processBundle(values, keyGroups, timestamps, start, reading);
                if (reading) {
                    bundle.observe(((Number) result[0]).longValue());
                }
                List<?> outputs = (List<?>) result[1];
                PyIterator rest = (PyIterator) result[2];
                int done = rest == null ? size - start : outputs.size();
                if (outputs != null) {
                    for (int j = 0; j < outputs.size(); j++) {
                        Object recordOutputs = outputs.get(j);
                        if (recordOutputs != null) {
                            collector.setTimestamp(records.get(start + j));
                            recordCall.emit((List<?>) recordOutputs, collector);
                        }
                    }
                }
                if (rest != null) {
                    int last = start + done - 1;
                    selectBundleRecord(last);
                    collector.setTimestamp(records.get(last));
                    recordCall.emitRest(rest, collector);
                }
                start += done;
            }
        } finally {
            bundleRecords = null;
        }
        // As after one call per record: the operator's timestamp is the last record's (what
        // PyFlink's context of an operation chained after this one reads later, at a timer).
        timestamp = records.get(size - 1).getTimestamp();
    }

    /**
     * Makes record {@code index} of the bundle being processed the current record: Flink's key
     * context (for the timer service) and the timestamp PyFlink's context reads.
     */
    private void selectBundleRecord(int index) {
        StreamRecord<IN> record = bundleRecords.get(index);
        try {
            setKeyContextElement1(record);
        } catch (Exception e) {
            throw new RuntimeException("pyflink-ndb: setting the key of a bundled record", e);
        }
        timestamp = record.getTimestamp();
    }

    /** What PyFlink's {@code processElement} does, in one call into the interpreter ({@link
     * RecordCall}). */
    private void processRecord(StreamRecord<IN> element) throws Exception {
        if (hasSideOutput) {
            super.processElement(element);
            return;
        }
        timestamp = element.getTimestamp();
        recordCall.process(interpreter, element, collector);
    }

    @Override
    public void processWatermark(Watermark mark) throws Exception {
        processBundle();
        super.processWatermark(mark);
    }

    @Override
    public void onEventTime(InternalTimer<K, VoidNamespace> timer) throws Exception {
        processBundleBefore(timer);
        super.onEventTime(timer);
    }

    /**
     * Flink's timer service takes a firing processing-time timer out of its queue before it calls
     * this, so a held-back record that deletes it (or registers it again) while the bundle runs
     * here would not reach it: such a record arrived before the timer fired and, one record per
     * call, would have deleted it in time. The bridge's timer service reports those calls ({@link
     * #bundleTouchesProcessingTimer}): a deleted firing timer is skipped, and registering it again
     * keeps it firing once.
     */
    @Override
    public void onProcessingTime(InternalTimer<K, VoidNamespace> timer) throws Exception {
        firingTimer = timer;
        firingTimerDeleted = false;
        try {
            processBundleBefore(timer);
        } finally {
            firingTimer = null;
        }
        if (!firingTimerDeleted) {
            super.onProcessingTime(timer);
        }
    }

    /**
     * Record {@code index} of the bundle deletes ({@code delete} true) or registers its key's
     * processing-time timer at {@code time}. Returns true when that is the timer firing now: a
     * delete cancels its firing, a registration restores it, and the caller then leaves Flink's
     * timer service alone (registering it there would make it fire twice).
     */
    private boolean bundleTouchesProcessingTimer(int index, long time, boolean delete) {
        selectBundleRecord(index);
        InternalTimer<K, VoidNamespace> firing = firingTimer;
        if (firing == null
                || firing.getTimestamp() != time
                || !firing.getKey().equals(getCurrentKey())) {
            return false;
        }
        firingTimerDeleted = delete;
        return true;
    }

    @Override
    public void processWatermarkStatus(WatermarkStatus watermarkStatus) throws Exception {
        processBundle(); // held-back records leave before an IDLE status
        super.processWatermarkStatus(watermarkStatus);
    }

    @Override
    public void processRecordAttributes(RecordAttributes recordAttributes) throws Exception {
        processBundle();
        super.processRecordAttributes(recordAttributes);
    }

    /** Runs a held-back bundle before {@code timer}, then makes the timer's key current again. */
    private void processBundleBefore(InternalTimer<K, VoidNamespace> timer) throws Exception {
        if (readAhead != null && !readAhead.isEmpty()) {
            processBundle();
            setCurrentKey(timer.getKey());
        }
    }

    @Override
    public void prepareSnapshotPreBarrier(long checkpointId) throws Exception {
        processBundle();
        super.prepareSnapshotPreBarrier(checkpointId);
    }

    @Override
    public void endInput() {
        try {
            processBundle();
        } catch (Exception e) {
            throw new RuntimeException("pyflink-ndb: processing the held-back bundle failed", e);
        }
        super.endInput();
    }

    @Override
    public OperatorSnapshotFutures snapshotState(
            long checkpointId,
            long timestamp,
            CheckpointOptions checkpointOptions,
            CheckpointStreamFactory factory)
            throws Exception {
        hooks().beforeSnapshot(checkpointId, checkpointOptions);
        return hooks().wrapSnapshot(
                checkpointId,
                super.snapshotState(checkpointId, timestamp, checkpointOptions, factory));
    }

    @Override
    public void snapshotState(StateSnapshotContext context) throws Exception {
        super.snapshotState(context);
        hooks().snapshotState(context);
    }

    @Override
    public void notifyCheckpointComplete(long checkpointId) throws Exception {
        try {
            hooks().notifyCheckpointComplete(checkpointId);
        } finally {
            super.notifyCheckpointComplete(checkpointId);
        }
    }

    @Override
    public void notifyCheckpointAborted(long checkpointId) throws Exception {
        try {
            hooks().notifyCheckpointAborted(checkpointId);
        } finally {
            super.notifyCheckpointAborted(checkpointId);
        }
    }

    @Override
    public void finish() throws Exception {
        processBundle();
        super.finish();
        hooks().finish();
    }

    @Override
    public void close() throws Exception {
        try {
            hooks().close();
        } finally {
            super.close();
        }
    }

    /**
     * PyFlink's chaining optimizer builds the chained operator through copy(); the base class
     * would return a plain EmbeddedPythonKeyedProcessOperator and drop every hook.
     */
    @Override
    public <T> AbstractEmbeddedDataStreamPythonFunctionOperator<T> copy(
            DataStreamPythonFunctionInfo pythonFunctionInfo, TypeInformation<T> outputTypeInfo) {
        return new NdbKeyedProcessOperator<K, IN, T>(
                config, pythonFunctionInfo, ndbInputTypeInfo, outputTypeInfo, stateOptionsJson);
    }
}
