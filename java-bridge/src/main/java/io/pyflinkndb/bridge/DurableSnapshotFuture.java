package io.pyflinkndb.bridge;

import org.apache.flink.util.concurrent.FutureUtils;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.FutureTask;
import java.util.concurrent.RunnableFuture;

/**
 * The operator's snapshot future as Flink's asynchronous phase sees it: it first waits until
 * the pyflink-ndb epoch of the checkpoint is durable, then runs Flink's own future (the
 * operator state with the snapshot token). If the epoch's write failed, the future fails and
 * so does the checkpoint (Flink declines it: CHECKPOINT_ASYNC_EXCEPTION, counted against
 * {@code execution.checkpointing.tolerable-failed-checkpoints}).
 *
 * <p>Flink runs it on the task's asynchronous checkpoint thread ({@code
 * AsyncCheckpointRunnable} → {@code OperatorSnapshotFinalizer} → {@code
 * FutureUtils.runIfNotDoneAndGet}), so waiting here blocks no record. Cancelling it (task
 * cancelled, checkpoint aborted or subsumed) cancels Flink's future as well.
 */
final class DurableSnapshotFuture<T> extends FutureTask<T> {

    private final RunnableFuture<T> inner;
    private final CompletableFuture<Void> durable;

    DurableSnapshotFuture(RunnableFuture<T> inner, CompletableFuture<Void> durable) {
        super(() -> {
            try {
                durable.get();
            } catch (ExecutionException e) {
                Throwable cause = e.getCause();
                if (cause instanceof Exception) {
                    throw (Exception) cause;
                }
                throw e;
            }
            return FutureUtils.runIfNotDoneAndGet(inner);
        });
        this.inner = inner;
        this.durable = durable;
    }

    @Override
    public boolean cancel(boolean mayInterruptIfRunning) {
        inner.cancel(mayInterruptIfRunning);
        return super.cancel(mayInterruptIfRunning);
    }

    /** True once the epoch's write reported (durable or failed). */
    boolean epochReported() {
        return durable.isDone();
    }
}
