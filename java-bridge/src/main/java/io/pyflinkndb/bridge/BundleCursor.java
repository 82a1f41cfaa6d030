package io.pyflinkndb.bridge;

import java.util.function.IntConsumer;

/**
 * What Python calls ({@code select(i)}) to make record {@code i} of the bundle being processed
 * the operator's current record (its key context and timestamp), before a timer of that record is
 * registered or deleted: Flink's timer service registers timers for the operator's current key
 * ({@code pyflink_ndb._pyflink.BundleTimerService}). Public for PEMJA's reflection.
 */
public final class BundleCursor {

    private final IntConsumer select;

    BundleCursor(IntConsumer select) {
        this.select = select;
    }

    /** Makes record {@code index} of the bundle being processed the current record. */
    public void select(int index) {
        select.accept(index);
    }
}
