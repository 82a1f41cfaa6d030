package io.pyflinkndb.bridge;

import java.io.IOException;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Hears from the Python background writer when a checkpoint's epoch is durable (or failed),
 * and completes the future that Flink's asynchronous checkpoint phase waits for (see {@link
 * DurableSnapshotFuture}).
 *
 * <p>{@link #durable} and {@link #failed} are called from a Python thread (the subtask's
 * background writer), through PEMJA: PEMJA attaches that thread to the JVM
 * ({@code AttachCurrentThreadAsDaemon}) for the call; measured in java-bridge/README.md. They
 * only complete a future, so they return at once and never call back into Python.
 */
public final class DurabilityListener {

    private final Map<Long, CompletableFuture<Void>> pending = new ConcurrentHashMap<>();

    /** Called on the task thread before Python's {@code snapshot}: the future of that epoch. */
    CompletableFuture<Void> register(long checkpointId) {
        CompletableFuture<Void> future = new CompletableFuture<>();
        CompletableFuture<Void> old = pending.put(checkpointId, future);
        if (old != null) {
            old.completeExceptionally(
                    new IOException("pyflink-ndb: checkpoint " + checkpointId + " was taken again"));
        }
        return future;
    }

    /** The synchronous phase failed: nobody will report this one. */
    void forget(long checkpointId) {
        pending.remove(checkpointId);
    }

    /** Python: every row of the epoch and its snapshot row are committed. */
    public void durable(long checkpointId) {
        CompletableFuture<Void> future = pending.remove(checkpointId);
        if (future != null) {
            future.complete(null);
        }
    }

    /** Python: the epoch's write failed; the checkpoint fails (Flink declines it). */
    public void failed(long checkpointId, String message) {
        CompletableFuture<Void> future = pending.remove(checkpointId);
        if (future != null) {
            future.completeExceptionally(
                    new IOException(
                            "pyflink-ndb: checkpoint "
                                    + checkpointId
                                    + " could not be written to the state store: "
                                    + message));
        }
    }

    /** The operator closes: whatever is still pending fails. */
    void failAll(String reason) {
        for (Long id : pending.keySet()) {
            failed(id, reason);
        }
    }

    int pendingCount() {
        return pending.size();
    }
}
