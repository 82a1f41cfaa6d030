package io.pyflinkndb.bridge;

import java.util.function.IntConsumer;

/**
 * What Python calls while a bundle is processed in one call ({@code
 * pyflink_ndb._pyflink.BundleTimerService}): {@link #select} makes record {@code i} of the bundle
 * the operator's current record (its key context and timestamp) before a timer of that record is
 * registered or deleted, since Flink's timer service registers timers for the operator's current
 * key; {@link #processingTimer} first checks a processing-time timer against the one whose firing
 * runs the bundle. Public for PEMJA's reflection.
 */
public final class BundleCursor {

    /** What the operator does for {@link #processingTimer}. */
    interface ProcessingTimerCheck {
        boolean touch(int index, long time, boolean delete);
    }

    private final IntConsumer select;

    private final ProcessingTimerCheck processingTimer;

    BundleCursor(IntConsumer select, ProcessingTimerCheck processingTimer) {
        this.select = select;
        this.processingTimer = processingTimer;
    }

    /** Makes record {@code index} of the bundle being processed the current record. */
    public void select(int index) {
        select.accept(index);
    }

    /**
     * Makes record {@code index} current; then, when its key's processing-time timer at {@code
     * time} is the one firing now (the bundle runs before it), a delete cancels that firing and a
     * registration restores it. Returns true in that case: Python then leaves Flink's timer
     * service alone.
     */
    public boolean processingTimer(int index, long time, boolean delete) {
        return processingTimer.touch(index, time, delete);
    }
}
