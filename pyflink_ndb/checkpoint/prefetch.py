"""Background work after a restore (issue 9): the prefetch of `restore.mode: background`
and the build of the key filter (`restore.key-filter`). Both walk the subtask's inherited
key groups state by state in pages, one background job of the writer per page
(:class:`KeyGroupWalk`), so that a checkpoint's write waits behind at most one page.

Prefetch (`restore.mode: background`).

The restore itself stays lazy: the first record is processed at once, and a miss reads
its key from the store on the task thread's connection (so on-demand reads jump the
queue). Meanwhile the background writer (:mod:`pyflink_ndb.checkpoint.writer`, its own
connection) streams the subtask's key groups from the store into tier 2 in pages, one page
per background job, so that a checkpoint's write waits behind at most one page. A key
group whose every state is prefetched needs no round trip any more: a miss there means
"no value"
(`TieredTable.store_has_nothing`).

Key filter (`restore.key-filter`, with `restore.mode: lazy`): the pages read only the
user keys (:meth:`StateStore.scan_ukeys`, an index-only scan) and, once a key group is
complete, install its Bloom filter (:class:`pyflink_ndb.tiers.key_filter.KeyFilter`); a
miss that the filter rules out needs no round trip (docs/protocol.md, "Misses the store
cannot answer").

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
from pyflink_ndb.serialization.keys import entry_prefix
from pyflink_ndb.tiers.key_filter import KeyFilter, entry_member, prefix_member

if TYPE_CHECKING:
    from pyflink_ndb.checkpoint.protocol import CheckpointProtocol

log = logging.getLogger(__name__)

#: Rows per prefetch page (one store statement, one writer job).
PAGE_ROWS = 1000
#: Rows per page of the key filter's scan (keys only: no value is read).
KEY_PAGE_ROWS = 5000
#: State kinds whose ukeys are `encoded Flink key [+ namespace] + suffix` (their entries'
#: prefixes go into the key filter too).
PREFIX_KINDS = frozenset({"map", "list"})


class KeyGroupWalk:
    """Walks the inherited key groups of one subtask, state by state, in pages: one
    background job of the protocol's writer per page, each queueing the next
    (`skip_at_drain`: a subtask that ends drops the rest). Subclasses read a page
    (:meth:`_read_page`) and finish a key group (:meth:`_key_group_done`).

    :param protocol: the opened checkpoint protocol (its lineage, writer and stores).
    :param state_ids: the operator's states (from the catalog).
    """

    #: Name of the writer jobs (thread dumps, logs).
    job_name = "key-group page"
    page_rows = PAGE_ROWS

    def __init__(self, protocol: CheckpointProtocol, state_ids: Sequence[int]) -> None:
        assert protocol.lineage is not None
        self.protocol = protocol
        self.state_ids = list(state_ids)
        lineage = protocol.lineage
        s = protocol.scope
        self.key_groups = [kg for kg in range(s.key_group_start, s.key_group_end + 1)
                           if lineage.segment(kg).inherited]
        #: Key groups whose every state is walked (written by the writer thread).
        self.done: set[int] = set()
        self.finished = False
        #: Seconds from :meth:`start` to the last page (None until finished).
        self.seconds: float | None = None
        self._started = 0.0

    def start(self) -> None:
        """Queue the first page."""
        self._started = time.monotonic()
        self._submit(0, 0, None)

    def _submit(self, kg_index: int, sid_index: int, after: bytes | None) -> None:
        self.protocol.writer.submit(Job(lambda: self._page(kg_index, sid_index, after),
                                        name=self.job_name, background=True,
                                        skip_at_drain=True))

    def _page(self, kg_index: int, sid_index: int, after: bytes | None) -> None:
        """Writer thread: one page; queues the next one."""
        if kg_index >= len(self.key_groups) or not self.state_ids:
            self.seconds = time.monotonic() - self._started
            self.finished = True
            self._finished(self.seconds)
            return
        kg = self.key_groups[kg_index]
        last = self._read_page(kg, self.state_ids[sid_index], after)
        if last is not None:
            self._submit(kg_index, sid_index, last)
        elif sid_index + 1 < len(self.state_ids):
            self._submit(kg_index, sid_index + 1, None)
        else:
            self._key_group_done(kg)
            self.done.add(kg)
            self._submit(kg_index + 1, 0, None)

    def _read_page(self, key_group: int, state_id: int, after: bytes | None
                   ) -> bytes | None:
        """Read the page after `after`; returns the key to continue after, or None when
        this state of the key group is complete."""
        raise NotImplementedError

    def _key_group_done(self, key_group: int) -> None:
        """Every state of `key_group` was read."""

    def _finished(self, seconds: float) -> None:
        """Every key group was read, in `seconds`."""


class BackgroundPrefetch(KeyGroupWalk):
    """Streams the visible versions of one subtask's inherited key groups into tier 2."""

    job_name = "prefetch page"

    def __init__(self, protocol: CheckpointProtocol, state_ids: Sequence[int]) -> None:
        super().__init__(protocol, state_ids)
        self.entries = 0

    def start(self) -> None:
        table = self.protocol.table
        inherited = set(self.key_groups)
        done = self.done
        table.store_has_nothing = lambda kg: kg not in inherited or kg in done
        super().start()

    def _read_page(self, key_group: int, state_id: int, after: bytes | None
                   ) -> bytes | None:
        p = self.protocol
        assert p.lineage is not None
        page = p.wstore.scan_latest(state_id, key_group, b"", after, self.page_rows,
                                    p.lineage.head(key_group))
        self.entries += p.table.preload_absent(state_id, key_group, page)
        return page[-1][0] if len(page) == self.page_rows else None

    def _finished(self, seconds: float) -> None:
        p = self.protocol
        log.info("pyflink-ndb %s/%d: prefetched %d entries of %d key groups in %.1f s",
                 p.scope.operator, p.scope.subtask_index, self.entries,
                 len(self.key_groups), seconds)


