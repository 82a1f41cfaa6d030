package io.pyflinkndb.bridge;

import org.apache.flink.runtime.state.KeyGroupRangeAssignment;
import org.apache.flink.streaming.api.operators.AbstractStreamOperator;
import org.apache.flink.types.Row;

/**
 * Handed to Python as the global {@code ndb_key_groups}. Python calls {@link #currentKeyGroup()}
 * (through PEMJA) when it meets a key it has not seen yet and cannot compute its key group
 * itself (keys other than String, Integer and Long: their {@code hashCode()} is the class's
 * own), so the key group is the one Flink routes by.
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

    /**
     * The class name of the operator's current key, so that Python can compute the key groups
     * of String, Integer and Long keys itself ({@code pyflink_ndb.runtime.key_groups}) instead
     * of calling {@link #currentKeyGroup()} for each new key. PyFlink's {@code key_by} keys a
     * stream by a {@link Row} of one field (its {@code KeyByKeySelector}); for such a key the
     * answer is {@code org.apache.flink.types.Row(<field class>)+<offset>}, the offset being
     * the row's {@code hashCode()} minus its field's for this key (Python checks its first
     * answers against {@link #currentKeyGroup()}, so an offset that is not the same for every
     * key only costs the calls it saved).
     *
     * @throws IllegalStateException if there is no current key.
     */
    public String currentKeyClass() {
        Object key = operator.getCurrentKey();
        if (key == null) {
            throw new IllegalStateException(
                    "pyflink-ndb: currentKeyClass() called while no key is current");
        }
        if (key instanceof Row) {
            Row row = (Row) key;
            Object field = row.getArity() == 1 ? row.getField(0) : null;
            if (field != null) {
                return Row.class.getName() + "(" + field.getClass().getName() + ")+"
                        + (row.hashCode() - field.hashCode());
            }
        }
        return key.getClass().getName();
    }

    /** The max parallelism (number of key groups) of this operator. */
    public int maxParallelism() {
        return maxParallelism;
    }
}
