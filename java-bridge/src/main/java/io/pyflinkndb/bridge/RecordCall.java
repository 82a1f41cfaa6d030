package io.pyflinkndb.bridge;

import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.streaming.api.operators.TimestampedCollector;
import org.apache.flink.streaming.api.utils.PythonTypeUtils;

import pemja.core.PythonInterpreter;

import java.util.List;

/**
 * One record of an embedded Python operation in one call into the interpreter.
 *
 * <p>PyFlink's thread-mode operators ({@code AbstractOneInputEmbeddedPythonFunctionOperator}
 * and its two-input twin) call {@code operation.process_element(value)} and iterate the
 * generator it returns through a PEMJA {@code PyIterator}: every {@code hasNext}, {@code next}
 * and {@code close} enters the interpreter again and takes the GIL, which all subtasks of a
 * TaskManager share, so a record with one output takes it four times. The bridge's operators
 * call {@code ndb_backend.process_element(value)} (or {@code process_element1}/{@code 2})
 * instead, which runs the operation and returns the record's outputs as one Python list (an
 * {@code ArrayList} here, each element converted by PEMJA as {@code PyIterator.next()} converts
 * it); they are emitted in the same order once the function has returned. Side outputs are
 * emitted while it runs, as before.
 */
final class RecordCall<OUT> {

    private final PythonTypeUtils.DataConverter<OUT, Object> outputConverter;

    RecordCall(TypeInformation<OUT> outputTypeInfo) {
        this.outputConverter =
                PythonTypeUtils.TypeInfoToDataConverter.typeInfoDataConverter(outputTypeInfo);
    }

    /**
     * Calls {@code ndb_backend.<method>(value)} and emits its outputs to {@code collector} (whose
     * timestamp the caller has set, as PyFlink's operator does).
     */
    void process(
            PythonInterpreter interpreter,
            String method,
            Object value,
            TimestampedCollector<OUT> collector) {
        Object results = interpreter.invokeMethod(StateBackendHooks.PY_BACKEND, method, value);
        if (results != null) {
            for (Object result : (List<?>) results) {
                collector.collect(outputConverter.toInternal(result));
            }
        }
    }
}