class KeyFilterBuild(KeyGroupWalk):
    """Builds the key filter of one subtask's inherited key groups and installs it in the
    tiered table (`TieredTable.key_filter`) as key groups complete.

    :param state_kinds: state id -> kind, from the catalog (map and list states' entry
        prefixes are added too).
    """

    job_name = "key-filter page"
    page_rows = KEY_PAGE_ROWS

    def __init__(self, protocol: CheckpointProtocol, state_kinds: dict[int, str]) -> None:
        super().__init__(protocol, sorted(state_kinds))
        prefix_ids = {sid for sid, kind in state_kinds.items() if kind in PREFIX_KINDS}
        self.filter = KeyFilter(state_kinds, prefix_ids)
        self._members: list[bytes] = []
        self._prefixes: set[bytes] = set()

    def start(self) -> None:
        self.protocol.table.key_filter = self.filter
        super().start()

    def _read_page(self, key_group: int, state_id: int, after: bytes | None
                   ) -> bytes | None:
        p = self.protocol
        assert p.lineage is not None
        ukeys = p.wstore.scan_ukeys(state_id, key_group, after, self.page_rows,
                                    p.lineage.head(key_group))
        self._members += [entry_member(state_id, u) for u in ukeys]
        if state_id in self.filter.prefix_state_ids:
            prefixes = self._prefixes
            for ukey in ukeys:
                prefixes.add(prefix_member(state_id, entry_prefix(ukey)))
        return ukeys[-1] if len(ukeys) == self.page_rows else None

    def _key_group_done(self, key_group: int) -> None:
        self.filter.add_key_group(key_group, self._members + list(self._prefixes))
        self._members = []
        self._prefixes = set()

    def _finished(self, seconds: float) -> None:
        p = self.protocol
        log.info("pyflink-ndb %s/%d: key filter of %d key groups built in %.1f s "
                 "(%d members, %d bytes)", p.scope.operator, p.scope.subtask_index,
                 self.filter.key_groups, seconds, self.filter.members,
                 self.filter.size_bytes)
