"""Garbage collection of versions that no restorable snapshot can need any more.

Rule (docs/protocol.md, "Garbage collection"): of the versions of one entry keep those
that are the newest version visible to some protected snapshot (or to the running
branch's head), and every version newer than the branch's latest completed checkpoint.
A kept tombstone that hides nothing for any view that needs it is dropped too.

The :class:`VersionLedger` remembers the versions of the entries this attempt wrote. An
entry whose older versions (written before this attempt) are not known yet is marked
`complete=False`; the protocol reads its versions from the store once before collecting.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import NamedTuple

from pyflink_ndb.stores.base import Deletion, WriteRow
from pyflink_ndb.stores.lineage import Ranges, in_ranges

EntryRef = tuple[int, int, bytes]  # key group, state id, ukey

__all__ = ["Deletion", "EntryRef", "EntryVersions", "VersionLedger", "versions_to_keep"]


#: What the ledger stores per entry: (versions ascending, their tombstone flags, complete).
#: A plain tuple of tuples of ints and bools, not an object holding lists: CPython's cyclic
#: garbage collector stops tracking an exact tuple of such values in the collections it
#: survives (the inner tuples in the first, the outer one in the next), while a list, a
#: named tuple or an instance of a class stays tracked. So a full collection, which stops
#: every thread of the TaskManager's one interpreter, does not walk the ledger. As objects
#: holding lists, the ledger's entries were 64% of the objects a full collection walked in
#: bench part 9's replay (252,000 of 393,000).
Stored = tuple[tuple[int, ...], tuple[bool, ...], bool]
#: A new entry's versions before its first one, by whether it is complete.
_EMPTY: dict[bool, Stored] = {False: ((), (), False), True: ((), (), True)}


def _added(stored: Stored, version: int, tombstone: bool) -> Stored:
    """`stored` with one version added (or re-flagged), in order."""
    versions, tombstones, complete = stored
    if not versions or version > versions[-1]:
        return versions + (version,), tombstones + (tombstone,), complete
    at = bisect_left(versions, version)
    if at < len(versions) and versions[at] == version:
        return versions, tombstones[:at] + (tombstone,) + tombstones[at + 1:], complete
    return (versions[:at] + (version,) + versions[at:],
            tombstones[:at] + (tombstone,) + tombstones[at:], complete)


class EntryVersions(NamedTuple):
    """Known versions of one entry, ascending, with their tombstone flags; immutable
    (:meth:`add` returns the new value). What :meth:`VersionLedger.get` returns."""

    versions: tuple[int, ...] = ()
    tombstones: tuple[bool, ...] = ()
    complete: bool = False

    def add(self, version: int, tombstone: bool) -> EntryVersions:
        """This entry with one version added (or re-flagged), in order."""
        return _entry(_added(self, version, tombstone))


#: Makes an :class:`EntryVersions` from a :data:`Stored` tuple without the named tuple's
#: `__new__` in Python.
_entry: Callable[[Stored], EntryVersions] = \
    partial(tuple.__new__, EntryVersions)  # type: ignore[assignment]


def versions_to_keep(versions: Sequence[int], tombstones: Sequence[bool],
                     views: Sequence[Ranges], keep_above: int) -> set[int]:
    """The versions of one entry that must stay.

    :param versions: all stored versions, ascending.
    :param tombstones: their tombstone flags.
    :param views: the ranges each protected snapshot (and the head) sees in this entry's
        key group.
    :param keep_above: versions greater than this are always kept (not yet completed).
    """
    keep = set(versions[bisect_right(versions, keep_above):])
    needed_by: dict[int, list[Ranges]] = {}
    for view in views:
        for v in reversed(versions):
            for lo, hi in view:  # in_ranges, inlined: this runs per entry and view
                if lo <= v <= hi:
                    break
            else:
                continue
            needed_by.setdefault(v, []).append(view)
            keep.add(v)
            break
    if True not in tombstones:
        return keep
    tomb = dict(zip(versions, tombstones, strict=True))
    for v in sorted(keep):
        if v > keep_above or not tomb[v]:
            continue
        # A tombstone only hides older versions: with none of them left in any view that
        # reads it, "no version" reads the same.
        if not any(w < v and in_ranges(w, view) for view in needed_by.get(v, ())
                   for w in keep):
            keep.discard(v)
    return keep


class VersionLedger:
    """Versions of the entries this subtask attempt wrote, bounded in memory.

    :param max_entries: entries remembered; the least recently written ones are
        forgotten (their versions are read from the store again when needed).
    """

    def __init__(self, max_entries: int = 200_000) -> None:
        # An OrderedDict kept in write order, not a cachetools LRU: every written entry is
        # recorded and looked up a few times per checkpoint, and these are C calls.
        self._entries: OrderedDict[EntryRef, Stored] = OrderedDict()
        self._max_entries = max_entries
        #: Entries written since they were last collected.
        self.pending: set[EntryRef] = set()
        #: True once the ledger forgot an entry (or a write failed after some of its rows
        #: were committed): from then on no new entry is known to be complete at once.
        self.forgot = False

    def _put(self, ref: EntryRef, entry: Stored) -> None:
        """Store `entry` as the most recently written, forgetting the least recently written
        entry beyond the bound."""
        entries = self._entries
        if ref in entries:
            entries.move_to_end(ref)
        entries[ref] = entry
        if len(entries) > self._max_entries:
            entries.popitem(last=False)
            self.forgot = True

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, ref: EntryRef, version: int, tombstone: bool,
               only_own: bool = False) -> None:
        """A version this attempt wrote. `only_own`: the entry's key group holds no
        inherited version (the branch inherited nothing there), so a first version recorded
        while the ledger has never forgotten anything is all the store holds: the entry is
        complete without reading the store."""
        entry = self._entries.get(ref)
        if entry is None:
            entry = _EMPTY[only_own and not self.forgot]
        self._put(ref, _added(entry, version, tombstone))
        self.pending.add(ref)

    def record_epoch(self, rows: Iterable[WriteRow], version: int,
                     only_own: Callable[[int], bool]) -> None:
        """Record one written epoch: :meth:`record` for each row as `version`, with
        `only_own(key_group)` asked once per key group.

        The same outcome as a loop over :meth:`record` (tests/test_gc.py compares them),
        in less time: it runs for every written entry on the writer thread, which shares
        the task threads' GIL (bench part 9, issue 7), so the lookups are bound once, the
        common case (a version newer than every known one) is built inline and only a new
        entry checks the bound, as :meth:`_put` does. Measured alone on 20,000 rows:
        1.0–1.1 µs per row, against 1.4–1.5 with :func:`_added` and :meth:`_put` per row
        and 1.5–2.3 for a loop over :meth:`record`."""
        entries = self._entries
        lookup, to_end, pending = entries.get, entries.move_to_end, self.pending.add
        own: dict[int, bool] = {}
        for row in rows:
            key_group = row[0]
            ref = (key_group, row[1], row[2])
            entry = lookup(ref)
            if entry is None:
                only = own.get(key_group)
                if only is None:
                    only = own[key_group] = only_own(key_group)
                entry = _EMPTY[only and not self.forgot]
                new = True
            else:
                to_end(ref)
                new = False
            versions = entry[0]
            if not versions or version > versions[-1]:
                entries[ref] = versions + (version,), entry[1] + (row[3],), entry[2]
            else:
                entries[ref] = _added(entry, version, row[3])
            if new and len(entries) > self._max_entries:
                entries.popitem(last=False)
                self.forgot = True
            pending(ref)

    def doubt(self, refs: Iterable[EntryRef]) -> None:
        """A write of these entries failed, perhaps after some of its rows were committed
        (a MySQL-protocol store commits an epoch batch by batch; SQLite all rows before the
        snapshot row): their versions in the store are no longer known. Each becomes
        incomplete (unknown ones are added so), and pending, so that garbage collection
        reads its versions from the store before it decides anything. Without this an
        entry the ledger knew completely missed the failed epoch's version: when a later
        tombstone and the older versions were collected, that orphan row became the
        entry's visible value again (tests/test_gc.py)."""
        entries = self._entries
        for ref in refs:
            entry = entries.get(ref)
            if entry is None:
                self._put(ref, _EMPTY[False])
            elif entry[2]:
                entries[ref] = entry[0], entry[1], False  # no write: it keeps its place
            self.pending.add(ref)

    def unknown(self, refs: Iterable[EntryRef]) -> list[EntryRef]:
        """Those of `refs` whose stored versions the ledger does not know in full (absent,
        or not complete), in their order: garbage collection reads them from the store
        first. (A list comprehension over :meth:`get` built a named tuple per entry: a
        quarter of the writer thread's samples in garbage collection, py-spy of part 3.)"""
        get = self._entries.get
        return [ref for ref in refs if (entry := get(ref)) is None or not entry[2]]

    def get(self, ref: EntryRef) -> EntryVersions | None:
        """The known versions of `ref`; None: this attempt wrote none (or forgot it)."""
        stored = self._entries.get(ref)
        return None if stored is None else _entry(stored)

    def learn(self, ref: EntryRef, stored: Sequence[tuple[int, bool]]) -> EntryVersions:
        """Merge the versions read from the store into the entry; it is complete after."""
        entry = self._entries.get(ref) or _EMPTY[False]
        for version, tombstone in stored:
            if version not in entry[0]:
                entry = _added(entry, version, tombstone)
        entry = entry[0], entry[1], True
        if ref in self._entries:
            self._entries[ref] = entry  # learning is no write: the entry keeps its place
        else:
            self._put(ref, entry)
        return _entry(entry)

    def forget_versions(self, ref: EntryRef, deleted: Iterable[int]) -> None:
        """The store no longer holds the `deleted` versions of `ref` (unknown ones are
        ignored; an entry the ledger does not know stays unknown)."""
        self.forget_many(((ref, tuple(deleted)),))

    def forget_many(self, dropped: Iterable[tuple[EntryRef, Sequence[int]]]) -> None:
        """:meth:`forget_versions` for each (entry, deleted versions) of `dropped`, with
        the remaining versions worked out once per distinct (versions, flags, deleted):
        entries written in the same epochs lose the same versions."""
        entries = self._entries
        memo: dict[tuple[tuple[int, ...], tuple[bool, ...], Sequence[int]],
                   tuple[tuple[int, ...], tuple[bool, ...]]] = {}
        for ref, deleted in dropped:
            entry = entries.get(ref)
            if entry is None:
                continue
            key = (entry[0], entry[1], deleted)
            kept = memo.get(key)
            if kept is None:
                pairs = [(v, t) for v, t in zip(entry[0], entry[1], strict=True)
                         if v not in deleted]
                kept = memo[key] = (tuple(v for v, _ in pairs), tuple(t for _, t in pairs))
            entries[ref] = kept[0], kept[1], entry[2]  # no write: the entry keeps its place

    def decide(self, refs: Iterable[EntryRef], views_of: Callable[[int], Sequence[Ranges]],
               keep_above: int) -> tuple[list[tuple[EntryRef, tuple[int, ...]]],
                                         list[EntryRef]]:
        """Garbage collection's decision for each of `refs` that the ledger knows.

        :param refs: entries to decide (those the ledger does not know are skipped).
        :param views_of: the views of a key group (:func:`versions_to_keep`'s `views`);
            called once per key group.
        :param keep_above: versions greater than this always stay (not yet completed).
        :returns: `(dropped, done)`: each entry with versions to delete, paired with them
            (ascending), and the entries with nothing left that a later change of
            retention could free (at most one version, completed).

        The outcome of :func:`versions_to_keep` per entry (tests/test_gc.py compares them),
        worked out once per distinct (views, versions, tombstone flags): entries written in
        the same epochs have the same versions and flags, and the key groups of a subtask
        mostly share their views, so a checkpoint that rewrote 100,000 entries decides a
        handful of cases. It runs on the writer thread under the GIL that the task
        threads need (issue 7): measured on 100,000 entries of two versions each, 11 µs
        per entry with a call of :func:`versions_to_keep` each, against 2 µs here.
        """
        get = self._entries.get
        view_ids: dict[tuple[Ranges, ...], int] = {}
        views_by_id: list[Sequence[Ranges]] = []
        view_of_kg: dict[int, int] = {}
        memo: dict[tuple[int, tuple[int, ...], tuple[bool, ...]],
                   tuple[tuple[int, ...], bool]] = {}
        dropped: list[tuple[EntryRef, tuple[int, ...]]] = []
        done: list[EntryRef] = []
        for ref in refs:
            entry = get(ref)
            if entry is None:
                continue
            versions, tombstones = entry[0], entry[1]
            if entry[2] and len(versions) == 1 and not tombstones[0]:
                # One value and nothing else stored: the head sees it, nothing to delete.
                if versions[0] <= keep_above:
                    done.append(ref)
                continue
            if versions and versions[0] > keep_above:
                continue  # every version may still complete: all stay, nothing to decide
            kg = ref[0]
            view_id = view_of_kg.get(kg)
            if view_id is None:
                views = tuple(views_of(kg))
                view_id = view_ids.get(views)
                if view_id is None:
                    view_id = view_ids[views] = len(views_by_id)
                    views_by_id.append(views)
                view_of_kg[kg] = view_id
            key = (view_id, versions, tombstones)
            decision = memo.get(key)
            if decision is None:
                keep = versions_to_keep(versions, tombstones, views_by_id[view_id],
                                        keep_above)
                decision = memo[key] = (
                    tuple(v for v in versions if v not in keep),
                    len(keep) <= 1 and all(v <= keep_above for v in keep))
            if decision[0]:
                dropped.append((ref, decision[0]))
            if decision[1]:
                done.append(ref)
        return dropped, done
