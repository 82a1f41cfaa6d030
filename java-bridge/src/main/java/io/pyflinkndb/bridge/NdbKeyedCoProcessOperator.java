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
import org.apache.flink.streaming.api.operators.python.embedded.EmbeddedPythonKeyedCoProcessOperator;
import org.apache.flink.streaming.runtime.streamrecord.StreamRecord;

/**
 * PyFlink's thread-mode keyed co-process operator (two keyed inputs), with the operator life cycle forwarded to the
 * pyflink-ndb Python state backend (see {@link StateBackendHooks} and java-bridge/README.md).
 */
public class NdbKeyedCoProcessOperator<K, IN1, IN2, OUT>
        extends EmbeddedPythonKeyedCoProcessOperator<K, IN1, IN2, OUT> {

    private static final long serialVersionUID = 1L;

    /** Kept here because the base class's getters are package-private; needed by copy(). */
    private final TypeInformation<IN1> ndbInputTypeInfo1;

    private final TypeInformation<IN2> ndbInputTypeInfo2;

    private final TypeInformation<OUT> ndbOutputTypeInfo;

    private final String stateOptionsJson;

    private transient StateBackendHooks hooks;

    private transient RecordCall<IN1, OUT> recordCall1;

    private transient RecordCall<IN2, OUT> recordCall2;

    public NdbKeyedCoProcessOperator(
            Configuration config,
            DataStreamPythonFunctionInfo pythonFunctionInfo,
            TypeInformation<IN1> inputTypeInfo1,
            TypeInformation<IN2> inputTypeInfo2,
            TypeInformation<OUT> outputTypeInfo,
            String stateOptionsJson) {
        super(config, pythonFunctionInfo, inputTypeInfo1, inputTypeInfo2, outputTypeInfo);
        this.ndbInputTypeInfo1 = inputTypeInfo1;
        this.ndbInputTypeInfo2 = inputTypeInfo2;
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
    public void open() throws Exception {
        super.open();
        recordCall1 = new RecordCall<>("process_element1", ndbInputTypeInfo1, ndbOutputTypeInfo);
        recordCall2 = new RecordCall<>("process_element2", ndbInputTypeInfo2, ndbOutputTypeInfo);
    }

    /** What PyFlink's {@code processElement1} does, in one call into the interpreter ({@link
     * RecordCall}). */
    @Override
    public void processElement1(StreamRecord<IN1> element) throws Exception {
        if (hasSideOutput) {
            super.processElement1(element);
            return;
        }
        timestamp = element.getTimestamp();
        recordCall1.process(interpreter, element, collector);
    }

    /** The same for the second input. */
    @Override
    public void processElement2(StreamRecord<IN2> element) throws Exception {
        if (hasSideOutput) {
            super.processElement2(element);
            return;
        }
        timestamp = element.getTimestamp();
        recordCall2.process(interpreter, element, collector);
    }

    @Override
    public void openPythonInterpreter() {
        hooks().bind(interpreter);
        super.openPythonInterpreter();
        hooks().attachOperation(interpreter);
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
        super.finish();
        hooks().finish();
    }

    /**
     * Note: PyFlink's two-input operator calls the user's close() inside its own close(), i.e.
     * after {@code ndb_backend.close()} has run here (the one-input operator calls it at end of
     * input instead). State written in a co-process function's close() is not persisted.
     */
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
     * would return a plain EmbeddedPythonKeyedCoProcessOperator and drop every hook.
     */
    @Override
    public <T> AbstractEmbeddedDataStreamPythonFunctionOperator<T> copy(
            DataStreamPythonFunctionInfo pythonFunctionInfo, TypeInformation<T> outputTypeInfo) {
        return new NdbKeyedCoProcessOperator<K, IN1, IN2, T>(
                config,
                pythonFunctionInfo,
                ndbInputTypeInfo1,
                ndbInputTypeInfo2,
                outputTypeInfo,
                stateOptionsJson);
    }
}
