package io.pyflinkndb.bridge;

import org.apache.flink.runtime.state.KeyGroupRangeAssignment;
import org.apache.flink.streaming.api.operators.AbstractStreamOperator;

/**
 * Handed to Python as the global {@code ndb_key_groups}. Python calls {@link #currentKeyGroup()}
 * (through PEMJA) when it meets a key it has not seen yet, so the key group is the one Flink
 * routes by, without re-implementing Java's {@code hashCode()} in Python.
 *
 * <p>Must stay a public class with public methods: PEMJA calls them by reflection.
 */
public final class KeyGroupProbe {

    private final AbstractStreamOperator<?> operator;
    private final int maxParallelism;

    KeyGroupProbe(AbstractStreamOperator<?> operator, int maxParallelism) {
        this.operator = operator;
        this.maxParallelism = maxParallelism;
    }

    /**
     * The key group of the operator's current key, {@code KeyGroupRangeAssignment.assignToKeyGroup(
     * getCurrentKey(), maxParallelism)}. Only meaningful while a record or a timer of a key is being
     * processed (i.e. from inside process_element / on_timer).
     *
     * @throws IllegalStateException if there is no current key.
     */
    public int currentKeyGroup() {
        Object key = operator.getCurrentKey();
        if (key == null) {
            throw new IllegalStateException(
                    "pyflink-ndb: currentKeyGroup() called while no key is current "
                            + "(only valid inside process_element/on_timer of a keyed function)");
        }
        return KeyGroupRangeAssignment.assignToKeyGroup(key, maxParallelism);
    }

    /** The max parallelism (number of key groups) of this operator. */
    public int maxParallelism() {
        return maxParallelism;
    }
}
