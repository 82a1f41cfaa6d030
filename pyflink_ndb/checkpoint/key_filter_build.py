"""The build of the key filter after a lazy restore (`restore.key-filter`, issue 9 item 1;
docs/protocol.md, "Misses the store cannot answer").

The versions a branch inherited never change after its claim, so a filter of the
inherited keys built once stays valid for the whole attempt. The build runs on the
background writer (its own connection), one page per background job so that a
checkpoint's write waits behind at most one page, and never on the task thread: the first
record is processed at once, and until a segment's filters are installed its misses go to
the store as without a filter.

What it reads: per inherited key-group segment, per state of the operator and per
inherited version range, the `(version, key_group, ukey)` of the rows in that range
(:meth:`StateStore.scan_entries`, through the `(state_id, version, key_group)` index,
which holds the primary-key columns: a covering scan of a narrow index, not of the rows
with their values; measured in bench part 8 at 1M keys × 1 KB, where a scan of the
clustered primary key slowed the restored job's reads of existing keys by 40 %). Every
visible version of an entry is in these ranges, tombstones too: the filter holds a
superset of the entries with a value, which is safe (a false positive costs the round
trip it would cost anyway).

The index orders rows by version first, so no key group of a segment is complete before
the segment's last page: members are kept as 8-byte hashes (`array('q')`, per key group)
until then, and the segment's filters are installed together.
"""

from __future__ import annotations

import logging
import time
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyflink_ndb.checkpoint.writer import Job
from pyflink_ndb.serialization.keys import entry_prefix
from pyflink_ndb.tiers.key_filter import KeyFilter, entry_member, prefix_member

if TYPE_CHECKING:
    from pyflink_ndb.checkpoint.protocol import CheckpointProtocol

log = logging.getLogger(__name__)

#: Rows per page (one statement, one writer job; keys only, no value is read).
PAGE_ROWS = 5000
#: The build starts once the attempt's point reads found this many keys the store does
#: not hold (0: at once). A job that meets only stored keys (a recovery that reads its
#: existing keys) never pays for the build's scan, which competes with its reads for the
#: database: at 1M keys × 1 KB on this machine's MariaDB it took 6.5 s per subtask and
#: made a 10,000-key probe of existing keys 2.5× slower (bench part 8). A job that meets
#: new keys (new users after a restore) pays a round trip for each until the filter is
#: built.
START_AFTER_ABSENT_READS = 1000
#: State kinds whose ukeys are `encoded Flink key [+ namespace] + suffix` (their entries'
#: prefixes go into the filter too: a map iteration or list read of a key never stored).
PREFIX_KINDS = frozenset({"map", "list"})


@dataclass(frozen=True)
class _Scan:
    """One range of one state in one segment."""

    segment: int
    state_id: int
    lo: int
    hi: int


class KeyFilterBuild:
    """Builds the key filter of one subtask's inherited key groups and installs it in the
    tiered table (`TieredTable.key_filter`), a segment at a time.

    :param protocol: the opened checkpoint protocol (its lineage, writer and write store).
    :param state_kinds: state id -> kind, from the operator's catalog at the claim.
    """

    def __init__(self, protocol: CheckpointProtocol, state_kinds: Mapping[int, str]) -> None:
        assert protocol.lineage is not None
        self.protocol = protocol
        s = protocol.scope
        inherited = [seg for seg in protocol.lineage.segments if seg.inherited]
        self.segments = [(max(seg.kg_start, s.key_group_start),
                          min(seg.kg_end, s.key_group_end)) for seg in inherited]
        self._scans = [_Scan(i, sid, lo, hi) for i, seg in enumerate(inherited)
                       for sid in sorted(state_kinds) for lo, hi in seg.inherited]
        prefix_ids = {sid for sid, kind in state_kinds.items() if kind in PREFIX_KINDS}
        self.filter = KeyFilter(state_kinds, prefix_ids)
        #: Key groups whose filter is installed.
        self.done: set[int] = set()
        self.finished = False
        #: Seconds from :meth:`start` to the last page (None until finished).
        self.seconds: float | None = None
        self.rows = 0
        self._hashes: dict[int, array[int]] = {}
        self._started_at: float | None = None

    @property
    def started(self) -> bool:
        """True once the build started (:meth:`arm`)."""
        return self._started_at is not None

    @property
    def key_groups(self) -> list[int]:
        """The inherited key groups (those a filter is built for)."""
        return [kg for a, b in self.segments for kg in range(a, b + 1)]

    def arm(self) -> None:
        """Start the build once the table's point reads found
        :data:`START_AFTER_ABSENT_READS` keys the store does not hold (at once for 0)."""
        table = self.protocol.table
        if START_AFTER_ABSENT_READS <= 0:
            self.start()
            return
        table.absent_reads_trigger_at = table.absent_reads + START_AFTER_ABSENT_READS
        table.on_absent_reads = self.start

    def start(self) -> None:
        """Install the (empty) filter in the table and queue the first page."""
        self._started_at = time.monotonic()
        self.protocol.table.key_filter = self.filter
        self._submit(0, None)

    def _submit(self, index: int, after: tuple[int, int, bytes] | None) -> None:
        self.protocol.writer.submit(Job(lambda: self._page(index, after),
                                        name="key-filter page", background=True,
                                        skip_at_drain=True))

    def _page(self, index: int, after: tuple[int, int, bytes] | None) -> None:
        """Writer thread: one page of scan `index`; queues the next one."""
        if index >= len(self._scans):
            assert self._started_at is not None
            self.seconds = time.monotonic() - self._started_at
            self.finished = True
            p = self.protocol
            log.info("pyflink-ndb %s/%d: key filter of %d key groups built in %.1f s (%d "
                     "rows, %d members, %d bytes)", p.scope.operator, p.scope.subtask_index,
                     self.filter.key_groups, self.seconds, self.rows, self.filter.members,
                     self.filter.size_bytes)
            return
        scan = self._scans[index]
        kg_start, kg_end = self.segments[scan.segment]
        rows = self.protocol.wstore.scan_entries(scan.state_id, kg_start, kg_end, scan.lo,
                                                 scan.hi, after, PAGE_ROWS)
        self.rows += len(rows)
        sid = scan.state_id
        prefixed = sid in self.filter.prefix_state_ids
        hashes = self._hashes
        for _, kg, ukey in rows:
            into = hashes.get(kg)
            if into is None:
                into = hashes[kg] = array("q")
            into.append(hash(entry_member(sid, ukey)))
            if prefixed:
                into.append(hash(prefix_member(sid, entry_prefix(ukey))))
        if len(rows) == PAGE_ROWS:
            self._submit(index, rows[-1])
            return
        following = index + 1
        if following == len(self._scans) or self._scans[following].segment != scan.segment:
            for kg in range(kg_start, kg_end + 1):
                self.filter.add_key_group(kg, hashes.pop(kg, array("q")))
                self.done.add(kg)
        self._submit(following, None)
