"""Background prefetch after a restore (`restore.mode: background`, issue 9).

The restore itself stays lazy: the first record is processed at once, and a miss reads
its key from the store on the task thread's connection (so on-demand reads jump the
queue). Meanwhile the background writer (:mod:`pyflink_ndb.checkpoint.writer`, its own
connection) streams the subtask's key groups from the store into tier 2 in pages, one page
per background job, so that a checkpoint's write waits behind at most one page. A key
group whose every state is prefetched needs no round trip any more: a miss there means
"no value"
(`TieredTable.store_has_nothing`).

Consistency with the task thread: a prefetched version is the newest one the restored
lineage sees; anything newer is this attempt's own and lives in tier 1, tier 2, the dirty
set or an epoch in flight. :meth:`TieredTable.preload_absent` therefore writes an entry
into tier 2 only when none of those knows it, under the table's tier-2 lock, which the
task thread also takes when it evicts into tier 2: an eviction either comes before
(then the entry is known and skipped) or after (then it overwrites the prefetched copy
with the newer content).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyflink_ndb.checkpoint.writer import Job

if TYPE_CHECKING:
    from pyflink_ndb.checkpoint.protocol import CheckpointProtocol

log = logging.getLogger(__name__)

#: Rows per prefetch page (one store statement, one writer job).
PAGE_ROWS = 1000


class BackgroundPrefetch:
    """Streams the visible versions of one subtask's inherited key groups into tier 2.

    :param protocol: the opened checkpoint protocol (its lineage, writer and stores).
    :param state_ids: the operator's states (from the catalog).
    """

    def __init__(self, protocol: CheckpointProtocol, state_ids: Sequence[int]) -> None:
        assert protocol.lineage is not None
        self.protocol = protocol
        self.state_ids = list(state_ids)
        lineage = protocol.lineage
        s = protocol.scope
        self.key_groups = [kg for kg in range(s.key_group_start, s.key_group_end + 1)
                           if lineage.segment(kg).inherited]
        #: Key groups whose every state is in tier 2 (written by the writer thread).
        self.done: set[int] = set()
        self.entries = 0
        self.finished = False
        self._started = 0.0

    def start(self) -> None:
        """Queue the first page (inline writer: prefetch everything now)."""
        self._started = time.monotonic()
        table = self.protocol.table
        inherited = set(self.key_groups)
        done = self.done
        table.store_has_nothing = lambda kg: kg not in inherited or kg in done
        self._submit(0, 0, None)

    def _submit(self, kg_index: int, sid_index: int, after: bytes | None) -> None:
        self.protocol.writer.submit(Job(lambda: self._page(kg_index, sid_index, after),
                                        name="prefetch page", background=True,
                                        skip_at_drain=True))

    def _page(self, kg_index: int, sid_index: int, after: bytes | None) -> None:
        """Writer thread: one page; queues the next one."""
        p = self.protocol
        if kg_index >= len(self.key_groups) or not self.state_ids:
            self.finished = True
            log.info("pyflink-ndb %s/%d: prefetched %d entries of %d key groups in %.1f s",
                     p.scope.operator, p.scope.subtask_index, self.entries,
                     len(self.key_groups), time.monotonic() - self._started)
            return
        assert p.lineage is not None
        kg = self.key_groups[kg_index]
        sid = self.state_ids[sid_index]
        page = p.wstore.scan_latest(sid, kg, b"", after, PAGE_ROWS, p.lineage.head(kg))
        self.entries += p.table.preload_absent(sid, kg, page)
        if len(page) == PAGE_ROWS:
            self._submit(kg_index, sid_index, page[-1][0])
        elif sid_index + 1 < len(self.state_ids):
            self._submit(kg_index, sid_index + 1, None)
        else:
            self.done.add(kg)
            self._submit(kg_index + 1, 0, None)
