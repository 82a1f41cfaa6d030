"""Garbage collection of versions that no retained checkpoint can need any more.

Rule (DESIGN.md, decision 4): for every entry keep, for each protected epoch `p` (the
retained completed checkpoints and the pinned savepoints), the newest version at or below
`p`; keep every version newer than the latest completed checkpoint (it may still be
committed). A tombstone with nothing older left is dropped too.

The ledger only knows versions this subtask wrote in this attempt; for older versions (from
before a restore) it deletes by range (`epoch < oldest known version`) and only when no
protected epoch lies below that oldest known version.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

EntryRef = tuple[int, int, bytes]  # key group, state id, ukey


@dataclass(frozen=True, slots=True)
class Deletion:
    """Delete the versions of one entry with `epoch < bound` (op "<") or `epoch == bound`."""

    key_group: int
    state_id: int
    ukey: bytes
    op: str
    epoch: int


@dataclass
class _Versions:
    epochs: list[int] = field(default_factory=list)
    tombstones: list[bool] = field(default_factory=list)
    older_unknown: bool = True


class VersionLedger:
    """Versions written by this subtask since it opened, per entry."""

    def __init__(self) -> None:
        self._entries: dict[EntryRef, _Versions] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, ref: EntryRef, epoch: int, tombstone: bool) -> None:
        """Note that `ref` was written as `epoch` (epochs are recorded in increasing order)."""
        versions = self._entries.setdefault(ref, _Versions())
        if versions.epochs and versions.epochs[-1] == epoch:
            versions.tombstones[-1] = tombstone
            return
        versions.epochs.append(epoch)
        versions.tombstones.append(tombstone)

    def collect(self, protected: Sequence[int], latest_committed: int,
                keep_from: int | None = None) -> list[Deletion]:
        """Deletions allowed now, and forget what they delete.

        :param protected: epochs of retained checkpoints and pinned savepoints.
        :param latest_committed: the newest completed checkpoint's epoch; versions above it
            are always kept.
        :param keep_from: versions at or above this epoch are always kept (None: no such
            bound); covers retained checkpoints whose completion was never notified.
        """
        marks = sorted(set(protected))
        out: list[Deletion] = []
        finished: list[EntryRef] = []
        for ref, v in self._entries.items():
            kg, sid, ukey = ref

            def protected_in(lo: int, hi: int | None) -> bool:
                i = bisect.bisect_left(marks, lo)
                return i < len(marks) and (hi is None or marks[i] < hi)

            keep_e: list[int] = []
            keep_t: list[bool] = []
            n = len(v.epochs)
            for i, (epoch, tomb) in enumerate(zip(v.epochs, v.tombstones, strict=True)):
                nxt = v.epochs[i + 1] if i + 1 < n else None
                needed = (epoch > latest_committed or nxt is None or nxt > latest_committed
                          or (keep_from is not None and epoch >= keep_from)
                          or protected_in(epoch, nxt))
                if needed:
                    keep_e.append(epoch)
                    keep_t.append(tomb)
                else:
                    out.append(Deletion(kg, sid, ukey, "=", epoch))
            older_unknown = v.older_unknown
            if older_unknown and keep_e and not (marks and marks[0] < keep_e[0]):
                out.append(Deletion(kg, sid, ukey, "<", keep_e[0]))
                older_unknown = False
            while (not older_unknown and keep_e and keep_t[0]
                   and keep_e[0] <= latest_committed):
                out.append(Deletion(kg, sid, ukey, "=", keep_e[0]))
                keep_e.pop(0)
                keep_t.pop(0)
            v.epochs, v.tombstones, v.older_unknown = keep_e, keep_t, older_unknown
            if not older_unknown and (not keep_e or (len(keep_e) == 1
                                                     and keep_e[0] <= latest_committed)):
                finished.append(ref)
        for ref in finished:
            del self._entries[ref]
        return out
