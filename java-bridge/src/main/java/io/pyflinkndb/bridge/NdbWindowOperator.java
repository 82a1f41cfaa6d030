package io.pyflinkndb.bridge;

import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeutils.TypeSerializer;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.runtime.checkpoint.CheckpointOptions;
import org.apache.flink.runtime.state.CheckpointStreamFactory;
import org.apache.flink.runtime.state.StateInitializationContext;
import org.apache.flink.runtime.state.StateSnapshotContext;
import org.apache.flink.streaming.api.functions.python.DataStreamPythonFunctionInfo;
import org.apache.flink.streaming.api.operators.OperatorSnapshotFutures;
import org.apache.flink.streaming.api.operators.python.DataStreamPythonFunctionOperator;
import org.apache.flink.streaming.api.operators.python.embedded.EmbeddedPythonWindowOperator;
import org.apache.flink.streaming.runtime.streamrecord.StreamRecord;
import org.apache.flink.table.runtime.operators.window.Window;

/**
 * PyFlink's thread-mode window operator, with the operator life cycle forwarded to the
 * pyflink-ndb Python state backend (see {@link StateBackendHooks} and java-bridge/README.md).
 * The window contents and window state live in the tiers (the Python window operation's keyed
 * state is routed there, namespace = the window); the timers stay in Flink's timer service.
 */
public class NdbWindowOperator<K, IN, OUT, W extends Window>
        extends EmbeddedPythonWindowOperator<K, IN, OUT, W> {

    private static final long serialVersionUID = 1L;

    /** Kept here because the base class's fields are private; needed by copy(). */
    private final TypeInformation<IN> ndbInputTypeInfo;

    private final TypeInformation<OUT> ndbOutputTypeInfo;

    private final TypeSerializer<W> ndbNamespaceSerializer;

    private final String stateOptionsJson;

    private transient StateBackendHooks hooks;

    private transient RecordCall<IN, OUT> recordCall;

    public NdbWindowOperator(
            Configuration config,
            DataStreamPythonFunctionInfo pythonFunctionInfo,
            TypeInformation<IN> inputTypeInfo,
            TypeInformation<OUT> outputTypeInfo,
            TypeSerializer<W> namespaceSerializer,
            String stateOptionsJson) {
        super(config, pythonFunctionInfo, inputTypeInfo, outputTypeInfo, namespaceSerializer);
        this.ndbInputTypeInfo = inputTypeInfo;
        this.ndbOutputTypeInfo = outputTypeInfo;
        this.ndbNamespaceSerializer = namespaceSerializer;
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
        recordCall = new RecordCall<>("process_element", ndbInputTypeInfo, ndbOutputTypeInfo);
    }

    /** What PyFlink's {@code processElement} does, in one call into the interpreter ({@link
     * RecordCall}). */
    @Override
    public void processElement(StreamRecord<IN> element) throws Exception {
        if (hasSideOutput) {
            super.processElement(element);
            return;
        }
        timestamp = element.getTimestamp();
        recordCall.process(interpreter, element, collector);
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
     * would return a plain EmbeddedPythonWindowOperator and drop every hook.
     */
    @Override
    public <T> DataStreamPythonFunctionOperator<T> copy(
            DataStreamPythonFunctionInfo pythonFunctionInfo, TypeInformation<T> outputTypeInfo) {
        return new NdbWindowOperator<K, IN, T, W>(
                config,
                pythonFunctionInfo,
                ndbInputTypeInfo,
                outputTypeInfo,
                ndbNamespaceSerializer,
                stateOptionsJson);
    }
}
