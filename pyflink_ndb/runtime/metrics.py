"""The subtask's metrics in Flink's metric system (web UI, REST API, reporters).

Registered under the operator's metric group as group `pyflink_ndb` through PyFlink's
`RuntimeContext.get_metrics_group()` (thread mode since PyFlink 1.16). Flink's counters
and distributions are Java objects: every update is a call into Java. So that a cache hit
never crosses into Java, the backend counts in plain Python ints and :meth:`push` hands
the deltas to Flink once per checkpoint notification, on the task thread. Gauges are not
used: Flink reads a PyFlink gauge by calling Python from its metric thread, and only the
task thread may call into the operator's interpreter (java-bridge/README.md).

| metric | kind | meaning |
|---|---|---|
| `tier1Hits`, `tier2Hits` | counter | reads answered by the LRU / by RocksDB (or an epoch |
|  |  | in flight) |
| `storeReads`, `storeReadsSaved` | counter | point reads sent to the store / answered |
|  |  | without it (nothing stored there) |
| `readAheadEntries`, `readAheadQueries` | counter | entries read ahead for bundles of |
|  |  | records, and the multi-row queries that read them |
| `storeReadMicros` | distribution | mean point-read latency (µs) since the previous push |
| `dirtyEntries` | distribution | entries frozen by each checkpoint |
| `syncPauseMicros` | distribution | the synchronous phase of the last checkpoint (µs) |
| `flushMillis` | distribution | the background write of the last durable checkpoint (ms) |
| `entriesWritten`, `rowsWritten`, `bytesWritten` | counter | what checkpoints wrote |
| `checkpointsWritten`, `checkpointsFailed` | counter | background writes durable / failed |
| `entriesTakenBack` | counter | entries of failed writes moved into a later checkpoint |
| `rowsCleanedUp` | counter | abandoned rows deleted by background cleanup |
| `retries` | counter | database transactions retried after transient errors |
| `restoreMillis` | distribution | time to claim the key groups at open (once) |
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

GROUP = "pyflink_ndb"
COUNTERS = ("tier1Hits", "tier2Hits", "storeReads", "storeReadsSaved", "readAheadEntries",
            "readAheadQueries", "entriesWritten",
            "rowsWritten", "bytesWritten", "checkpointsWritten", "checkpointsFailed",
            "entriesTakenBack", "rowsCleanedUp", "retries")
DISTRIBUTIONS = ("storeReadMicros", "dirtyEntries", "syncPauseMicros", "flushMillis",
                 "restoreMillis")


def totals(backend: Any) -> dict[str, int]:
    """The backend's running totals, by counter name."""
    table, protocol = backend.table, backend.protocol
    retries = backend.store.retries + (backend.write_store.retries
                                       if backend.write_store is not None else 0)
    return {
        "tier1Hits": table.tier1_hits, "tier2Hits": table.tier2_hits,
        "storeReads": table.store_reads, "storeReadsSaved": table.store_reads_saved,
        "readAheadEntries": table.read_ahead_entries,
        "readAheadQueries": table.read_ahead_queries,
        "entriesWritten": protocol.entries_written, "rowsWritten": protocol.rows_written,
        "bytesWritten": protocol.bytes_written, "checkpointsWritten": protocol.epochs_written,
        "checkpointsFailed": protocol.epochs_failed,
        "entriesTakenBack": protocol.entries_taken_back,
        "rowsCleanedUp": protocol.cleanup_rows, "retries": retries,
    }


class BackendMetrics:
    """Flink metrics of one subtask backend.

    :param metric_group: PyFlink's `MetricGroup` of the operator
        (`runtime_context.get_metrics_group()`).
    :param backend: the subtask's :class:`~pyflink_ndb.runtime.backend.SubtaskStateBackend`.
    """

    def __init__(self, metric_group: Any, backend: Any) -> None:
        group = metric_group.add_group(GROUP)
        self.backend = backend
        self.counters = {name: group.counter(name) for name in COUNTERS}
        self.distributions = {name: group.distribution(name) for name in DISTRIBUTIONS}
        self._pushed = dict.fromkeys(COUNTERS, 0)
        self._reads = (0, 0.0)
        self.distributions["restoreMillis"].update(int(backend.protocol.restore_ms))

    def push(self) -> None:
        """Hand the changes since the last push to Flink (task thread, once per
        checkpoint notification)."""
        now = totals(self.backend)
        for name, value in now.items():
            delta = value - self._pushed[name]
            if delta > 0:
                self.counters[name].inc(delta)
        self._pushed = now
        table, protocol = self.backend.table, self.backend.protocol
        reads, seconds = table.store_reads, table.store_read_seconds
        if reads > self._reads[0]:
            mean = (seconds - self._reads[1]) / (reads - self._reads[0])
            self.distributions["storeReadMicros"].update(int(mean * 1e6))
        self._reads = (reads, seconds)
        self.distributions["dirtyEntries"].update(protocol.last_dirty_entries)
        self.distributions["syncPauseMicros"].update(int(protocol.last_sync_ms * 1000))
        self.distributions["flushMillis"].update(int(protocol.last_flush_ms))


def register(runtime_context: Any, backend: Any) -> BackendMetrics | None:
    """Register the backend's metrics on the operator's metric group; None where the
    runtime context has no metrics (outside Flink)."""
    try:
        group = runtime_context.get_metrics_group()
    except Exception:  # LocalSubtask, or a PyFlink without metrics in thread mode
        return None
    try:
        return BackendMetrics(group, backend)
    except Exception:
        log.warning("pyflink-ndb: could not register metrics", exc_info=True)
        return None
