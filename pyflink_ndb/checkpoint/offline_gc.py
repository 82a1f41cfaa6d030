"""Garbage collection on demand (`pyflink-ndb gc`), from outside any job.

The running subtasks collect garbage as their checkpoints complete (docs/protocol.md,
"Garbage collection"); this runs the same rule over a whole namespace at once, e.g. after
`release`, after a job was cancelled for good, or before a backup. It is safe while jobs
run, without being an owner:

* the versions of every branch that owns key groups now, and of every branch newer than
  the newest one it saw, are never touched (in-flight checkpoints, new claims);
* of the other versions, an entry keeps the newest version in the view of every snapshot
  that is restorable (its row in `<ns>_snapshots`), of what readers see (`committed`), and
  of every owner's head; the rest is deleted, as the running subtasks' own collection
  would (`pyflink_ndb.checkpoint.gc.versions_to_keep`);
* the facts (owners, snapshots, branches) are read after each page of versions is read:
  a snapshot that appears meanwhile was taken after those versions, so it either has its
  own newer version (an owner's, kept) or sees the newest inherited one (kept by its
  owner's head); a claim restores a snapshot that was listed (its versions are kept).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from pyflink_ndb.checkpoint.gc import Deletion, versions_to_keep
from pyflink_ndb.stores.base import StateStore
from pyflink_ndb.stores.lineage import Lineage, Ranges

#: Versions read per page.
PAGE_ROWS = 5_000


@dataclass
class GcReport:
    """What one run removed, per operator."""

    operator: str
    entries: int = 0
    versions: int = 0
    versions_deleted: int = 0
    rows_deleted: int = 0
    kept_as_owners: int = 0
    details: list[str] = field(default_factory=list)


def _entries(rows: list[tuple[int, int, bytes, int, bool]]
             ) -> Iterator[tuple[tuple[int, int, bytes], list[int], list[bool]]]:
    current: tuple[int, int, bytes] | None = None
    versions: list[int] = []
    tombs: list[bool] = []
    for kg, sid, ukey, version, tomb in rows:
        ref = (kg, sid, ukey)
        if ref != current:
            if current is not None:
                yield current, versions, tombs
            current, versions, tombs = ref, [], []
        versions.append(version)
        tombs.append(tomb)
    if current is not None:
        yield current, versions, tombs


class _Facts:
    """Owners, restorable snapshots, committed descriptor and lineages, read at once."""

    def __init__(self, store: StateStore, operator: str) -> None:
        row = store.read_operator(operator)
        self.owners = list(row.owners) if row is not None else []
        committed = row.committed.parts if row is not None and row.committed else ()
        snapshots = store.list_snapshots(operator)
        branches = store.branches_of(operator)
        self.max_branch = max(branches, default=0)
        self.owner_branches = {b for _, _, b in self.owners}
        # (kg_start, kg_end, branch, epoch or None for an owner's head)
        self.views: list[tuple[int, int, int, int | None]] = [
            (a, b, br, None) for a, b, br in self.owners]
        self.views += [(r.kg_start, r.kg_end, r.branch, r.epoch) for r in snapshots]
        self.views += [(t.kg_start, t.kg_end, t.branch, t.epoch) for t in committed]
        loaded = store.load_branches({br for _, _, br, _ in self.views})
        self.lineages: dict[int, Lineage] = {b: r.lineage for b, r in loaded.items()}
        self._by_kg: dict[int, list[Ranges]] = {}

    def views_of(self, key_group: int) -> list[Ranges]:
        found = self._by_kg.get(key_group)
        if found is None:
            found = []
            for a, b, br, epoch in self.views:
                lineage = self.lineages.get(br)
                if lineage is None or not a <= key_group <= b:
                    continue
                found.append(lineage.head(key_group) if epoch is None
                             else lineage.at(key_group, epoch))
            self._by_kg[key_group] = found
        return found

    def untouchable(self, version: int) -> bool:
        branch = version >> 32
        return branch in self.owner_branches or branch > self.max_branch


def collect_garbage_now(store: StateStore, operator: str, dry_run: bool = False,
                        page_rows: int = PAGE_ROWS) -> GcReport:
    """Delete the versions of `operator` that no restorable snapshot, reader or owner
    needs; returns what was (or, with `dry_run`, would be) removed.

    :raises StoreUnavailableError: the database cannot be reached (retries spent).
    """
    report = GcReport(operator)
    state_ids = store.state_ids(operator)
    after: tuple[int, int, bytes, int] | None = None
    while True:
        rows = store.scan_versions(state_ids, after, page_rows)
        if not rows:
            break
        full = len(rows) == page_rows
        groups = list(_entries(rows))
        if full and len(groups) > 1:
            groups = groups[:-1]  # the last entry may go on in the next page
        facts = _Facts(store, operator)
        deletions: list[Deletion] = []
        for (kg, sid, ukey), versions, tombs in groups:
            report.entries += 1
            report.versions += len(versions)
            keep = versions_to_keep(versions, tombs, facts.views_of(kg), keep_above=1 << 63)
            for v in versions:
                if v in keep:
                    continue
                if facts.untouchable(v):
                    report.kept_as_owners += 1
                    continue
                deletions.append(Deletion(kg, sid, ukey, v))
        report.versions_deleted += len(deletions)
        if deletions and not dry_run:
            report.rows_deleted += store.delete_exact(None, deletions)
        last_ref, last_versions, _ = groups[-1]
        after = (*last_ref, last_versions[-1])
        if not full:
            break
    return report
