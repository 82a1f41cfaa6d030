package io.pyflinkndb.bridge;

import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.streaming.api.operators.TimestampedCollector;
import org.apache.flink.streaming.api.utils.PythonTypeUtils;
import org.apache.flink.streaming.runtime.streamrecord.StreamRecord;

import pemja.core.PythonInterpreter;
import pemja.core.object.PyIterator;

import java.util.List;

/**
 * One record of an embedded Python operation in one call into the interpreter.
 *
 * <p>PyFlink's thread-mode operators ({@code AbstractOneInputEmbeddedPythonFunctionOperator}
 * and its two-input twin) call {@code operation.process_element(value)} and iterate the
 * generator it returns through a PEMJA {@code PyIterator}: every {@code hasNext}, {@code next}
 * and {@code close} enters the interpreter again and takes the GIL, which all subtasks of a
 * TaskManager share, so a record without output takes it three times and one with one output
 * four. The bridge's operators call {@code ndb_backend.process_element(value)} (or {@code
 * process_element1}/{@code 2}) instead, which runs the operation and returns the record's
 * outputs as one Python list (an {@code ArrayList} here, each element converted by PEMJA as
 * {@code PyIterator.next()} converts it), emitted in the same order once the call has returned;
 * beyond {@code OUTPUTS_PER_CALL} (1,024) outputs Python returns the first ones and the
 * generator of the rest, which is iterated as PyFlink does ({@code
 * pyflink_ndb.runtime.backend.drain_outputs}). An operator with side outputs keeps PyFlink's
 * path: its side outputs leave while the outputs are iterated, interleaved with them.
 */
final class RecordCall<IN, OUT> {

    /** {@code process_element}, or {@code process_element1}/{@code 2} of a two-input operation. */
    private final String method;

    private final PythonTypeUtils.DataConverter<IN, Object> inputConverter;

    private final PythonTypeUtils.DataConverter<OUT, Object> outputConverter;

    RecordCall(
            String method,
            TypeInformation<IN> inputTypeInfo,
            TypeInformation<OUT> outputTypeInfo) {
        this.method = method;
        this.inputConverter =
                PythonTypeUtils.TypeInfoToDataConverter.typeInfoDataConverter(inputTypeInfo);
        this.outputConverter =
                PythonTypeUtils.TypeInfoToDataConverter.typeInfoDataConverter(outputTypeInfo);
    }

    /**
     * Sets the collector's timestamp to the record's (as PyFlink's operator does; the caller sets
     * its own {@code timestamp} field, which is its base class's), calls {@code
     * ndb_backend.<method>(value)} and emits the outputs to {@code collector}.
     */
    void process(
            PythonInterpreter interpreter,
            StreamRecord<IN> element,
            TimestampedCollector<OUT> collector)
            throws Exception {
        collector.setTimestamp(element);
        Object results =
                interpreter.invokeMethod(
                        StateBackendHooks.PY_BACKEND,
                        method,
                        inputConverter.toExternal(element.getValue()));
        if (results == null) {
            return;
        }
        if (results instanceof List) {
            emit((List<?>) results, collector);
            return;
        }
        Object[] parts = (Object[]) results; // (the first outputs, the generator of the rest)
        emit((List<?>) parts[0], collector);
        emitRest((PyIterator) parts[1], collector);
    }

    /** Emits a record's further outputs, iterated as PyFlink does, and closes the iterator. */
    void emitRest(PyIterator rest, TimestampedCollector<OUT> collector) throws Exception {
        try {
            while (rest.hasNext()) {
                collector.collect(outputConverter.toInternal(rest.next()));
            }
        } finally {
            rest.close();
        }
    }

    /** Emits a record's outputs (converted from Python) in their order. */
    void emit(List<?> outputs, TimestampedCollector<OUT> collector) {
        for (Object result : outputs) {
            collector.collect(outputConverter.toInternal(result));
        }
    }
}
